"""harness.comparison.gate: the one definition of margin, each row's tolerances (Band), and the
final status Gate.finalize assigns, with the margin it stores on the row (Gate.row_margin).

Contracts checked (from the module's docstring and code):
- margin(err, tol) = err / tol; a NaN error gives NaN; a tolerance of 0 (argmax) gives 0 for no
  error and +inf for any error -- never a ZeroDivisionError, never NaN.
- Gate.tolerance uses the plain dtype's calibration for the cross-reference row (bridge~hf never
  runs in TF32) and the variant's key (e.g. float32-tf32) for every other reference.
- Gate.band: each statistic from its own floor; no median floor -> the worst row's tolerance stands
  in; no scale floor -> the calibration minimum; a negative (signed) scale floor is used by size.
- Gate.finalize: a passing row whose worst-row and median-row tolerances both exceed the dtype's
  ceiling is "inconclusive" (and says why); one whose worst-row tolerance alone exceeds it stays
  "pass", says it was gated by the median row and the scale; a failing row fails whatever the
  ceiling; a row with no measured floor is never made inconclusive; an error is never explained by a
  known reference bug; a fail is explained only where the bug's signature holds in ``refs``.
- Gate.row_margin (stored as row.margin by finalize): the largest margin over the statistics that
  gate the row -- the worst row only at or below the ceiling -- NaN where none is measured.
- Gate.judge / Band.judge, the one gate decision: pass within every gating tolerance (an error equal
  to its tolerance passes; a tolerance equal to the ceiling gates); fail when a gating statistic
  exceeds it (the worst row only at or below the ceiling, the median and the scale whatever it; a NaN
  or infinite error fails); inconclusive when it passes with a measured floor and neither the worst
  nor the median row's tolerance is at or below the ceiling; a NaN tolerance gates nothing.
  Band.exceeded names the failing statistics, in the order compare_prompts writes their messages.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from harness.comparison.gate import CROSS_REFERENCE, Band, Gate, margin
from harness.comparison.tolerances import calibration_for
from harness.values.results import HookResult


# -- margin --------------------------------------------------------------------------------------

def test_margin_is_error_over_tolerance():
    assert margin(0.5, 2.0) == 0.25
    assert margin(3e-4, 1e-4) == pytest.approx(3.0, rel=1e-12)
    assert margin(0.0, 1e-4) == 0.0


def test_margin_with_tolerance_zero_is_zero_or_infinite_never_nan():
    assert margin(0.0, 0.0) == 0.0
    assert margin(1e-12, 0.0) == math.inf
    assert margin(1.0, 0.0) == math.inf
    assert margin(math.inf, 0.0) == math.inf


def test_margin_of_nan_error_is_nan_whatever_the_tolerance():
    assert math.isnan(margin(math.nan, 1.0))
    assert math.isnan(margin(math.nan, 0.0))  # not 0 and not inf: NaN != 0 must not read as "no error"


def test_margin_sorts_nan_never_as_a_pass():
    # the trap: NaN compared with 1 is False both ways, so "< 1 passes" must not be read as "not >= 1"
    m = margin(math.nan, 1.0)
    assert not (m < 1) and not (m >= 1)


# -- tolerance and band ------------------------------------------------------------------------

def test_cross_reference_tolerance_uses_plain_dtype_calibration_under_tf32():
    gate = Gate("float32-tf32", "float32", "LlamaForCausalLM")
    # float32-tf32: 4 x floor, float32: 10 x floor (both minimum 1e-4)
    assert gate.tolerance("bridge", 1e-3) == pytest.approx(4e-3, rel=1e-12)
    assert gate.tolerance(CROSS_REFERENCE, 1e-3) == pytest.approx(1e-2, rel=1e-12)
    assert CROSS_REFERENCE == "bridge~hf"


def test_tolerance_floor_none_or_tiny_is_the_minimum():
    gate = Gate("bfloat16", "bfloat16", "LlamaForCausalLM")
    assert gate.tolerance("bridge", None) == 2e-2
    assert gate.tolerance("bridge", 1e-4) == 2e-2
    assert gate.tolerance("bridge", 0.05) == pytest.approx(0.2, rel=1e-12)


def test_band_each_statistic_from_its_own_floor():
    gate = Gate("bfloat16", "bfloat16", "LlamaForCausalLM")
    band = gate.band("bridge", 0.1, floor_median=0.01, floor_scale=-0.02)
    assert band == Band(tolerance=pytest.approx(0.4), floor=0.1, tolerance_median=pytest.approx(0.04),
                        floor_median=0.01, tolerance_scale=pytest.approx(0.08), floor_scale=-0.02, ceiling=0.25)
    assert band.tolerance_scale == pytest.approx(0.08, rel=1e-12)  # |-0.02| x 4, not the minimum
    assert band.floor_scale == -0.02  # the signed floor is kept as measured


def test_band_unmeasured_median_takes_the_worst_rows_tolerance_and_scale_the_minimum():
    gate = Gate("float32", "float32", "LlamaForCausalLM")
    band = gate.band("bridge", 1e-3)
    assert band.tolerance == pytest.approx(1e-2, rel=1e-12)
    assert band.tolerance_median == band.tolerance
    assert band.floor_median is None
    assert band.tolerance_scale == 1e-4  # the float32 minimum
    assert band.ceiling == 0.25 == gate.ceiling


def test_unknown_dtype_gate_refuses():
    from harness.comparison.tolerances import UnsupportedDtypeError

    with pytest.raises(UnsupportedDtypeError, match="'float8' has no calibration"):
        Gate("float8", "float8", "X")


# -- finalize ----------------------------------------------------------------------------------

def _row(status="pass", tolerance=0.05, floor=0.01, rel_err=0.02, rel_median=0.005, tolerance_median=0.05,
         scale_median=0.001, tolerance_scale=0.05, floor_median=0.002, reference="bridge",
         hook="blocks.1.hook_out") -> HookResult:
    return HookResult("toy", reference, hook, hook, 1, "hook_out", status, tolerance, rel_err=rel_err,
                      floor=floor, rel_median=rel_median, floor_median=floor_median,
                      tolerance_median=tolerance_median, scale_median=scale_median,
                      tolerance_scale=tolerance_scale)


BF16 = Gate("bfloat16", "bfloat16", "LlamaForCausalLM")


def test_pass_within_ceiling_stays_pass_and_stores_its_margin():
    row = _row()
    BF16.finalize(row)
    assert row.status == "pass" and row.message == ""
    # worst 0.02/0.05 = 0.4, median 0.005/0.05 = 0.1, scale 0.001/0.05 = 0.02: the largest
    assert row.margin == pytest.approx(0.4, rel=1e-12)
    assert row.known_issue is None


def test_pass_with_both_tolerances_above_ceiling_is_inconclusive():
    row = _row(tolerance=0.6, tolerance_median=0.3, floor=0.15, floor_median=0.075, rel_err=0.5, rel_median=0.1)
    BF16.finalize(row)
    assert row.status == "inconclusive"
    assert row.message.startswith("blocks.1.hook_out vs bridge: calibrated tolerances (worst row 6.00e-01, "
                                  "median row 3.00e-01) both exceed the bfloat16 ceiling 0.25: ")
    assert "(floors 1.50e-01 / 7.50e-02 vs its float32 run)" in row.message
    assert "(measured 5.00e-01 / 1.00e-01)" in row.message
    assert row.message.endswith("the float32 run of this model is the gate for this hook")
    # neither worst row (ungated) nor... the median and scale were measured: their margins stand
    assert row.margin == pytest.approx(max(0.1 / 0.3, 0.001 / 0.05), rel=1e-12)


def test_tolerance_exactly_at_ceiling_is_gated():
    row = _row(tolerance=0.25, tolerance_median=0.25, rel_err=0.2, rel_median=0.01)
    BF16.finalize(row)
    assert row.status == "pass" and row.message == ""
    assert row.margin == pytest.approx(0.8, rel=1e-12)


def test_pass_gated_by_median_only_says_so():
    row = _row(tolerance=0.6, tolerance_median=0.04, rel_err=0.5, rel_median=0.01, scale_median=-0.002,
               tolerance_scale=0.02)
    BF16.finalize(row)
    assert row.status == "pass"
    assert row.message == ("gated by the median row (1.00e-02 <= 4.00e-02) and the scale (-2.00e-03, tolerance "
                           "2.00e-02); the worst row's tolerance 6.00e-01 is above the bfloat16 ceiling 0.25")
    # the worst row (0.5/0.6) is above the ceiling: not part of the margin; median 0.25, scale 0.1
    assert row.margin == pytest.approx(0.25, rel=1e-12)


def test_fail_above_ceiling_stays_fail():
    row = _row(status="fail", tolerance=0.6, tolerance_median=0.3, rel_err=0.9, rel_median=0.5)
    row.message = "median too large"
    BF16.finalize(row)
    assert row.status == "fail" and row.message == "median too large"
    assert row.margin == pytest.approx(0.5 / 0.3, rel=1e-12)


def test_unmeasured_floor_is_never_inconclusive():
    row = _row(floor=None, tolerance=0.6, tolerance_median=0.6)
    BF16.finalize(row)
    assert row.status == "pass"


def test_nan_median_tolerance_is_never_gated():
    row = _row(tolerance=0.6, tolerance_median=math.nan, rel_median=math.nan, scale_median=math.nan,
               tolerance_scale=math.nan)
    BF16.finalize(row)
    assert row.status == "inconclusive"
    assert math.isnan(row.margin)  # nothing that gates it was measured


def test_error_row_stays_error_and_keeps_its_message():
    row = _row(status="error", rel_err=math.nan, rel_median=math.nan, scale_median=math.nan)
    row.message = "hook never fired"
    BF16.finalize(row)
    assert row.status == "error" and row.message == "hook never fired"
    assert math.isnan(row.margin)


def test_argmax_row_tolerance_zero_margin():
    gate = Gate("float32", "float32", "LlamaForCausalLM")
    ok = HookResult("toy", "hf", "argmax", "argmax(logits)", None, "argmax", "pass", 0.0, rel_err=0.0)
    bad = HookResult("toy", "hf", "argmax", "argmax(logits)", None, "argmax", "fail", 0.0, rel_err=1.0)
    gate.finalize(ok)
    gate.finalize(bad)
    assert ok.margin == 0.0 and ok.status == "pass"
    assert bad.margin == math.inf and bad.status == "fail"


# -- row_margin --------------------------------------------------------------------------------

def test_row_margin_takes_the_largest_gated_statistic():
    row = _row(rel_err=0.01, tolerance=0.05, rel_median=0.02, tolerance_median=0.04, scale_median=-0.03,
               tolerance_scale=0.05)
    assert BF16.row_margin(row) == pytest.approx(0.6, rel=1e-12)  # |scale| / tol: the sign does not matter


def test_row_margin_nan_worst_row_with_median_measured_is_the_median():
    row = _row(rel_err=math.nan, rel_median=0.01, tolerance_median=0.04, scale_median=math.nan)
    assert BF16.row_margin(row) == pytest.approx(0.25, rel=1e-12)


def test_row_margin_only_nan_worst_row_is_nan():
    row = _row(rel_err=math.nan, rel_median=math.nan, scale_median=math.nan)
    assert math.isnan(BF16.row_margin(row))


def test_row_margin_infinite_worst_row_is_infinite():
    row = _row(rel_err=math.inf)
    assert BF16.row_margin(row) == math.inf


def test_row_margin_of_a_failed_row_with_infinite_median_is_infinite():
    row = _row(status="fail", tolerance=0.6, tolerance_median=0.04, rel_err=math.inf, rel_median=math.inf,
               scale_median=math.inf, tolerance_scale=0.02)
    BF16.finalize(row)
    assert row.status == "fail"
    assert row.margin == math.inf


# -- judge: the one gate decision -------------------------------------------------------------

def test_judge_passes_within_every_tolerance():
    assert BF16.judge(_row()) == "pass"


@pytest.mark.parametrize("stats, failing", [
    (dict(rel_err=0.06), ("worst",)),
    (dict(rel_median=0.06), ("median",)),
    (dict(scale_median=-0.06), ("scale",)),  # by size: the sign does not matter
    (dict(rel_err=0.06, rel_median=0.06, scale_median=0.06), ("worst", "median", "scale")),
])
def test_judge_fails_on_any_gating_statistic(stats, failing):
    row = _row(**stats)
    assert BF16.judge(row) == "fail"
    assert BF16.band_of(row).exceeded(row.rel_err, row.rel_median, row.scale_median) == failing


def test_judge_boundaries_error_at_tolerance_passes_tolerance_at_ceiling_gates():
    assert BF16.judge(_row(rel_err=0.05, rel_median=0.05, scale_median=-0.05)) == "pass"
    assert BF16.judge(_row(tolerance=0.25, tolerance_median=0.25, rel_err=0.25)) == "pass"
    assert BF16.judge(_row(tolerance=0.25, rel_err=0.2500001)) == "fail"  # gated at the ceiling: it fails
    # one step above the ceiling the worst row no longer gates, neither for pass nor for fail
    assert BF16.judge(_row(tolerance=0.2500001, tolerance_median=0.05, rel_err=9.0)) == "pass"


def test_judge_inconclusive_only_when_both_tolerances_exceed_the_ceiling_and_the_floor_was_measured():
    both_above = dict(tolerance=0.6, tolerance_median=0.3, rel_err=0.5, rel_median=0.1)
    assert BF16.judge(_row(**both_above)) == "inconclusive"
    assert BF16.judge(_row(**{**both_above, "tolerance_median": 0.25})) == "pass"  # the median gates it
    assert BF16.judge(_row(**both_above, floor=None)) == "pass"  # no floor measured: never inconclusive
    # a failing statistic fails the row whatever the ceiling: no inconclusive hides it
    assert BF16.judge(_row(**{**both_above, "rel_median": 0.31})) == "fail"
    assert BF16.judge(_row(**{**both_above, "scale_median": 0.06})) == "fail"


def test_judge_non_finite_errors_fail_and_nan_tolerances_gate_nothing():
    assert BF16.judge(_row(rel_err=math.nan)) == "fail"
    assert BF16.judge(_row(rel_err=math.inf)) == "fail"
    assert BF16.judge(_row(rel_median=math.nan)) == "fail"
    assert BF16.judge(_row(scale_median=math.inf)) == "fail"
    # a NaN error on a worst row above the ceiling is not gated
    assert BF16.judge(_row(tolerance=0.6, rel_err=math.nan)) == "pass"
    # NaN tolerances (not compared): the median and scale gate nothing, so only the worst row decides
    unmeasured = dict(tolerance_median=math.nan, rel_median=math.nan, tolerance_scale=math.nan, scale_median=math.nan)
    assert BF16.judge(_row(**unmeasured)) == "pass"
    assert BF16.judge(_row(**unmeasured, tolerance=0.6)) == "inconclusive"


def test_judge_argmax_row_tolerance_zero():
    ok = HookResult("toy", "hf", "argmax", "argmax(logits)", None, "argmax", "pass", 0.0, rel_err=0.0)
    bad = HookResult("toy", "hf", "argmax", "argmax(logits)", None, "argmax", "fail", 0.0, rel_err=1.0)
    assert (BF16.judge(ok), BF16.judge(bad)) == ("pass", "fail")


def test_compared_row_and_finalize_follow_judge():
    """rows.compared_row fails a row by the gate's rule; finalize takes judge's inconclusive: the
    final status is judge's for a compared row."""
    from harness.comparison.rows import compared_row
    from harness.values.plan import Case

    r = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 2.0
    case = Case("bridge", "blocks.1.hook_out", "blocks.1.hook_out")
    for floors in ((0.001, 0.001, 0.0), (0.2, 0.1, 0.0), (0.2, 0.01, 0.0)):
        band = BF16.band("bridge", *floors)
        for subject in (r.clone(), r * 1.05, r + 0.3):
            row = compared_row("toy", case, band, [(subject, r)])
            judged = BF16.judge(row)
            assert row.status == ("fail" if judged == "fail" else "pass")
            BF16.finalize(row)
            assert row.status == judged, (floors, row.message)


