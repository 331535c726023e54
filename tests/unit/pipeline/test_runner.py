"""The run's engine request's encoder inputs (harness.values.engine_request) and the serving shapes an encoder declares not applicable,
engine-free: a causal LM's subject and reference calls get no extra argument (unchanged); an encoder's get
its pooling task, token types, HF class and bidirectional attention; ``--serving decode`` on the encoder is
skipped with the declared reason by run_model itself, before any engine boots."""
from __future__ import annotations

import pytest

from harness.models.families import FAMILIES
from harness.pipeline.runner import not_applicable, run_model
from harness.values.engine_request import Pooling, run_request
from harness.values.plan import ReferenceInputs, build_plan
from harness.values.variant import Variant


def _target(family):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[family])


def test_a_causal_lm_gets_no_encoder_arguments():
    t = _target("qwen3")
    plan = build_plan(t, Variant.make("float32", "cpu"))
    assert run_request(t, Variant.make("float32", "cpu"), plan, [[4, 5]]).pooling is None
    assert plan.reference_inputs([[4, 5]]) == ReferenceInputs()
    assert not_applicable(t, Variant.make("float32", "cpu", serving="decode")) is None


def test_an_encoder_gets_its_task_types_class_and_no_mask():
    t = _target("bert")
    plan = build_plan(t, Variant.make("float32", "cpu"))
    request = run_request(t, Variant.make("float32", "cpu"), plan, [[4, 5, 6, 7]])
    assert request.pooling == Pooling(task="token_classify", token_types=((0, 0, 1, 1),))
    inputs = plan.reference_inputs([[4, 5]])
    assert inputs == ReferenceInputs(hf_class="AutoModelForMaskedLM", causal=False, token_types=((0, 1),))
    assert inputs.types(0) == [0, 1]


@pytest.mark.parametrize("serving", ["prefix-cache", "chunked", "decode", "preempt"])
def test_serving_shapes_an_encoder_lacks_are_skipped_with_the_reason(serving, tmp_path):
    t = _target("bert")
    variant = Variant.make("float32", "cpu", serving=serving)
    assert not_applicable(t, Variant.make("float32", "cpu")) is None
    run = run_model(t, variant, work_root=tmp_path)  # no engine: the declaration decides
    assert run.result.skipped.startswith(f"--serving {serving} does not apply to bert: ")
    assert run.result.error is None and not run.result.rows and run.result.summary["verdict"] == "skipped"
