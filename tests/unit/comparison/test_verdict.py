"""harness.comparison.verdict: the model verdict's rule, applied to rows whose status and margin the gate
already decided, and the summary a run stores.

Contracts checked: pass only when every offered hook was gated and nothing failed or errored; an
inconclusive row leaves its hook ungated (partial), never passed; a failure outranks an error; no
rows, or an engine error, is an error; a declared refusal is skipped; a row explained by a documented
reference bug is neither a failure nor gated; the worst row is the one with the largest stored margin
(a gated row whose margin is not finite sorts as the worst: nothing hides behind a NaN); summary_of returns the stored summary untouched and only
summarizes a result that has none, saying so.
"""
from __future__ import annotations

import math

from harness.comparison.verdict import VERDICTS, stored_margin, summarize, summary_of


def _row(hook="blocks.0.hook_out", reference="bridge", status="pass", margin=0.5, rel_err=1e-6, **kw):
    return {"hook": hook, "reference": reference, "kind": "hook_out", "status": status, "margin": margin,
            "rel_err": rel_err, "known_issue": None, **kw}


def _result(*rows, **kw):
    return {"rows": list(rows), "nonfiring": [], **kw}


def test_every_hook_gated_and_passing_is_pass():
    s = summarize(_result(_row(), _row("blocks.1.hook_out")))
    assert s["verdict"] == "pass" and s["hooks_gated"] == s["hooks_compared"] == 2 and not s["ungated_hooks"]


def test_an_inconclusive_hook_is_partial_never_pass():
    s = summarize(_result(_row(), _row("blocks.1.hook_out", status="inconclusive")))
    assert s["verdict"] == "partial" and s["ungated_hooks"] == ["blocks.1.hook_out"] and s["inconclusive"] == 1


def test_failure_outranks_error_and_error_outranks_partial():
    assert summarize(_result(_row(status="fail"), _row("blocks.1.hook_out", status="error")))["verdict"] == "fail"
    assert summarize(_result(_row(status="error"), _row("blocks.1.hook_out", status="inconclusive")))["verdict"] == "error"


def test_nothing_compared_or_an_engine_error_is_an_error_and_a_refusal_is_skipped():
    assert summarize(_result())["verdict"] == "error"
    assert summarize(_result(_row(), error="RuntimeError: engine died"))["verdict"] == "error"
    assert summarize(_result(skipped="float16 not run: vLLM refuses it"))["verdict"] == "skipped"


def test_a_known_reference_bug_is_not_a_failure_and_not_gated():
    s = summarize(_result(_row(), _row("blocks.0.attn.hook_attn_scores", status="fail", known_issue="TL bug")))
    assert s["failed"] == 0 and s["known_issues"] == 1 and s["verdict"] == "partial"


def test_the_worst_row_is_the_largest_stored_margin():
    rows = [_row(margin=0.2), _row("blocks.1.hook_out", margin=0.9, rel_err=3e-5)]
    s = summarize(_result(*rows))
    assert s["worst_margin"] == 0.9 and s["worst_rel_err"] == 3e-5 and s["worst_where"] == "blocks.1.hook_out vs bridge"
    s = summarize(_result(*rows, _row("blocks.2.hook_out", margin=math.nan)))
    assert s["worst_where"] == "blocks.2.hook_out vs bridge" and math.isnan(s["worst_margin"])
    assert math.isnan(stored_margin({"margin": None}))


def test_summary_of_reads_the_stored_summary_and_summarizes_only_an_old_result():
    stored = {"verdict": "fail", "rows": 7}
    assert summary_of(_result(_row(), summary=stored)) is stored  # never recomputed
    fresh = summary_of(_result(_row()))
    assert fresh["verdict"] == "pass" and fresh["computed_on_read"] is True
    assert set(VERDICTS) == {"pass", "partial", "fail", "error", "skipped"}
