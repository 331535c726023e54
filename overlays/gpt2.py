"""GPT-2 overlay: vLLM's ``GPT2LMHeadModel`` tree, plain residual, LayerNorm (the :data:`GPT2` row).

Module tree: ``transformer.wte`` (tokens) and ``transformer.wpe`` (learned
positions), ``transformer.h.{i}`` (``ln_1``, ``attn`` with fused ``c_attn`` ->
``attn`` -> ``c_proj``, ``ln_2``, ``mlp`` with ``c_fc`` -> ``act`` ->
``c_proj``), ``transformer.ln_f``.  HF stores ``c_attn`` / ``c_proj`` / ``c_fc``
as ``Conv1D`` (weight ``[in, out]``); vLLM transposes them at load into its
linear layers, so the outputs are the same tensors and need no conversion.

Conversions, hook by hook (they differ from :mod:`overlays.decoder_only`):

- Residual stream.  ``GPT2Block`` takes and returns the full stream as one
  tensor (no fused ``(delta, residual)`` pair): ``blocks.{i}.hook_in`` is the
  block's input, ``hook_out`` its output, ``hook_resid_mid`` is ``ln_2``'s
  input.
- Positions.  ``embed.hook_out`` is ``wte``'s output alone and
  ``pos_embed.hook_out`` is ``wpe``'s (vLLM adds them in
  ``GPT2Model.forward``); ``blocks.0.hook_in`` is their sum.
- LayerNorm un-fold.  vLLM's ``LayerNorm`` returns ``n * w + b`` with
  ``n = (x - mean) / sqrt(var + eps)``; TL's ``hook_normalized`` is ``n``,
  before the weight *and* the bias, so the un-fold is ``(y - b) / w``
  (``UnfoldNorm(..., bias=...)``).
- ``c_attn`` returns ``[q | k | v]`` (multi-head: each ``d_model`` wide),
  sliced by column and split into heads.  No rotary: the derived attention
  scores use ``hook_q`` / ``hook_k``.  ``hook_z`` is ``attn.c_proj``'s input.
- ``mlp.hook_pre`` is ``c_fc``'s output (before ``gelu_new``),
  ``mlp.hook_post`` is ``mlp.c_proj``'s input.  There is no gate, so no
  ``hook_pre_linear``.
"""
from __future__ import annotations

from .tree import LAYER_NORM, PLAIN, PLAIN_STREAM, SCORES_FROM_QK, Attention, Mlp, Norms, Tree, TreeOverlay

GPT2 = Tree(
    "gpt2", root="transformer", embed="wte", pos_embed="wpe", layers="h",
    attention=Attention(module="attn", qkv="c_attn", out_proj="c_proj", rotary=None,
                        grouped_query=False),
    mlp=Mlp(kind=PLAIN, up="c_fc", down="c_proj"),
    norms=Norms(kind=LAYER_NORM, ln1="ln_1", ln2="ln_2", final="ln_f", read="out", final_read="out"),
    residual=PLAIN_STREAM, score_inputs=SCORES_FROM_QK,
)


class GPT2Overlay(TreeOverlay):
    """GPT-2: transformer.h.{i}, learned positions, LayerNorm with bias, plain residual."""

    tree = GPT2


__all__ = ["GPT2", "GPT2Overlay"]
