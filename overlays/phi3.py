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

from .base import HookSpec, NonFiring
from .decoder_only import DecoderOnlyOverlay

_NO_ROT_IN_BRIDGE = (
    "TransformerBridge's Phi-3 attention (JointQKVPositionEmbeddingsAttentionBridge, transformer-lens 4.3.0) "
    "re-implements attention and registers this hook but never fires it, so there is no reference to compare "
    "vLLM's rotary_emb output with")


class Phi3Overlay(DecoderOnlyOverlay):
    """Phi-3: vLLM's Llama tree (fused qkv / gate_up as in HF); no rotated-q/k hooks in the bridge."""

    name = "phi3"
    score_inputs = None  # the rotated q/k are not offered (see module docstring)

    def layer_specs(self, i: int, d: dict[str, int]) -> dict[str, HookSpec]:
        drop = {f"blocks.{i}.attn.hook_rot_q", f"blocks.{i}.attn.hook_rot_k"}
        return {h: s for h, s in super().layer_specs(i, d).items() if h not in drop}

    def nonfiring(self) -> list[NonFiring]:
        return [NonFiring("blocks.{i}.attn.hook_rot_q", _NO_ROT_IN_BRIDGE),
                NonFiring("blocks.{i}.attn.hook_rot_k", _NO_ROT_IN_BRIDGE)]


__all__ = ["Phi3Overlay"]
