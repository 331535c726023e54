"""Nemotron-H (``NemotronHForCausalLM``): a hybrid whose layer kinds come from the config, implementing
the :class:`~overlays.base.Overlay` contract directly, as Mamba-2 does (its Mamba layers are Mamba-2's).

vLLM's tree (vllm/model_executor/models/nemotron_h.py; HF's ``backbone.*`` is mapped to ``model.*``)::

    model.embed_tokens                 VocabParallelEmbedding
    model.layers.{i}                   one of four decoder layers, by hybrid_override_pattern[i]:
                                       "M" Mamba-2, "*" attention, "-" MLP, "E" MoE; every one is
                                       norm -> mixer and returns (mixer_out, residual)
    model.layers.{i}.norm              RMSNorm, fused add-norm from layer 1 on: (normed, residual)
    model.layers.{i}.mixer             MambaMixer2 (in_proj, gated norm, out_proj) | NemotronHAttention
                                       (qkv_proj -> attn -> o_proj, no rotary) | NemotronHMLP (up_proj,
                                       relu², down_proj) | NemotronHMoE (router, experts, shared experts)
    model.norm_f                       RMSNorm(hidden_states, residual) -> (normed, _)

TransformerBridge (TL 4.3.0, supported_architectures/nemotron_h.py) wraps every block in
``SSMBlockBridge`` and every mixer, whatever its kind, in a passthrough ``SSM2MixerBridge``: it
offers the block's ``hook_in`` / ``hook_out``, ``norm.hook_normalized``, the mixer's ``hook_in`` /
``hook_out`` and, on Mamba layers only, the mixer's ``in_proj`` / ``inner_norm`` / ``out_proj`` hooks.
So this overlay offers exactly those, with Mamba-2's reads (:mod:`overlays.mamba2`) on the Mamba
layers; the mixer's input is read by name (the attention mixer is called with ``hidden_states=``,
the MLP's parameter is ``x``).

On MoE layers it also offers the router's logits, ``mixer.gate.hook_out`` (vLLM's ``mixer.gate``, float32,
``[T, n_routed_experts]``), compared with HF's router (``NemotronHTopkRouter``'s first output) since TransformerLens
has none: with them an expert choice that flips at a near-tie (sigmoid scores plus the correction bias, the rule of
:class:`~overlays.base.Routing`) is told from a routing bug, and the tokens downstream of an explained flip are set
aside (harness.comparison.routing; the MoE is the layer's mixer, so its ``mixer.hook_out`` is downstream).  HF's own
bf16 run choosing other experts than its float32 run is found from HF's chosen ids (harness.comparison.chaos).

Non-firing: every attention-internal hook (TL offers no q, k, v, pattern on this architecture:
nothing to compare with), the SSM state inside ``vllm::mamba_mixer2`` and ``conv1d`` (as Mamba-2's),
and the dense-MLP / mid-block hooks (one sublayer, the mixer, per block).
"""
from __future__ import annotations

from typing import Any

from .base import HookSpec, NonFiring, Overlay, Routing, UnfoldNorm, config_get
from .mamba2 import NONFIRING as _MAMBA2_NONFIRING, mixer_specs

_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_MIXER_INPUT = {"M": "in.hidden_states", "*": "in.hidden_states", "-": "in.x", "E": "in.hidden_states"}
_NO_TL_HOOK = ("TransformerLens's nemotron_h adapter wraps every mixer in a passthrough SSM2MixerBridge: it "
               "offers no attention-internal hook on this architecture, so there is nothing to compare with "
               "(the attention mixer's input and output are compared as mixer.hook_in / hook_out)")
_ONE_SUBLAYER = ("one sublayer (the mixer: Mamba-2, attention, MLP or MoE by hybrid_override_pattern) per "
                 "block: no mid-block residual and no separate MLP; the mixer's input and output are compared")

