"""Numerics beyond the fp32 eager default: bf16 with calibrated tolerances on
every family, and vLLM compiled with torch.compile (hooks installed before
tracing) giving the same verdicts as eager.  Real engines; one boot per
(model, dtype, mode)."""
from __future__ import annotations

import pytest

from harness.models.families import DEFAULT_FAMILIES, FAMILIES

SYNTHETIC = [f for f in DEFAULT_FAMILIES if FAMILIES[f].packaged is None]
REAL = [f for f in DEFAULT_FAMILIES if FAMILIES[f].packaged is not None]

pytestmark = pytest.mark.parity


def _failures(run):
    assert run.result.error is None, run.result.error
    return [r.message for r in run.result.rows if r.status in ("fail", "error") and not r.known_issue]


def _known_vllm_bug(run) -> None:
    """A declared known vLLM bug of this run (harness.comparison.known_vllm_bugs): a strict xfail while its
    signature holds and no row errors; a failure when it does not."""
    from harness.comparison.known_vllm_bugs import stale_message

    assert run.result.error is None, run.result.error
    bug = run.result.known_vllm_bug
    if bug is None:
        return
    assert bug["holds"], stale_message(bug)
    errors = [r.message for r in run.result.rows if r.status == "error"]
    assert not errors, errors[:5]
    pytest.xfail(f"known vLLM bug (its signature holds in this run: {bug['why']}): {bug['reason']}")


@pytest.mark.parametrize("family", SYNTHETIC)
def test_bf16_passes_with_calibrated_tolerances(parity_session, family):
    run = parity_session.run(family, dtype="bfloat16", compiled=False)
    _known_vllm_bug(run)
    assert not _failures(run)
    if FAMILIES[family].refusal_on(parity_session.device) is not None:  # re-checked by the run (pipeline.refusals)
        assert run.result.skipped, f"{family}: declared refused, but the run was not skipped"
        pytest.skip(f"{family}: {run.result.skipped}")
    rows = [r for r in run.result.rows if r.floor is not None]
    assert rows, "no calibrated rows"
    # calibrated, not a constant: the tolerance follows each hook's floor
    assert len({round(r.tolerance, 12) for r in rows}) > 3
    # the ceiling keeps every passing bf16 row able to fail a mapping bug: a row passes only where its worst
    # row or its median row is a gate (harness.comparison.gate: above the ceiling the worst rows are
    # chaotic tokens, so the median row decides; the median and the scale always can fail a row)
    assert all(min(r.tolerance, r.tolerance_median) <= 0.25 for r in run.result.rows
               if r.status == "pass" and r.floor is not None)


@pytest.mark.parametrize("family", REAL)
def test_real_checkpoint_bf16_gates_nearly_every_hook_with_no_false_alarm(parity_session, family):
    """The target on real trained weights (SmolLM2-135M): >= 95 % of the offered hooks gated
    (pass or fail, not inconclusive) and nothing fails, since fp32 proves the mapping right.  A chaotic
    token of the reference's own bf16 run (harness.comparison.chaos) is set aside, not a failure."""
    run = parity_session.run(family, dtype="bfloat16", compiled=False)
    assert not _failures(run)
    s = run.result.summary  # the verdict run_model stored
    assert s["hooks_gated"] >= 0.95 * s["hooks_compared"], f"gated {s['hooks_gated']} of {s['hooks_compared']}"
    for c in run.result.chaotic_tokens:  # each one named in the rows it sets aside
        assert any("chaotic token" in r.message and f"token {c['token']}" in r.message for r in run.result.rows)


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
    from harness.values.variant import Variant

    target = target_for_family(FAMILIES["gemma2"])
    assert "float16" in target.unsupported_dtypes
    run = run_model(target, Variant.make("float16", "cpu"), work_root=tmp_path)
    assert run.result.error is None, run.result.error
    assert run.result.skipped and "re-checked: vLLM still refuses" in run.result.skipped, run.result.skipped
    assert "float16" in run.result.skipped.split("re-checked", 1)[1]


@pytest.fixture(scope="module")
def emulated_avx2_reports(tmp_path_factory):
    """Both real checkpoints' bf16 reports on the emulated AVX2 path, from one child process (one start-up
    and one warm engine server for both: harness.engines.warm), or the skip reason on a machine whose
    native path is AVX2.  The CLI keeps each model's result apart, so one model's crash is its own report."""
    import os
    import subprocess
    import sys

    from harness.kernel_path import cpu_kernel_path, emulated_env

    if not cpu_kernel_path()["cpu_avx512"]:
        pytest.skip("this CPU has no AVX-512: its native kernel path is AVX2, which "
                    "test_real_checkpoint_bf16_gates_nearly_every_hook_with_no_false_alarm runs")
    out = tmp_path_factory.mktemp("emulated-avx2")
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "--model", ",".join(REAL), "--dtype", "bfloat16",
                           "--report-dir", str(out)], env={**os.environ, **emulated_env("avx2")},
                          capture_output=True, text=True, timeout=3600)
    return out, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("family", REAL)
def test_real_checkpoint_bf16_passes_on_the_emulated_avx2_path(family, emulated_avx2_reports):
    """The gate must hold on every valid kernel path, not only the machine's own: an AVX-512 machine
    runs the AVX2 path too (harness.kernel_path: ATen, oneDNN and MKL capped at AVX2, vLLM's
    ``_C_AVX2`` library and AVX2 attention), engine and references both, in a child process started
    with that environment.  On an AVX2-only machine the native run above is that path."""
    import json

    out, tail = emulated_avx2_reports
    reports = list((out / family).glob("report*.json"))
    assert reports, tail
    result = json.loads(reports[0].read_text())
    assert result.get("error") is None, result["error"]
    assert result["kernel_path"] == "avx2-emulated", result["kernel_path"]
    assert result["device_info"]["reference_kernel_path"]["aten_capability"] == "AVX2"
    failures = [r["message"] for r in result["rows"] if r["status"] in ("fail", "error") and not r["known_issue"]]
    assert not failures, failures[:5]
    s = result["summary"]  # the verdict the run stored in its report
    assert s["hooks_gated"] >= 0.95 * s["hooks_compared"], f"gated {s['hooks_gated']} of {s['hooks_compared']}"
