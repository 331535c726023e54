"""Generic overlay for vLLM's Llama-shaped decoder-only models: the :data:`DECODER` row.

Module tree: ``model.embed_tokens`` / ``model.layers.{i}`` (``input_layernorm``,
``self_attn`` with fused ``qkv_proj`` -> ``rotary_emb`` -> ``attn`` ->
``o_proj``, ``post_attention_layernorm``, ``mlp`` with fused ``gate_up_proj``
-> ``act_fn`` -> ``down_proj``) / ``model.norm``.  Right for Llama, Qwen2/3,
Mistral and Gemma (with :mod:`overlays.gemma`'s two conversions); a family
whose tree differs gets its own file holding ``replace(DECODER, ...)`` with
only what differs (:mod:`overlays.tree` says what a row can declare).

Traps this overlay handles, hook by hook:

- Fused residual.  A vLLM decoder layer returns ``(delta, residual)`` and the
  *next* norm adds them, so the residual stream is never a tensor of its own.
  ``blocks.{i}.hook_out`` reads ``out[0]+out[1]`` of the layer;
  ``blocks.{i}.hook_in`` reads ``in.hidden_states+in.residual`` of the layer
  (layer 0 gets ``residual=None``: the embedding alone);
  ``blocks.{i}.hook_resid_mid`` reads the two inputs of
  ``post_attention_layernorm``.
- Folded norm weights.  vLLM's norms return ``x * rsqrt(var + eps) * w``;
  TransformerLens's ``hook_normalized`` is taken before ``* w``.  ``ln1``,
  ``ln2`` and ``ln_final`` un-fold with ``÷ w`` (``÷ (1 + w)`` where
  the row's ``NormKind`` has offset 1, Gemma).  Norm weights of a real checkpoint can hold exact
  zeros in principle; synthetic ones never do (see harness.models.checkpoints).
- Fused projections.  ``qkv_proj`` returns ``[q | k | v]`` concatenated
  (grouped-query: k and v are ``n_kv_heads * head_dim`` wide); ``gate_up_proj``
  returns ``[gate | up]``.  Both are sliced by column and split into heads.
  ``hook_q``/``hook_k`` are the projections before any q/k norm and rotary,
  as in TransformerLens; ``hook_rot_q``/``hook_rot_k`` are the rotary
  embedding's outputs (after q/k norm where the architecture has one).
- ``hook_z`` is ``o_proj``'s input, split into heads.
- ``unembed.hook_out`` is vLLM's own logits processor (``logits_processor``
  at the model root), read on *every* call: with prompt log-probs requested
  vLLM calls it once for the sampled last position ([1, V]) and once for the
  prompt positions ([T-1, V]); the calls are stitched by row count.  Its
  output is after vLLM's logit ``scale`` (Granite's ``1 / logits_scaling``),
  which is divided out; a final logit soft-cap (Gemma-2) cannot be undone
  (tanh saturates), so soft-capped configs declare it non-firing.
- ``attn.hook_attn_scores`` / ``attn.hook_pattern`` never exist in vLLM (its
  attention kernel fuses them); they are *derived* host-side from the
  captured rotated q and k (the row's ``score_inputs``) with the config's attention
  scale, grouped-query repeat, causal / sliding-window mask and logit
  soft-cap, and reported as derived (:mod:`harness.comparison.derived`).
"""
from __future__ import annotations

from .tree import Tree, TreeOverlay

DECODER = Tree("decoder_only")  # every Tree default is this tree


class DecoderOnlyOverlay(TreeOverlay):
    """Llama-shaped vLLM decoder (model.layers.{i}.self_attn / mlp, fused residual)."""

    tree = DECODER


__all__ = ["DECODER", "DecoderOnlyOverlay"]
