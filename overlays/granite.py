"""Granite overlay: the Llama-shaped tree with four multipliers and a plain residual.

vLLM's ``GraniteDecoderLayer`` (``model.layers.{i}``) has Llama's submodules
(``input_layernorm``, ``self_attn`` with fused ``qkv_proj`` -> ``rotary_emb``
-> ``attn`` -> ``o_proj``, ``post_attention_layernorm``, ``mlp`` with fused
``gate_up_proj``), so q/k/v, rotary, ``hook_z``, the MLP's inner hooks and the
norm un-folds are :mod:`overlays.decoder_only`'s.  Conversions that differ,
hook by hook:

- Plain residual.  The layer computes ``h = x + attn(ln1(x)) * r`` then
  ``h + mlp(ln2(h)) * r`` inline (``r`` = ``residual_multiplier``) and returns
  one tensor: there is no fused ``(delta, residual)`` pair.
  ``blocks.{i}.hook_in`` is the layer's ``hidden_states`` input,
  ``hook_out`` its output, ``hook_resid_mid`` the input of
  ``post_attention_layernorm`` (called without a residual; its output is a
  bare tensor, which ``out[0]`` reads as itself): ``PLAIN_STREAM``, norms
  read ``out[0]`` as in the Llama row.
- Residual multiplier.  TransformerBridge's ``attn.hook_out`` /
  ``mlp.hook_out`` are the sublayer modules' raw outputs, which vLLM's
  ``self_attn`` / ``mlp`` return unchanged.  The contributions actually added
  to the stream, ``raw * r``, are the bridge's block-level
  ``blocks.{i}.hook_attn_out`` / ``hook_mlp_out`` (``ScaledResidualBlockBridge``
  makes them real hook points) and compatibility mode's legacy names of the
  same: they are offered as their own hooks, ``self_attn`` / ``mlp`` output
  ``x r`` (measured: bridge ``hook_attn_out`` = 0.25 x ``attn.hook_out`` at
  ``r = 0.25``).  So the legacy ``hook_attn_out`` / ``hook_mlp_out`` are
  compared with these, not with ``attn.hook_out`` / ``mlp.hook_out`` (whose
  compatibility alias is switched off: it names a different tensor here).
- Embedding multiplier.  vLLM's ``GraniteModel.forward`` multiplies the
  ``embed_tokens`` output by ``embedding_multiplier`` *after* the module (in
  place), while the bridge's ``embed.hook_out`` is the scaled contribution
  (``EmbeddingBridge(output_contribution_scale=...)``), so ``embed.hook_out`` is
  read as layer 0's ``hidden_states`` input: the engine's scaled value
  (``Tree.embed_scale``).
  HF's own embedding module returns the unscaled value (HF multiplies in
  ``GraniteModel.forward`` too), so the HF forward-hook reference holds no
  tensor equal to ``embed.hook_out``; its HF alias is switched off.
- Attention multiplier.  Granite's softmax scale is ``attention_multiplier``,
  not ``head_dim ** -0.5``; vLLM passes it to its attention kernel, so it shows
  in ``hook_z`` and downstream and in the derived scores / pattern
  (:meth:`overlays.tree.TreeOverlay.attn_scale` reads it).
- Logits scaling.  vLLM's logits processor divides by ``logits_scaling``;
  ``unembed.hook_out`` (the bridge's plain ``lm_head`` output) multiplies it
  back (:meth:`overlays.tree.TreeOverlay.unembed_spec`).
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import PLAIN_STREAM, Scale, TreeOverlay

GRANITE = replace(
    DECODER, name="granite", residual=PLAIN_STREAM,
    embed_scale=Scale("embedding_multiplier", default=1.0),
    # sublayer outputs x residual_multiplier: the legacy hook_attn_out / hook_mlp_out (overlays.tree)
    residual_scale=Scale("residual_multiplier", default=1.0),
    references=(("embed.hook_out", (("hf", None),)),),  # HF's embedding module output is unscaled
)


class GraniteOverlay(TreeOverlay):
    """Granite: Llama-shaped tree, plain residual, embedding / residual / attention / logit multipliers."""

    tree = GRANITE


__all__ = ["GRANITE", "GraniteOverlay"]
