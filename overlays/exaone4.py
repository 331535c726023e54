"""EXAONE-4.0 overlay: OLMo-2's post-norm tree with per-head q/k norms (vLLM's native model).

vLLM's ``Exaone4DecoderLayer`` (``model.layers.{i}``) computes ``h = x + post_attention_layernorm(
attn(x))`` then ``h + post_feedforward_layernorm(mlp(h))`` and returns ``(stream, mid stream)``:
no norm before a sublayer, as :data:`overlays.olmo2.OLMO2` (``POST_NORM``: ``hook_out`` is
``out[0]``, ``hook_resid_mid`` the MLP's input; ``ln1_post`` / ``ln2_post`` carry the legacy
``hook_attn_out`` / ``hook_mlp_out``).  What differs from OLMo-2, hook by hook:

- q/k norms per head: ``self_attn.q_norm`` / ``k_norm`` (``RMSNorm(head_dim)``) run on
  ``[T, heads, head_dim]`` before rotary (``QK_PER_HEAD``: un-fold, then TL's heads-first swap).
- Rotary: vLLM and HF rotate on sliding layers, and on every layer of a model without sliding
  layers; a hybrid model's full-attention layers are NoPE (no ``rotary_emb`` call), which this row
  cannot say per layer.  The family row is therefore all-sliding (every layer rotates, the window
  masks); a hybrid config would leave its NoPE layers' ``hook_rot_q`` / ``hook_rot_k`` unfired.
"""
from __future__ import annotations

from dataclasses import replace

from .olmo2 import OLMO2
from .tree import QK_PER_HEAD, TreeOverlay

EXAONE4 = replace(OLMO2, name="exaone4", attention=replace(OLMO2.attention, qk_norm=QK_PER_HEAD))


class Exaone4Overlay(TreeOverlay):
    """EXAONE-4.0: post-norms (no pre-norms), per-head q/k norms, rotary module."""

    tree = EXAONE4


__all__ = ["EXAONE4", "Exaone4Overlay"]
