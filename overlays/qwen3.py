"""Qwen3 overlay: the generic decoder tree plus per-head q/k norms.

vLLM's ``Qwen3Attention`` normalizes q and k per head (``q_norm``/``k_norm``,
RMSNorm over ``head_dim`` on a ``[T, heads, d_head]`` view) between the fused
``qkv_proj`` and the rotary embedding.  ``attn.hook_q``/``hook_k`` stay the
projections before the norm (as in TransformerLens); ``attn.q_norm.hook_normalized``
and ``attn.k_norm.hook_normalized`` are the norms' outputs with the weight
divided out, in TransformerLens's heads-first layout ``[heads, T, d_head]``.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import QK_PER_HEAD, TreeOverlay

QWEN3 = replace(DECODER, name="qwen3", attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD))


class Qwen3Overlay(TreeOverlay):
    """Qwen3: decoder-only tree with per-head q/k RMSNorm before rotary."""

    tree = QWEN3


__all__ = ["QWEN3", "Qwen3Overlay"]
