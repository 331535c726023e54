"""Numerics beyond the fp32 eager default: bf16 with calibrated tolerances on
every family, and vLLM compiled with torch.compile (hooks installed before
tracing) giving the same verdicts as eager.  Real engines; one boot per
(model, dtype, mode)."""
from __future__ import annotations

import pytest

from harness.models.families import DEFAULT_FAMILIES, FAMILIES

# bf16 is gated in CI on the synthetic families; the real checkpoint's bf16 run is measured with
# `python -m harness run --model smollm2 --dtype bfloat16` and reported in the README ("Measured"):
# its ragged-batch attention rows sit farther from the reference than the single-prompt floor allows
# (an open finding, not yet explained), so it is not a CI gate until that is understood.
SYNTHETIC = [f for f in DEFAULT_FAMILIES if FAMILIES[f].packaged is None]

pytestmark = pytest.mark.parity


def _failures(run):
    assert run.result.error is None, run.result.error
    return [r.message for r in run.result.rows if r.status in ("fail", "error") and not r.known_issue]


@pytest.mark.parametrize("family", SYNTHETIC)
def test_bf16_passes_with_calibrated_tolerances(parity_session, family):
    run = parity_session.run(family, dtype="bfloat16", compiled=False)
    assert not _failures(run)
    rows = [r for r in run.result.rows if r.floor is not None]
    assert rows, "no calibrated rows"
    # calibrated, not a constant: the tolerance follows each hook's floor
    assert len({round(r.tolerance, 12) for r in rows}) > 3
    # the ceiling keeps every passing bf16 row able to fail a mapping bug: a row passes only where its worst
    # row or its median row is a gate (harness.comparison.gate: above the ceiling the worst rows are
    # chaotic tokens, so the median row decides; the median and the scale always can fail a row)
    assert all(min(r.tolerance, r.tolerance_median) <= 0.25 for r in run.result.rows
               if r.status == "pass" and r.floor is not None)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "gpt_neox"])  # a native vLLM model; one on the Transformers backend
def test_compiled_mode_gives_the_same_verdicts_as_eager(parity_session, family):
    eager = parity_session.run(family, compiled=False)
    compiled = parity_session.run(family, compiled=True)
    assert compiled.result.compiled and not eager.result.compiled
    assert not _failures(compiled)
    verdicts = lambda run: {(r.reference, r.hook): r.status for r in run.result.rows}  # noqa: E731
    assert verdicts(compiled) == verdicts(eager)


def test_a_declared_vllm_dtype_refusal_is_rechecked(tmp_path):
    """Like a strict xfail: vLLM is asked again and must still refuse, in its own words."""
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.pipeline.runner import run_model
    from harness.pipeline.variant import Variant

    target = target_for_family(FAMILIES["gemma2"])
    assert "float16" in target.unsupported_dtypes
    run = run_model(target, Variant.make("float16", "cpu"), work_root=tmp_path)
    assert run.result.error is None, run.result.error
    assert run.result.skipped and "re-checked: vLLM still refuses" in run.result.skipped, run.result.skipped
    assert "float16" in run.result.skipped.split("re-checked", 1)[1]
