"""The gate of one run: tolerances and every row's final status, in one place.

Contract: :class:`Gate` is built once per (target, variant) from the variant's
calibration key and the target's architecture.  :meth:`Gate.tolerance` turns a
reference's noise floor into a row's tolerance (harness.references.tolerances);
:meth:`Gate.finalize` assigns the row's final status -- the compared verdict, the
dtype's ceiling, a documented reference bug -- and nothing changes a status after it.
:func:`margin` is the one definition of error / tolerance.

Traps:
- The references checked against each other (``bridge~hf``) never run in TF32, so
  their tolerance uses the plain dtype's calibration (``reference_key``).
- A tolerance of 0 (argmax: top-1 must agree) gives margin 0 for no error and
  infinity for any error, never a division by zero or a NaN that sorts anywhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from harness.references.known_issues import known_issue
from harness.references.tolerances import calibration_for, reference_key, tolerance

CROSS_REFERENCE = "bridge~hf"  # the two references compared with each other, no vLLM involved


def margin(err: float, tol: float) -> float:
    """error / tolerance (< 1 passes).  NaN error -> NaN; tolerance 0 -> 0 or inf."""
    if err != err:  # NaN
        return math.nan
    if tol > 0:
        return err / tol
    return 0.0 if err == 0 else math.inf


@dataclass(frozen=True)
class Gate:
    key: str  # calibration key of vLLM's rows ("float32", "bfloat16", "float32-tf32", ...)
    dtype: str  # the run's dtype: its ceiling applies to every row
    architecture: str  # for documented reference bugs

    def tolerance(self, reference: str, floor: float | None) -> float:
        key = reference_key(self.key) if reference == CROSS_REFERENCE else self.key
        return tolerance(key, floor)

    @property
    def ceiling(self) -> float:
        return calibration_for(self.dtype).ceiling

    def finalize(self, row, refs=None) -> None:
        """The row's final status.  A row that passed only because its calibrated tolerance sits
        above the dtype's ceiling is inconclusive (the reference's own noise here is too large to
        tell a mapping bug from rounding); a row above its tolerance fails, whatever the ceiling.
        A failed row is explained by a documented reference bug only where the bug's signature
        holds in this run's reference captures (``refs``); an error is never explained."""
        cal = calibration_for(self.dtype)
        if row.floor is not None and row.tolerance > cal.ceiling and row.status == "pass":
            row.status = "inconclusive"
            row.message = (f"{row.hook} vs {row.reference}: calibrated tolerance {row.tolerance:.2e} exceeds the "
                           f"{self.dtype} ceiling {cal.ceiling:g}: the reference's own {self.dtype} noise floor here "
                           f"({row.floor:.2e}, vs its {cal.truth_dtype} run) is too large to "
                           f"tell a mapping bug from rounding (measured error {row.rel_err:.2e}); the "
                           f"float32 run of this model is the gate for this hook")
        issue = known_issue(self.architecture, row.reference, row.hook)
        if issue is not None and row.status == "fail" and refs is not None and issue.holds(refs, row.reference,
                                                                                          row.reference_hook):
            row.known_issue = issue.reason
