"""The parity suite: one test per (model, reference, hook), real engines only.

Run ``pytest parity_tests --model qwen3`` (or ``--model-path DIR``).  A
failure message names the hook, layer, worst position, max abs error, error
relative to the reference's scale and the tolerance.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.parity


def test_parity(parity_case, parity_session):
    run = parity_session.run(parity_case.model, selective=True)
    if run.result.skipped:
        pytest.skip(f"{parity_case.model}: {run.result.skipped}")
    if run.result.error:
        pytest.fail(f"{parity_case.model}: engine run failed, no hook compared:\n{run.result.error}", pytrace=False)
    row = run.result.row(parity_case.reference, parity_case.hook)
    if row is None:
        pytest.fail(f"{parity_case.model}: no result row for {parity_case.hook} vs {parity_case.reference}",
                    pytrace=False)
    if row.status == "inconclusive":
        pytest.skip(row.message)
    if not row.passed:
        pytest.fail(row.message, pytrace=False)


def test_nonfiring(nonfiring_case):
    """Generated skipped: each item's skip reason says why vLLM cannot expose the hook."""
