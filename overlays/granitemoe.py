"""Granite-MoE overlay: Granite's multipliers and plain residual with Mixtral's sparse MoE block.

vLLM's ``GraniteMoeDecoderLayer`` (``model.layers.{i}``) is :data:`overlays.granite.GRANITE`'s
layer with the dense MLP replaced by ``block_sparse_moe`` (``GraniteMoeMoE``: router ``gate``, a
``GateLinear``, and the fused-MoE runner ``experts``): it computes ``h = x + attn(ln1(x)) * r``,
then ``h + moe(ln2(h)) * r`` inline and returns one tensor.  Hook by hook:

- Stream, norms, attention, embedding / attention / logit multipliers and the legacy
  ``hook_attn_out`` / ``hook_mlp_out`` (sublayer output x ``residual_multiplier``): Granite's
  (read :mod:`overlays.granite`'s docstring).
- MoE: :data:`overlays.mixtral.MIXTRAL`'s hooks at ``block_sparse_moe``.  HF names the router
  ``router`` (returning ``(top-k ids, top-k weights, logits)``); TransformerLens's
  ``MoERouterBridge`` maps it to ``mlp.gate`` and takes the logits (its ``logits_index=-1``), which are
  vLLM's ``gate`` output.  Routing: the top-k logits, softmaxed over the chosen k (HF's
  ``GraniteMoeTopKGating``; vLLM's ``renormalize=True``).
"""
from __future__ import annotations

from dataclasses import replace

from .granite import GRANITE
from .mixtral import MIXTRAL
from .tree import TreeOverlay

GRANITEMOE = replace(GRANITE, name="granitemoe", mlp=MIXTRAL.mlp, nonfiring=MIXTRAL.nonfiring)


class GraniteMoeOverlay(TreeOverlay):
    """Granite-MoE: Granite's multipliers and plain residual, MoE block at ``block_sparse_moe``."""

    tree = GRANITEMOE


__all__ = ["GRANITEMOE", "GraniteMoeOverlay"]
