"""Qwen3-MoE overlay: Qwen3's attention (per-head q/k norms) with a sparse MoE block.

vLLM's ``Qwen3MoeDecoderLayer`` (``model.layers.{i}``) is Llama-shaped with a
fused ``(delta, residual)`` return; its MoE block is ``mlp``
(``Qwen3MoeSparseMoeBlock``: router ``gate`` + ``experts``, a ``MoERunner``
that calls the gate module itself).  Every MoE hook and non-firing reason is
:data:`overlays.mixtral.MIXTRAL`'s (block input / output, router
logits ``mlp.gate.hook_out``, the router's choice ``mlp.gate.hook_expert_*``; per-expert hooks
non-firing).  The
architecture's own conversions:

- q/k norms.  vLLM runs ``self_attn.q_norm`` / ``k_norm`` on
  ``[T, heads, head_dim]`` (per head) before rotary; TransformerLens takes
  ``attn.q_norm.hook_normalized`` in its attention's heads-first layout
  ``[heads, T, head_dim]``: un-fold ``÷ w``, then swap the first two dims.
  ``hook_rot_q`` / ``hook_rot_k`` are after q/k norm and rotary, as in TL.
- Dense layers (``mlp_only_layers``, ``decoder_sparse_step`` > 1: ``Tree.dense_listed`` /
  ``Tree.sparse_step``, HF's and vLLM's rule) run a gated MLP (``gate_up_proj`` / ``down_proj``),
  offered as such; the family row is all-sparse: TransformerLens 4.3.0's Qwen3-MoE adapter documents
  dense fall-back layers as unsupported.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .mixtral import MIXTRAL
from .tree import QK_PER_HEAD, TreeOverlay

_ROUTER_IN_FUSED_OP = (
    "under CUDA graphs (compiled mode on CUDA, vLLM 0.20): Qwen3MoeSparseMoeBlock hands its router "
    "(mlp.gate) to FusedMoE, whose vllm::moe_forward custom op calls it inside the op, out of dynamo's "
    "sight; the op is captured into the CUDA graph, so the router's hook runs at graph capture only and "
    "never on replays (measured on the H200: never fired); splitting the graph at vllm::moe_forward fails "
    "in vLLM 0.20's piecewise codegen.  Eager mode captures the router logits and the router's choice "
    "(its select_experts runs inside the same op)")

QWEN3_MOE = replace(
    MIXTRAL, name="qwen3_moe", mlp=replace(MIXTRAL.mlp, module="mlp"),
    attention=replace(MIXTRAL.attention, qk_norm=QK_PER_HEAD),
    dense_listed="mlp_only_layers", sparse_step="decoder_sparse_step",  # a dense layer's MLP: Qwen3MoeMLP
    cuda_graph_nonfiring=tuple(NonFiring(f"blocks.{{i}}.mlp.gate.{h}", _ROUTER_IN_FUSED_OP)
                               for h in ("hook_out", "hook_expert_weights", "hook_expert_indices")),
)


class Qwen3MoeOverlay(TreeOverlay):
    """Qwen3-MoE: MoE block at ``mlp``; per-head q/k norms before rotary."""

    tree = QWEN3_MOE


__all__ = ["QWEN3_MOE", "Qwen3MoeOverlay"]
