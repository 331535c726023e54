"""Qwen2-MoE overlay: the Llama tree (q/k/v biases) with a sparse MoE block and a gated shared expert.

vLLM's ``Qwen2MoeDecoderLayer`` (``model.layers.{i}``) is Llama-shaped with a fused
``(delta, residual)`` return and fused ``qkv_proj`` (with Qwen2's q/k/v biases), so the stream,
norm and attention hooks are :mod:`overlays.decoder_only`'s.  Its MoE block is ``mlp``
(``Qwen2MoeSparseMoeBlock``): router ``gate``, ``experts`` (the fused-MoE runner, handed the shared
expert), ``shared_expert`` (a gated MLP: ``gate_up_proj`` / ``down_proj``) and
``shared_expert_gate`` (``ReplicatedLinear`` d_model -> 1).  Hook by hook:

- Router logits, the router's choice and the per-expert non-firing hooks are
  :data:`overlays.mixtral.MIXTRAL`'s (``mlp.gate.hook_out``, ``mlp.gate.hook_expert_*`` at the
  runner's route tap).
- ``mlp.shared_expert.hook_*`` (TransformerLens's ``shared_expert`` gated-MLP bridge): width
  ``shared_expert_intermediate_size``; ``hook_pre`` / ``hook_pre_linear`` the gate / up columns of
  ``gate_up_proj``, ``hook_post`` ``down_proj``'s input.
- Trap: vLLM's shared module (``Qwen2MoeMLP`` with ``expert_gate``) multiplies its own output by
  ``sigmoid(shared_expert_gate(x))`` inside ``forward``, while HF's ``shared_expert`` returns the
  ungated ``down_proj`` output and the block applies the gate after.  So
  ``mlp.shared_expert.hook_out`` is read at ``shared_expert.down_proj`` (``out[0]``), not at the
  module (``Mlp.shared_gate``).
- ``mlp.shared_expert_gate.hook_in`` / ``hook_out``: the gate's input and its logit ``[T, 1]``
  (before the sigmoid), the same module object vLLM hangs under ``mlp`` and calls from the shared
  expert.
- ``mlp.hook_out`` is the block's output: routed experts plus the gated shared expert.
- Dense layers (``mlp_only_layers``, ``decoder_sparse_step`` > 1: ``Tree.dense_listed`` / ``Tree.sparse_step``,
  HF's and vLLM's rule) run a gated MLP (``Qwen2MoeMLP``: ``gate_up_proj`` / ``down_proj``), offered as such; the
  family row is all-sparse.
"""
from __future__ import annotations

from dataclasses import replace

from .mixtral import MIXTRAL
from .tree import TreeOverlay

QWEN2_MOE = replace(
    MIXTRAL, name="qwen2_moe",
    mlp=replace(MIXTRAL.mlp, module="mlp", shared="shared_expert", shared_hook="shared_expert",
                shared_width="shared_expert_intermediate_size", shared_gate="shared_expert_gate"),
    dense_listed="mlp_only_layers", sparse_step="decoder_sparse_step",
)


class Qwen2MoeOverlay(TreeOverlay):
    """Qwen2-MoE: MoE block at ``mlp`` with a sigmoid-gated shared expert."""

    tree = QWEN2_MOE


__all__ = ["QWEN2_MOE", "Qwen2MoeOverlay"]
