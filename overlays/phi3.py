"""Phi-3 overlay: vLLM's Llama tree; TransformerBridge fires no rotated q/k.

vLLM 0.32's ``Phi3ForCausalLM`` is ``LlamaForCausalLM`` with a packed-module
map: HF's fused ``qkv_proj`` / ``gate_up_proj`` load as-is into vLLM's own
fused ``qkv_proj`` (``[q | k | v]``, grouped-query) and ``gate_up_proj``
(``[gate | up]``), so every read and conversion of
:mod:`overlays.decoder_only` applies unchanged (fused residual pair, norm
un-fold, column slices, head split).

What differs is the reference side.  TransformerLens's Phi-3 adapter splits
the fused projections into separate q/k/v and gate/up linears and re-runs
attention itself (``JointQKVPositionEmbeddingsAttentionBridge.
_reconstruct_attention``), applying rotary embeddings with its own
``_apply_rotary_pos_emb``: ``hook_rot_q`` / ``hook_rot_k`` are registered
there but never fire (measured: absent from ``run_with_cache`` on
transformer-lens 4.3.0).  They are therefore not offered -- there is nothing
to compare a capture with -- and are listed as non-firing with that reason.
Scores / pattern are derived from the rotated q/k elsewhere; without them they
cannot be derived here, so they are non-firing too (vLLM's kernel fuses them).
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .tree import TreeOverlay

_NO_ROT_IN_BRIDGE = (
    "TransformerBridge's Phi-3 attention (JointQKVPositionEmbeddingsAttentionBridge, transformer-lens 4.3.0) "
    "re-implements attention and registers this hook but never fires it, so there is no reference to compare "
    "vLLM's rotary_emb output with")

# vLLM's rotary_emb exists but is not captured (nothing to compare it with), so no derived scores either
PHI3 = replace(DECODER, name="phi3", attention=replace(DECODER.attention, rotary=None), score_inputs=None,
               nonfiring=(NonFiring("blocks.{i}.attn.hook_rot_q", _NO_ROT_IN_BRIDGE),
                          NonFiring("blocks.{i}.attn.hook_rot_k", _NO_ROT_IN_BRIDGE)))


class Phi3Overlay(TreeOverlay):
    """Phi-3: vLLM's Llama tree (fused qkv / gate_up as in HF); no rotated-q/k hooks in the bridge."""

    tree = PHI3


__all__ = ["PHI3", "Phi3Overlay"]
