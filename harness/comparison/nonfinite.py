"""Non-finite values in a capture: the first one, where it sits, in which engine.

Contract: :func:`first_nonfinite(tensor, allow_neg_inf)` returns ``(index, label)`` of the
first NaN / infinity in row-major order, or ``None``.  A NaN or an infinity is never
"equal within tolerance": :mod:`harness.comparison.compare` ignores NaN on the reference
side (it marks entries vLLM did not return), so two NaN captures would otherwise compare
as perfect agreement.  Callers turn a hit into an ``error`` row.

Trap: ``-inf`` is legitimate in masked attention scores (compatibility mode masks with
``-inf``; the bridge with the dtype's minimum), so the attention-score kinds allow it.
"""
from __future__ import annotations

import math

import torch

# hook kinds whose values legitimately hold -inf (masked positions)
NEG_INF_KINDS = frozenset({"attn.hook_attn_scores"})


def first_nonfinite(t: torch.Tensor, allow_neg_inf: bool = False) -> tuple[tuple[int, ...], str] | None:
    if not t.is_floating_point() or t.numel() == 0:
        return None
    bad = torch.isnan(t) | (t == math.inf)
    if not allow_neg_inf:
        bad |= t == -math.inf
    if not bool(bad.any()):
        return None
    idx = tuple(int(i) for i in torch.nonzero(bad)[0])
    value = float(t[idx])
    return idx, "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")


def describe(engine: str, hook: str, prompt: int, hit: tuple[tuple[int, ...], str], axes: tuple[str, ...] = ()
             ) -> str:
    idx, label = hit
    where = ", ".join(f"{a}={i}" for a, i in zip(axes, idx)) if len(axes) == len(idx) else str(list(idx))
    return f"{label} in {engine}'s {hook} at prompt {prompt}, [{where}]"
