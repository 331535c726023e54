"""One compared row: a case's per-prompt pairs -> a :class:`HookResult` with its numbers.

Contract: :func:`compared_row(model, case, band, pairs, problem, events, pos_axis)` compares every
prompt's (vLLM, reference) pair on the three gated statistics of :class:`~harness.comparison.gate.Band`
and returns the row with the worst prompt's metrics and, where it fails, a message a reader can act
on (position, both values, the statistic, its floor and tolerance).  ``problem``: why the row cannot
be compared (an ``error`` row).  Pure.

Trap: the tokens an upstream event sets aside (an explained routing flip, a chaotic token:
harness.comparison.set_aside) are masked to NaN on the reference side (compare_tensors ignores
reference NaN): check captures for non-finite values *before* that (harness.comparison.nonfinite),
never after.
"""
from __future__ import annotations

import math

import torch

from harness.comparison.compare import ShapeMismatch, all_finite, compare_tensors, failure_message
from harness.comparison.gate import Band
from harness.comparison.nonfinite import describe, first_nonfinite
from harness.comparison.set_aside import Event, mask_from, note, set_aside
from harness.values.plan import Case
from harness.values.results import HookResult

_AXES = {2: ("pos", "d"), 3: ("pos", "head", "d_head"), 1: ("pos",)}
Pairs = list  # [(subject, reference) or None (set aside)] per prompt


def compare_prompts(label: str, pairs: Pairs, band: Band) -> dict:
    """Compare every prompt: the worst prompt's worst row, the largest median row error and the
    largest median scale deviation; the row fails where the gate's rule says a statistic exceeds its
    tolerance (:meth:`~harness.comparison.gate.Band.exceeded`).  The ceiling's ``inconclusive`` is
    the gate's last step (:meth:`~harness.comparison.gate.Gate.finalize`), after documented reference
    bugs have read the compared verdict."""
    worst, median, scale = None, 0.0, 0.0
    for p, pair in enumerate(pairs):
        if pair is None:  # set aside (harness.comparison.set_aside)
            continue
        m = compare_tensors(*pair)
        if worst is None or not (m.rel_err <= worst[1].rel_err):
            worst = (p, m)
        median = max(median, m.rel_median) if m.rel_median == m.rel_median else math.nan
        scale = max(scale, m.scale_median, key=abs) if m.scale_median == m.scale_median else math.nan
    p, m = worst
    names = ("prompt",) + _AXES.get(len(m.shape), tuple(f"dim{k}" for k in range(len(m.shape))))
    # the gate's rule decides which statistics fail (Band.exceeded; docs/concepts.md, "The gate"); each
    # failing one says why in its own sentence
    why = []
    for stat in band.exceeded(m.rel_err, median, scale):
        if stat == "worst":  # worst_index has no prompt axis: name its axes names[1:], then prefix the prompt
            why.append(failure_message(label, m, band.tolerance, names[1:])
                       .replace("worst at [", f"worst at [prompt={p}, ", 1))
        elif stat == "median":
            why.append(f"{label}: median row error {median:.3e} > tolerance {band.tolerance_median:.2e} "
                       f"(floor {_num(band.floor_median)}): an error across most rows, not a few chaotic ones")
        else:
            why.append(f"{label}: typical row norm off by {scale:+.3e} (median of ||vLLM row|| / ||reference row|| "
                       f"- 1), tolerance {band.tolerance_scale:.2e} (floor {_num(band.floor_scale)}): a scale error")
    return dict(
        status="fail" if why else "pass", rel_err=m.rel_err, max_abs=m.max_abs, ref_scale=m.ref_scale,
        cos_min=m.cos_min, rel_median=median, scale_median=scale,
        worst={"prompt": p, "index": list(m.worst_index), "axes": list(names[1:]),
               "subject": m.subject_at_worst, "reference": m.reference_at_worst},
        message="\n".join(why),
    )


