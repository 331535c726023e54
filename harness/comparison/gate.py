"""The gate of one run: tolerances and every row's final status, in one place.

Contract: :class:`Gate` is built once per (target, variant) from the variant's
calibration key and the target's architecture.  :meth:`Gate.tolerance` turns a
reference's noise floor into a row's tolerance (harness.comparison.tolerances);
:meth:`Band.judge` is the one gate decision -- ``pass`` / ``fail`` / ``inconclusive`` of a row's
three statistics against their tolerances and the dtype's ceiling -- and :meth:`Gate.judge` applies
it to a row.  harness.comparison.rows fails a compared row by :meth:`Band.exceeded` (the ``fail`` half
of the decision, the statistics each failure message names); :meth:`Gate.finalize` assigns the
row's final status -- the compared verdict, the ceiling's ``inconclusive`` from :meth:`Gate.judge`, a
documented reference bug -- and nothing changes a status after it.
:func:`margin` is the one definition of error / tolerance, and :meth:`Gate.finalize` stores each
row's margin on the statistics that gate it (``HookResult.margin``, :meth:`Band.margin`); reports,
the matrix and the CLI read that number and never recompute it.  The rule in prose, with the
measurements behind it: docs/concepts.md, "The gate".

Traps:
- Above the ceiling the worst rows are chaotic tokens (near-tie amplification), whose divergence
  between two valid bf16 implementations is not bounded by a multiple of one implementation's own
  (docs/concepts.md, "The gate"): the worst row gates only at or below it, the median row and the
  scale whatever it.
- A statistic whose tolerance is not finite (NaN: not compared, as the argmax row's median) gates
  nothing: it neither fails the row nor enters its margin.  :meth:`Gate.band` never makes one (an
  unmeasured floor takes the calibration minimum).  A NaN or infinite *error* on a gating statistic
  fails the row; its margin is NaN or infinite.
- The references checked against each other (``bridge~hf``) never run in TF32, so
  their tolerance uses the plain dtype's calibration (``reference_key``).
- A tolerance of 0 (argmax: top-1 must agree) gives margin 0 for no error and
  infinity for any error, never a division by zero or a NaN that sorts anywhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from harness.comparison.known_issues import known_issue
from harness.comparison.tolerances import Calibration, calibration_for, reference_key

CROSS_REFERENCE = "bridge~hf"  # the two references compared with each other, no vLLM involved

Judgement = Literal["pass", "fail", "inconclusive"]  # the gate's decision of a compared row (Band.judge)


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

    @property
    def worst_gated(self) -> bool:
        """Whether the worst row gates (its tolerance at or below the ceiling)."""
        return self.tolerance <= self.ceiling

    @property
    def conclusive(self) -> bool:
        """Whether a pass is conclusive: the worst row's or the median row's tolerance at or below the
        ceiling (a NaN tolerance never is)."""
        return self.worst_gated or self.tolerance_median <= self.ceiling

    def _gating(self, rel_err: float, rel_median: float, scale_median: float) -> list[tuple[str, float, float]]:
        """``(statistic, error, tolerance)`` of each statistic that gates: the worst row where its
        tolerance is at or below the ceiling, the median row and the scale where their tolerance is finite."""
        out = [("worst", rel_err, self.tolerance)] if self.worst_gated else []
        return out + [(name, abs(err), tol) for name, err, tol in
                      (("median", rel_median, self.tolerance_median), ("scale", scale_median, self.tolerance_scale))
                      if math.isfinite(tol)]

    def exceeded(self, rel_err: float, rel_median: float, scale_median: float) -> tuple[str, ...]:
        """The gating statistics (``worst`` / ``median`` / ``scale``) whose error is not within its
        tolerance; a NaN or infinite error never is."""
        return tuple(name for name, err, tol in self._gating(rel_err, rel_median, scale_median)
                     if not (math.isfinite(err) and err <= tol))

    def judge(self, rel_err: float, rel_median: float, scale_median: float) -> Judgement:
        """The gate decision: ``fail`` when a gating statistic exceeds its tolerance (whatever the
        ceiling for the median row and the scale); else ``inconclusive`` when the floor was measured and
        neither the worst row's nor the median row's tolerance is at or below the ceiling (the
        reference's own noise too large to tell a mapping bug from rounding); else ``pass``."""
        if self.exceeded(rel_err, rel_median, scale_median):
            return "fail"
        if self.floor is not None and not self.conclusive:
            return "inconclusive"
        return "pass"

    def margin(self, rel_err: float, rel_median: float, scale_median: float) -> float:
        """error / tolerance on the gating statistics: the largest that is not NaN (NaN where none is)."""
        parts = [m for _, err, tol in self._gating(rel_err, rel_median, scale_median) if (m := margin(err, tol)) == m]
        return max(parts) if parts else math.nan


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

    def band_of(self, row) -> Band:
        """The :class:`Band` a row (harness.values.results.HookResult) was compared within, at this
        run's ceiling."""
        return Band(row.tolerance or 0.0, row.floor, row.tolerance_median, row.floor_median,
                    row.tolerance_scale, row.floor_scale, self.ceiling)

    def judge(self, row) -> Judgement:
        """The gate decision of ``row``'s statistics (:meth:`Band.judge`)."""
        return self.band_of(row).judge(row.rel_err, row.rel_median, row.scale_median)

    def row_margin(self, row) -> float:
        """The row's margin on the statistics that gate it (:meth:`Band.margin`): the worst row where
        its tolerance is at or below the dtype's ceiling, the median row and the scale wherever they
        were measured; the largest of them (NaN where none is)."""
        return self.band_of(row).margin(row.rel_err, row.rel_median, row.scale_median)

    def finalize(self, row, refs=None) -> None:
        """The row's final status.  A row that passed where it was compared takes the gate's decision
        (:meth:`judge`): ``inconclusive`` where its calibrated tolerances sit above the dtype's ceiling;
        a fail, an error or an inconclusive decided there stands (rows.compared_row judged the same
        numbers by :meth:`Band.exceeded`; the argmax and GGUF rows state their own).  A failed row is
        explained by a documented reference bug only where the bug's signature holds in this run's
        reference captures (``refs``); an error is never explained."""
        cal = self.dtype_calibration
        band = self.band_of(row)
        if row.status == "pass" and self.judge(row) == "inconclusive":
            row.status = "inconclusive"
            row.message = (f"{row.hook} vs {row.reference}: calibrated tolerances (worst row {row.tolerance:.2e}, "
                           f"median row {row.tolerance_median:.2e}) both exceed the {self.dtype} ceiling "
                           f"{cal.ceiling:g}: the reference's own {self.dtype} noise here (floors {row.floor:.2e} / "
                           f"{(row.floor_median if row.floor_median is not None else math.nan):.2e} vs its "
                           f"{cal.truth_dtype} run) is too large to tell a mapping bug from rounding (measured "
                           f"{row.rel_err:.2e} / {row.rel_median:.2e}); the float32 run of this model is the gate "
                           f"for this hook")
        elif row.status == "pass" and not band.worst_gated:
            row.message = (f"gated by the median row ({row.rel_median:.2e} <= {row.tolerance_median:.2e}) and the "
                           f"scale ({row.scale_median:+.2e}, tolerance {row.tolerance_scale:.2e}); the worst row's "
                           f"tolerance {row.tolerance:.2e} is above the {self.dtype} ceiling {cal.ceiling:g}")
        row.margin = self.row_margin(row)
        issue = known_issue(self.architecture, row.reference, row.hook)
        if issue is not None and row.status == "fail" and refs is not None and issue.holds(refs, row.reference,
                                                                                          row.reference_hook):
            row.known_issue = issue.reason
