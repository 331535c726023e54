"""The backbone Mamba-1 and Mamba-2 share in vLLM (``MambaForCausalLM``, ``Mamba2ForCausalLM``): the
hooks around the mixer, declared once; each line's overlay adds its own mixer's (:mod:`overlays.mamba`,
:mod:`overlays.mamba2`).

vLLM's tree::

    backbone.embeddings        VocabParallelEmbedding
    backbone.layers.{i}        (hidden_states, residual) -> (mixer_out, residual): the fused pair
    backbone.layers.{i}.norm   RMSNorm, fused add-norm from layer 1 on: (normed, residual)
    backbone.layers.{i}.mixer  the line's mixer, called with the normed stream
    backbone.norm_f            RMSNorm(hidden_states, residual) -> (normed, _)
    logits_processor           as every decoder

Contract: :func:`backbone_specs(cfg, mixer)` returns, in forward order, ``embed.hook_out``, then per block
``hook_in`` (``in.hidden_states+in.residual``: layer 0's residual is None and adds nothing),
``norm.hook_normalized`` (``out[0]`` un-folded by the norm's weight; a bare tensor at layer 0 is its own
``out[0]``), ``mixer.hook_in`` (compared with HF's mixer pre-hook), then what ``mixer(b, path)`` returns
for block ``b`` at vLLM path ``path`` (the mixer's inner hooks and its ``mixer.hook_out``), then
``hook_out`` (``out[0]+out[1]``); then ``ln_final.hook_normalized`` and ``unembed.hook_out`` (every call
of the logits processor, stitched).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import HookSpec, UnfoldNorm, config_get

MixerSpecs = Callable[[str, str], dict[str, HookSpec]]  # (block "blocks.{i}", vLLM mixer path) -> its hooks


def backbone_specs(cfg: Any, mixer: MixerSpecs) -> dict[str, HookSpec]:
    d_model, vocab = int(config_get(cfg, "hidden_size")), int(config_get(cfg, "vocab_size"))
    specs: dict[str, HookSpec] = {"embed.hook_out": HookSpec("backbone.embeddings", "out", (), d_model)}
    for i in range(int(config_get(cfg, "num_hidden_layers"))):
        layer, b = f"backbone.layers.{i}", f"blocks.{i}"
        specs[f"{b}.hook_in"] = HookSpec(layer, "in.hidden_states+in.residual", (), d_model)
        specs[f"{b}.norm.hook_normalized"] = HookSpec(f"{layer}.norm", "out[0]",
                                                      (UnfoldNorm(f"{layer}.norm.weight"),), d_model)
        specs[f"{b}.mixer.hook_in"] = HookSpec(f"{layer}.mixer", "in.hidden_states", (), d_model,
                                               references=(("hf", f"{b}.mixer.hook_in"),))
        specs.update(mixer(b, f"{layer}.mixer"))
        specs[f"{b}.hook_out"] = HookSpec(layer, "out[0]+out[1]", (), d_model)
    specs["ln_final.hook_normalized"] = HookSpec("backbone.norm_f", "out[0]",
                                                 (UnfoldNorm("backbone.norm_f.weight"),), d_model)
    specs["unembed.hook_out"] = HookSpec("logits_processor", "out", (), vocab, calls="all")
    return specs


__all__ = ["MixerSpecs", "backbone_specs"]