NONFIRING: tuple[NonFiring, ...] = (
    *(nf for nf in _MAMBA2_NONFIRING if ".attn." not in nf.template and "resid_mid" not in nf.template
      and ".mlp." not in nf.template),
    *(NonFiring(f"blocks.{{i}}.attn.{h}", _NO_TL_HOOK)
      for h in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_attn_scores", "hook_pattern")),
    NonFiring("blocks.{i}.hook_resid_mid", _ONE_SUBLAYER),
    NonFiring("blocks.{i}.mlp.hook_out", _ONE_SUBLAYER),
)


def pattern(cfg: Any) -> str:
    """One character per layer (``hybrid_override_pattern``, what vLLM reads): ``M * - E``."""
    text = str(config_get(cfg, "hybrid_override_pattern", default=""))
    n = int(config_get(cfg, "num_hidden_layers"))
    if len(text) != n or set(text) - set(_KINDS):
        raise ValueError(f"nemotron_h: hybrid_override_pattern {text!r} must give one of {''.join(_KINDS)} per "
                         f"layer ({n} layers)")
    return text


def mamba_sizes(cfg: Any) -> tuple[int, int, int]:
    """``(I, conv_dim, H)`` of the Mamba layers: inner width, conv width (x, B, C), heads."""
    heads = int(config_get(cfg, "mamba_num_heads"))
    inner = heads * int(config_get(cfg, "mamba_head_dim"))
    return inner, inner + 2 * int(config_get(cfg, "n_groups", default=1)) * int(config_get(cfg, "ssm_state_size")), heads


class NemotronHOverlay(Overlay):
    """Nemotron-H: embeddings, norm -> mixer blocks of four kinds with fused residual pairs, final norm."""

    name = "nemotron_h"
    norm_weight_offset = 0.0  # RMS norms store the weight itself

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        cfg = hf_config
        d_model, vocab = int(config_get(cfg, "hidden_size")), int(config_get(cfg, "vocab_size"))
        inner, conv_dim, heads = mamba_sizes(cfg)
        specs: dict[str, HookSpec] = {"embed.hook_out": HookSpec("model.embed_tokens", "out", (), d_model)}
        for i, kind in enumerate(pattern(cfg)):
            layer, b = f"model.layers.{i}", f"blocks.{i}"
            mixer = f"{layer}.mixer"
            hf = (lambda name: (("hf", name),)) if kind == "M" else (lambda name: ())  # HF's mixer hooks: Mamba only
            specs[f"{b}.hook_in"] = HookSpec(layer, "in.hidden_states+in.residual", (), d_model)
            specs[f"{b}.norm.hook_normalized"] = HookSpec(f"{layer}.norm", "out[0]",
                                                          (UnfoldNorm(f"{layer}.norm.weight"),), d_model)
            specs[f"{b}.mixer.hook_in"] = HookSpec(mixer, _MIXER_INPUT[kind], (), d_model,
                                                   references=hf(f"{b}.mixer.hook_in"))
            if kind == "M":
                specs.update(mixer_specs(b, mixer, inner, conv_dim, heads))
            if kind == "E":  # the router: TransformerLens offers none, so HF's (module doc)
                specs[f"{b}.mixer.gate.hook_out"] = HookSpec(
                    f"{mixer}.gate", "out[0]", (), int(config_get(cfg, "n_routed_experts")),
                    references=(("bridge", None), ("compat", None), ("hf", f"{b}.mixer.gate.hook_out")),
                    routing=Routing("sigmoid", int(config_get(cfg, "n_group", default=1) or 1),
                                    int(config_get(cfg, "topk_group", default=1) or 1),
                                    f"{mixer}.gate.e_score_correction_bias",
                                    checkpoint_bias=f"backbone.layers.{i}.mixer.gate.e_score_correction_bias"))
            specs[f"{b}.mixer.hook_out"] = HookSpec(mixer, "out", (), d_model, references=hf(f"{b}.mixer.hook_out"))
            specs[f"{b}.hook_out"] = HookSpec(layer, "out[0]+out[1]", (), d_model)
        specs["ln_final.hook_normalized"] = HookSpec("model.norm_f", "out[0]",
                                                     (UnfoldNorm("model.norm_f.weight"),), d_model)
        specs["unembed.hook_out"] = HookSpec("logits_processor", "out", (), vocab, calls="all")
        return specs

    def nonfiring(self) -> list[NonFiring]:
        return list(NONFIRING)


__all__ = ["NONFIRING", "NemotronHOverlay", "mamba_sizes", "pattern"]