# -- known reference bugs ----------------------------------------------------------------------

def _opt_refs(equal: bool):
    scores = torch.rand(2, 3, 3)
    pattern = scores.clone() if equal else scores + 1
    hooks = {"blocks.0.attn.hook_attn_scores": scores, "blocks.0.attn.hook_pattern": pattern}
    return SimpleNamespace(bridge={0: hooks}, compat={})


def _opt_row(status):
    hook = "blocks.0.attn.hook_attn_scores"
    return HookResult("opt", "bridge", hook, hook, 0, "attn.hook_attn_scores", status, 1e-4, rel_err=1.0,
                      floor=1e-7, rel_median=1.0, tolerance_median=1e-4)


OPT = Gate("float32", "float32", "OPTForCausalLM")


def test_known_issue_explains_a_fail_only_where_its_signature_holds():
    row = _opt_row("fail")
    OPT.finalize(row, _opt_refs(equal=True))
    assert row.status == "fail"  # explained, but its real status is kept
    assert row.known_issue is not None and row.known_issue.startswith("TransformerLens 4.3.0 bug: for OPT")

    row = _opt_row("fail")
    OPT.finalize(row, _opt_refs(equal=False))
    assert row.known_issue is None

    row = _opt_row("fail")
    OPT.finalize(row)  # no captures: a name match alone explains nothing
    assert row.known_issue is None


def test_known_issue_never_explains_an_error_or_a_pass():
    for status in ("error", "pass"):
        row = _opt_row(status)
        OPT.finalize(row, _opt_refs(equal=True))
        assert row.known_issue is None, status


def test_known_issue_is_per_architecture():
    row = _opt_row("fail")
    Gate("float32", "float32", "LlamaForCausalLM").finalize(row, _opt_refs(equal=True))
    assert row.known_issue is None


def test_every_variant_the_front_ends_accept_has_a_calibration():
    """The front ends validate a variant once (Variant.make); the gate built from any variant they
    accept finds its calibrations, so no second dtype check is needed before an engine boots."""
    from itertools import product

    from harness.values.variant import DTYPES, PRECISIONS, Variant

    for dtype, precision in product(DTYPES, PRECISIONS):
        variant = Variant(dtype, "cuda", precision if dtype == "float32" else "ieee")  # what make() keeps
        gate = Gate.for_run(variant, "LlamaForCausalLM")
        assert gate.calibration is calibration_for(variant.gate_key)
        assert gate.dtype_calibration is calibration_for(dtype)
