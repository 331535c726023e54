"""Capture changes nothing: the same vLLM engine configuration gives the
same greedy tokens and bitwise-identical log-probs with every read of the family's plan hooked
as with no capture hook at all.

"On": the parity session's own run of that family and variant (``parity_session.run``: the
family's full plan, every read and parameter, through ``runner.capture_subject``), so the engine
checked here is the very one whose captures the parity rows compare, booted once per session.
"Off": the same call with :func:`harness.pipeline.invariance.capture_off_plan` -- ``reads=[]``,
``params=[]``, so the subject installs no capture hook (only the model-level forward timers
every subject run has; they touch no tensor).  Same prompts (``runner.prompts_for``), dtype,
mode, and the ragged-batch run as the harness runs it (``ragged=True``) on both sides.
Compared: ``SubjectCapture.logprobs`` (NaN pattern equal, every value bitwise) and each prompt's
greedy token, by :func:`harness.pipeline.invariance.compare_logprobs`.

That the check can fail: unit tests on small tensors (one ulp, a NaN pattern, a missing prompt:
tests/unit/pipeline/test_invariance.py), and a parity test that plants a one-part-in-a-million weight change through the engine-fault
mechanism (harness.engines.engine_faults) on the capture-on side only and requires it reported.
Only the "off" engines and the planted one boot here.
"""
from __future__ import annotations

import shutil
import time

import pytest

from harness.pipeline.invariance import compare_logprobs

pytestmark = pytest.mark.parity


# -- real engines: capture on vs off -----------------------------------------------
CASES = [
    pytest.param("qwen3", "float32", False, id="qwen3-float32-eager"),
    pytest.param("llama", "float32", False, id="llama-float32-eager"),
    pytest.param("gemma", "float32", False, id="gemma-float32-eager"),
    pytest.param("mixtral", "float32", False, id="mixtral-float32-eager"),
    pytest.param("qwen3", "float32", True, id="qwen3-float32-compiled", marks=pytest.mark.slow),
    # bf16 measured bitwise too; the reference's own floor would be a looser bound, but anything
    # looser than bitwise would hide a one-ulp perturbation.
    pytest.param("qwen3", "bfloat16", False, id="qwen3-bfloat16-eager"),
]


# the capture-on side is the suite's own run's subject (_capture): kept past its report
pytestmark = [pytestmark, pytest.mark.reads_captures(*[tuple(p.values) for p in CASES])]


@pytest.fixture(scope="module")
def engines():
    """(family, dtype, compiled, side, fault) -> (SubjectCapture, seconds): each boot once per module."""
    return {}


def _capture(engines, tmp_path_factory, family: str, dtype: str, compiled: bool, on: bool, fault=None,
             parity_session=None):
    key = (family, dtype, compiled, on, fault)
    if key not in engines and on and fault is None and parity_session is not None:
        run = parity_session.run(family, dtype=dtype, compiled=compiled)  # the suite's own run, reused
        assert run.result.error is None, run.result.error
        engines[key] = (run.subject, run.result.timings["phases"].get("subject", 0.0))
    if key not in engines:
        from harness.models.families import FAMILIES
        from harness.models.targets import target_for_family
        from harness.pipeline.invariance import capture_off_plan
        from harness.values.plan import build_plan
        from harness.pipeline.runner import capture_subject, prompts_for
        from harness.values.variant import Variant

        target = target_for_family(FAMILIES[family])
        variant = Variant.make(dtype, "cpu", compiled=compiled)
        plan = build_plan(target, variant)
        if not on:
            plan = capture_off_plan(plan)
        prompts = list(prompts_for(target).values())
        work = tmp_path_factory.mktemp(f"{family}-{dtype}-{'compiled' if compiled else 'eager'}-"
                                       f"{'on' if on else 'off'}{'-fault' if fault else ''}")
        t0 = time.perf_counter()
        cap = capture_subject(target, variant, plan, prompts, work, engine_env=fault.env() if fault else None)
        engines[key] = (cap, time.perf_counter() - t0)
        shutil.rmtree(work, ignore_errors=True)
    return engines[key]


@pytest.mark.parametrize("family,dtype,compiled", CASES)
def test_capture_on_and_off_give_bitwise_identical_log_probs(engines, tmp_path_factory, parity_session, family, dtype,
                                                              compiled):
    on, t_on = _capture(engines, tmp_path_factory, family, dtype, compiled, on=True, parity_session=parity_session)
    off, t_off = _capture(engines, tmp_path_factory, family, dtype, compiled, on=False)
    n_reads = len({k.split(":", 1)[1].rsplit("#", 1)[0] for k in on.raw})
    assert n_reads > 0 and not off.raw, f"on captured {n_reads} reads, off {len(off.raw)} raw tensors"
    assert on.meta.get("ragged_batches") and off.meta.get("ragged_batches"), "the ragged run must run on both sides"
    assert not on.meta.get("missing_modules"), on.meta.get("missing_modules")
    r = compare_logprobs(on.logprobs, off.logprobs)
    print(f"{family} {dtype} {'compiled' if compiled else 'eager'}: {r.describe()}; {n_reads} reads on; "
          f"subject runs {t_on:.1f} s (on) / {t_off:.1f} s (off), boots {on.meta.get('boot_s', 0):.1f} / "
          f"{off.meta.get('boot_s', 0):.1f} s")
    assert r.n_compared > 0
    assert r.identical, f"capture changed the engine's output: {r.describe()}"


def test_a_planted_engine_change_on_one_side_is_reported(engines, tmp_path_factory):
    """The bitwise check sees a change far below any tolerance: one layer's down projection scaled
    by 1 + 1e-6 in the capture-on engine only (the capture-off engine is the parity test's)."""
    from harness.engines.engine_faults import EngineFault

    fault = EngineFault.scale("model.layers.1.mlp.down_proj.weight", 1e-6)
    on, _ = _capture(engines, tmp_path_factory, "qwen3", "float32", False, on=True, fault=fault)
    off, _ = _capture(engines, tmp_path_factory, "qwen3", "float32", False, on=False)
    r = compare_logprobs(on.logprobs, off.logprobs)
    print(f"planted {fault.describe()}: {r.describe()}")
    assert not r.identical and r.n_differing > 0 and r.first_difference.startswith("prompt ")
    assert 0 < r.max_abs_diff < 1e-3  # far inside any log-prob tolerance: only bitwise sees it
