"""The gate of one run: tolerances and every row's final status, in one place.

Contract: :class:`Gate` is built once per (target, variant) from the variant's
calibration key and the target's architecture.  :meth:`Gate.tolerance` turns a
reference's noise floor into a row's tolerance (harness.comparison.tolerances);
:meth:`Gate.finalize` assigns the row's final status -- the compared verdict, the
dtype's ceiling, a documented reference bug -- and nothing changes a status after it.
:func:`margin` is the one definition of error / tolerance, and :meth:`Gate.finalize` stores each
row's margin on the statistics that gate it (``HookResult.margin``); reports, the matrix and the
CLI read that number and never recompute it.

Traps:
- Three statistics per row, each with its own floor and tolerance (:class:`Band`): a row fails
  when the median row or the scale exceeds its tolerance (whatever the ceiling), or the worst row
  exceeds a tolerance at or below the ceiling; it is gated when the worst row's or the median row's
  tolerance is at or below the ceiling.  Above the ceiling the worst rows are chaotic tokens (near-tie
  amplification), whose divergence between two valid bf16 implementations is not bounded by a
  multiple of one implementation's own: measured on SmolLM2 bf16, vLLM's worst token of
  ``blocks.20.hook_out`` sat 2.7 from the reference where the reference's own sat 0.6 from the truth.  Measured on SmolLM2-135M in bf16: from layer
  11 on a few tokens' own bf16 error reaches 0.3-0.7 (worst row) while the median row stays at
  0.005-0.015 (docs/concepts.md, "Tolerances"), so the worst row alone left a third of the model ungated.
- The references checked against each other (``bridge~hf``) never run in TF32, so
  their tolerance uses the plain dtype's calibration (``reference_key``).
- A tolerance of 0 (argmax: top-1 must agree) gives margin 0 for no error and
  infinity for any error, never a division by zero or a NaN that sorts anywhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.comparison.known_issues import known_issue
from harness.comparison.tolerances import Calibration, calibration_for, reference_key

CROSS_REFERENCE = "bridge~hf"  # the two references compared with each other, no vLLM involved


def margin(err: float, tol: float) -> float:
    """error / tolerance (< 1 passes).  NaN error -> NaN; tolerance 0 -> 0 or inf."""
    if err != err:  # NaN
        return math.nan
    if tol > 0:
        return err / tol
    return 0.0 if err == 0 else math.inf


@dataclass(frozen=True)
class Band:
    """A row's tolerances, one per statistic, each from its own floor: the worst row (localizes an
    error), the median row (a systematic error moves it, a few chaotic rows do not) and the median
    signed scale deviation (a scale bug's factor; rounding noise has no preferred sign)."""

    tolerance: float
    floor: float | None = None
    tolerance_median: float = math.nan
    floor_median: float | None = None
    tolerance_scale: float = math.nan
    floor_scale: float | None = None
    ceiling: float = math.inf  # the dtype's: above it the worst row is no gate, neither for pass nor for fail


@dataclass(frozen=True)
class Gate:
    key: str  # calibration key of vLLM's rows ("float32", "bfloat16", "float32-tf32", ...)
    dtype: str  # the run's dtype: its ceiling applies to every row
    architecture: str  # for documented reference bugs
    # looked up once, here (a key without one raises UnsupportedDtypeError: before any engine boots)
    calibration: Calibration = field(init=False, repr=False)  # vLLM's rows: multiple, minimum
    cross_calibration: Calibration = field(init=False, repr=False)  # bridge~hf: the references never run in TF32
    dtype_calibration: Calibration = field(init=False, repr=False)  # the run's dtype: ceiling, truth dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "calibration", calibration_for(self.key))
        object.__setattr__(self, "cross_calibration", calibration_for(reference_key(self.key)))
        object.__setattr__(self, "dtype_calibration", calibration_for(self.dtype))

    @classmethod
    def for_run(cls, variant, architecture: str) -> "Gate":
        """The gate of ``variant`` (harness.values.variant.Variant) on a model of ``architecture``."""
        return cls(variant.gate_key, variant.dtype, architecture)

    def tolerance(self, reference: str, floor: float | None) -> float:
        cal = self.cross_calibration if reference == CROSS_REFERENCE else self.calibration
        return cal.tolerance(floor)

    def band(self, reference: str, floor: float | None, floor_median: float | None = None,
             floor_scale: float | None = None) -> Band:
        """Each statistic's tolerance from its own floor (``None``: not measured -> the worst row's
        floor stands in for the median, the calibration minimum for the scale)."""
        tol = self.tolerance(reference, floor)
        tol_median = tol if floor_median is None else self.tolerance(reference, floor_median)
        tol_scale = self.tolerance(reference, None if floor_scale is None else abs(floor_scale))
        return Band(tol, floor, tol_median, floor_median, tol_scale, floor_scale, self.ceiling)

    @property
    def ceiling(self) -> float:
        return self.dtype_calibration.ceiling

    def row_margin(self, row) -> float:
        """The row's margin on the statistics that gate it: the worst row where its tolerance is at
        or below the dtype's ceiling, the median row and the scale wherever they were measured; the
        largest of them (NaN where none is finite)."""
        tol = row.tolerance or 0.0
        parts = [margin(row.rel_err, tol)] if tol <= self.ceiling else []
        for err, tol_ in ((row.rel_median, row.tolerance_median), (row.scale_median, row.tolerance_scale)):
            if err == err and math.isfinite(tol_):  # measured (an infinite error is one: it fails the row)
                parts.append(margin(abs(err), tol_))
        finite = [p for p in parts if p == p]
        return max(finite) if finite else (parts[0] if parts else math.nan)

    def finalize(self, row, refs=None) -> None:
        """The row's final status.  A row that passed only because its calibrated tolerance sits
        above the dtype's ceiling is inconclusive (the reference's own noise here is too large to
        tell a mapping bug from rounding); a row above its tolerance fails, whatever the ceiling.
        A failed row is explained by a documented reference bug only where the bug's signature
        holds in this run's reference captures (``refs``); an error is never explained."""
        cal = self.dtype_calibration
        worst_gated = row.tolerance <= cal.ceiling
        median_gated = row.tolerance_median <= cal.ceiling  # NaN (not compared) is never gated
        if row.floor is not None and row.status == "pass" and not (worst_gated or median_gated):
            row.status = "inconclusive"
            row.message = (f"{row.hook} vs {row.reference}: calibrated tolerances (worst row {row.tolerance:.2e}, "
                           f"median row {row.tolerance_median:.2e}) both exceed the {self.dtype} ceiling "
                           f"{cal.ceiling:g}: the reference's own {self.dtype} noise here (floors {row.floor:.2e} / "
                           f"{(row.floor_median if row.floor_median is not None else math.nan):.2e} vs its "
                           f"{cal.truth_dtype} run) is too large to tell a mapping bug from rounding (measured "
                           f"{row.rel_err:.2e} / {row.rel_median:.2e}); the float32 run of this model is the gate "
                           f"for this hook")
        elif row.status == "pass" and not worst_gated:
            row.message = (f"gated by the median row ({row.rel_median:.2e} <= {row.tolerance_median:.2e}) and the "
                           f"scale ({row.scale_median:+.2e}, tolerance {row.tolerance_scale:.2e}); the worst row's "
                           f"tolerance {row.tolerance:.2e} is above the {self.dtype} ceiling {cal.ceiling:g}")
        row.margin = self.row_margin(row)
        issue = known_issue(self.architecture, row.reference, row.hook)
        if issue is not None and row.status == "fail" and refs is not None and issue.holds(refs, row.reference,
                                                                                          row.reference_hook):
            row.known_issue = issue.reason
