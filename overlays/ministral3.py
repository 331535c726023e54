"""Ministral-3 overlay: the Llama tree, as vLLM runs it (``Ministral3ForCausalLM`` -> its
``MistralForCausalLM``), with yarn rope and Llama-4 query scaling.

Every hook is :data:`overlays.decoder_only.DECODER`'s (fused ``qkv_proj``, ``rotary_emb``,
``o_proj``, ``gate_up_proj``, fused add-norms).  Traps:

- Llama-4 attention scaling: HF multiplies the rotated query by ``1 + beta * log(1 + floor(pos /
  original_max_position_embeddings))`` after ``apply_rotary_pos_emb``; vLLM's ``MistralAttention``
  does the same after ``rotary_emb`` -- but only where the config has a top-level ``llama_4_scaling``
  (Mistral's own format); an HF-format config keeps ``llama_4_scaling_beta`` inside
  ``rope_parameters``, which vLLM does not read.  The factor is exactly 1 below
  ``original_max_position_embeddings`` (16384 in the released configs), so for every prompt here both
  engines compute the same model, and ``hook_rot_q`` (the rotary module's output, before the factor)
  feeds the derived scores correctly.  Positions past 16384 would differ: not covered.
- Yarn rope (the released configs' ``rope_parameters``): HF's and vLLM's yarn rotary both read
  ``factor``, ``original_max_position_embeddings``, ``beta_fast`` / ``beta_slow`` and the mscales.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import TreeOverlay

MINISTRAL3 = replace(DECODER, name="ministral3")


class Ministral3Overlay(TreeOverlay):
    """Ministral-3: the Llama tree (vLLM's MistralForCausalLM), yarn rope."""

    tree = MINISTRAL3


__all__ = ["MINISTRAL3", "Ministral3Overlay"]