def _num(x) -> str:
    return "not measured" if x is None else f"{x:.2e}"


def _compares_anything(reference: torch.Tensor) -> bool:
    """Whether ``compare_tensors`` would compare at least one entry: a NaN reference entry is ignored
    (harness.comparison.compare), so an empty or all-NaN reference compares nothing, and its
    error of 0 must not read as a pass."""
    if reference.numel() == 0:
        return False
    return all_finite(reference) or not bool(torch.isnan(reference).all())


def compared_row(model: str, case: Case, band: Band, pairs: Pairs | None,
                 problem: str = "", events: list[Event] = (), pos_axis: int = 0) -> HookResult:
    """One compared row.  ``events``: routing flips and chaotic tokens; the tokens the explained
    ones set aside for this hook (harness.comparison.set_aside) are left out and named in the message."""
    row = HookResult(model, case.reference, case.hook, case.reference_hook, case.layer, case.kind, "error",
                     band.tolerance, floor=band.floor, derived=case.derived, floor_median=band.floor_median,
                     tolerance_median=band.tolerance_median, floor_scale=band.floor_scale,
                     tolerance_scale=band.tolerance_scale)
    if problem or pairs is None:
        row.message = problem or f"{case.hook}: no values for {case.reference}"
        return row
    aside = set_aside(case.hook, list(events))
    kept = [None if p in aside and aside[p].token == 0 else
            (pair[0], mask_from(pair[1], aside[p].token, pos_axis)) if p in aside else pair
            for p, pair in enumerate(pairs)]
    said = note(aside)
    empty = [p for p, k in enumerate(kept) if k is not None and not _compares_anything(k[1])]
    if empty:  # no row left (a runner returned none), or every reference entry ignored (NaN): nothing to compare
        kept = [None if p in empty else k for p, k in enumerate(kept)]
        said += f" [prompt(s) {empty}: no entry to compare, left out]"
    if all(k is None for k in kept):
        row.status = "inconclusive"
        row.message = f"{case.hook} vs {case.reference}: every prompt set aside or empty{said}"
        return row
    try:
        label = f"{model} {case.hook} vs {case.reference}:{case.reference_hook}"
        for key, value in compare_prompts(label, kept, band).items():
            setattr(row, key, value)
        if 0 <= pos_axis < len(row.worst.get("index", ())):  # the worst token (the report shows its text)
            row.worst["token"] = row.worst["index"][pos_axis]
        row.message += said
    except ShapeMismatch as exc:
        row.message = f"{case.hook} vs {case.reference}:{case.reference_hook}: {exc}"
    return row


REFERENCE_ENGINE = {"bridge": "TransformerBridge", "bridge-ragged": "TransformerBridge", "hf": "HF",
                     "compat": "compatibility mode", "compat-processed": "processed compatibility mode"}


def axes_of(t: torch.Tensor) -> tuple[str, ...]:
    return _AXES.get(t.ndim, ())


def nonfinite_logprobs(pairs: Pairs) -> str:
    """HF's full log-softmax must be finite everywhere; vLLM's (top-k entries, NaN elsewhere) must hold
    a finite value at every position."""
    for p, (s, r) in enumerate(pairs):
        hit = first_nonfinite(r)
        if hit:
            return "logprobs vs hf: non-finite values, not compared: " + describe("HF", "log-probs", p, hit, ("pos", "vocab"))
        dead = (~torch.isfinite(s)).all(dim=-1)
        if bool(dead.any()):
            pos = int(torch.nonzero(dead)[0])
            return (f"logprobs vs hf: non-finite values, not compared: vLLM returned no finite log-prob at "
                    f"prompt {p}, pos={pos}")
    return ""


def pairs_of(subject, store: dict, name: str, n: int) -> Pairs | None:
    if subject is None or any(name not in store.get(p, {}) for p in range(n)):
        return None
    return [(subject[p], store[p][name]) for p in range(n)]
