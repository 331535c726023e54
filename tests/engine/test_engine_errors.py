"""An engine that refuses a configuration is one error carrying vLLM's own reason -- in the result,
the report and the matrix -- not hundreds of failures and a log path.  Real vLLM (it refuses at
configuration time, before loading weights)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.parity


def test_tensor_parallelism_that_does_not_divide_the_heads_is_one_error_with_vllms_reason(tmp_path):
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.pipeline.runner import run_model
    from harness.values.variant import Variant
    from harness.reporting.matrix import build_matrix
    from harness.reporting.report import write_report

    target = target_for_family(FAMILIES["smollm2"])  # 9 attention heads
    run = run_model(target, Variant.make("float32", "cpu", tp=2), work_root=tmp_path)
    error = run.result.error or ""
    assert "divisible" in error.splitlines()[0] and "2" in error.splitlines()[0], error[:2000]
    assert not run.result.rows and run.result.summary["verdict"] == "error"
    write_report(run.result.to_dict(), tmp_path / "reports")
    (row,) = build_matrix(tmp_path / "reports")
    assert row["verdict"] == "error" and "divisible" in row["error"]
