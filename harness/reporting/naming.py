"""Report names: the variant's name and a report file's stem, from a result.

Contract: :func:`variant_of` is the name a matrix column and a report suffix use (``cpu-float32``,
``tl-vllm-cpu-float32``); :func:`report_stem` is the file stem (``report``, ``report-cuda-bfloat16``;
a selective run's ends in :data:`SELECTION_SUFFIX`, so it never replaces a full report).  Both read
the variant from the result (harness.values.variant.Variant.from_result), never from strings.
"""
from __future__ import annotations

from harness.values.variant import Variant

def variant_of(result: dict) -> str:
    """``cpu-float32``; a subject other than the default vLLM one prefixes it (``tl-vllm-cpu-float32``)."""
    return Variant.from_result(result).name


SELECTION_SUFFIX = "-selection"


def report_stem(result: dict) -> str:
    """``report``; ``report-tl-vllm``, ``report-cuda-bfloat16``, ``report-tl-vllm-cuda-float32-ieee``.
    A selective run (``-k``: some hooks only) is ``...-selection``: it never replaces a full report."""
    stem = Variant.from_result(result).report_stem
    return stem + (SELECTION_SUFFIX if result.get("selected_hooks") is not None else "")
