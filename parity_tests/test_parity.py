"""The parity suite: one test per (model, reference, hook), real engines only.

Run ``pytest parity_tests --model qwen3`` (or ``--model-path DIR``).  A
failure message names the hook, layer, worst position, max abs error, error
relative to the reference's scale and the tolerance.
"""
from __future__ import annotations

import pytest

from harness.comparison import known_vllm_bugs
from harness.comparison.known_issues import known_issue

pytestmark = pytest.mark.parity


def test_parity(parity_case, parity_session):
    run = parity_session.run(parity_case.model, selective=True)
    if run.result.skipped:
        pytest.skip(f"{parity_case.model}: {run.result.skipped}")
    if run.result.error:
        # one failure carries the engine's reason; the model's other tests point to it
        first = parity_session.engine_failures.setdefault(parity_case.model, parity_case)
        if first != parity_case:
            pytest.skip(f"NOT COMPARED: {parity_case.model}'s engine run failed (the failure is reported once, "
                        f"at {first.reference}-{first.hook}): {run.result.error.splitlines()[0][:200]}")
        pytest.fail(f"{parity_case.model}: engine run failed, no hook compared:\n{run.result.error}", pytrace=False)
    if parity_case.reference == "refusal":  # a declared refusal re-checks to skipped or to an error, never a run
        pytest.fail(f"{parity_case.model}: declared refused, but its run was neither skipped nor an error",
                    pytrace=False)
    row = run.result.row(parity_case.reference, parity_case.hook)
    if row is None:
        pytest.fail(f"{parity_case.model}: no result row for {parity_case.hook} vs {parity_case.reference}",
                    pytrace=False)
    if row.known_issue:
        pytest.xfail(f"known reference bug (its signature holds in this run): {row.known_issue}")
    issue = known_issue(run.result.architecture, row.reference, row.hook)
    if issue is not None and row.passed:
        pytest.fail(f"{parity_case.model}: documented reference bug no longer reproduces ({row.hook} vs "
                    f"{row.reference} passes): retire it from harness/comparison/known_issues.py", pytrace=False)
    bug = run.result.known_vllm_bug  # a declared vLLM bug's check in this run (harness.comparison.known_vllm_bugs)
    if known_vllm_bugs.explains(bug, row.reference, row.status):
        pytest.xfail(f"known vLLM bug (its signature holds in this run: {bug['why']}): {bug['reason']}")
    if known_vllm_bugs.stale_at(bug, row.reference, row.hook):
        pytest.fail(f"{parity_case.model}: {known_vllm_bugs.stale_message(bug)}"
                    + ("" if row.passed else f"\n{row.message}"), pytrace=False)
    if row.status == "inconclusive":
        pytest.skip(f"NOT COMPARED (inconclusive): {row.message}")
    if not row.passed:
        pytest.fail(row.message, pytrace=False)


def test_nonfiring(nonfiring_case):
    """Generated skipped: each item's skip reason says why vLLM cannot expose the hook."""
