"""A declared known vLLM bug through run_model and ``python -m harness run``, engine-free: the engines are
replaced by rows made from glm4_moe's real fp16 plan (its real declaration and forward order), passing
up to a chosen hook and failing from it on.

Contracts checked: where the declaration applies and its signature holds, the result stores the check,
the verdict is fail and named, the report and the matrix say "known vLLM bug", and the command exits 0;
a fault at another hook is a plain failure and exits 1, the report calling the declaration stale; a run
whose rows all pass is an error and exits 1; a variant the declaration does not cover (bfloat16) is not
checked at all.
"""
from __future__ import annotations

import json

import pytest

from harness.models.families import FAMILIES
from harness.values.results import HookResult
from harness.values.variant import Variant


def _fake_engines(first_failing: str | None, rel_err: float):
    """A stand-in for harness.pipeline.runner._run_engines: the plan's rows, failing from ``first_failing`` on
    (None: every row passes)."""
    from harness.values.plan import build_plan

    def run_engines(run, variant, work_root, hooks, engine_env, phases, settings=None):
        run.plan = plan = build_plan(run.target, variant, hooks)
        order = plan.forward_order + ["logprobs", "argmax"]
        start = len(order) if first_failing is None else order.index(first_failing)
        rows = []
        for case in plan.cases:
            bad = "~" not in case.reference and order.index(case.hook) >= start
            rel = (rel_err if case.hook == first_failing else 0.7) if bad else 1e-6
            rows.append(HookResult(run.target.name, case.reference, case.hook, case.reference_hook, None, case.kind,
                                   "fail" if bad else "pass", 1e-2, rel_err=rel, margin=rel / 1e-2,
                                   message=f"{case.hook} vs {case.reference}: rel err {rel}"))
        run.result.rows = rows
    return run_engines


@pytest.fixture
def engine_free(monkeypatch):
    import harness.engines.warm
    import harness.pipeline.runner as runner

    monkeypatch.setattr(harness.engines.warm, "prestart", lambda *a, **k: None)
    monkeypatch.setattr(runner, "freeze_before_runs", lambda: None)

    def use(first_failing: str | None, rel_err: float = 0.6006):
        monkeypatch.setattr(runner, "_run_engines", _fake_engines(first_failing, rel_err))
    return use


def _target():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["glm4_moe"])


def test_the_declared_bug_holds_and_the_run_is_a_named_fail(engine_free, tmp_path):
    from harness.comparison.verdict import fails_run
    from harness.pipeline.runner import run_model

    engine_free("blocks.1.mlp.hook_out")
    result = run_model(_target(), Variant.make("float16", "cpu"), work_root=tmp_path).result
    assert result.known_vllm_bug["holds"] and result.known_vllm_bug["hook"] == "blocks.1.mlp.hook_out"
    s = result.summary
    assert s["verdict"] == "fail" and s["known_vllm_bug"] == FAMILIES["glm4_moe"].known_vllm_bug.name
    assert not fails_run(s)


def test_a_variant_the_declaration_does_not_cover_is_not_checked(engine_free, tmp_path):
    from harness.pipeline.runner import run_model

    engine_free("blocks.1.mlp.hook_out")
    result = run_model(_target(), Variant.make("bfloat16", "cpu"), work_root=tmp_path).result
    assert result.known_vllm_bug is None and result.summary["known_vllm_bug"] is None
    assert result.summary["verdict"] == "fail"


def _cli(tmp_path, capsys) -> tuple[int, str, dict, str]:
    from harness.frontends.cli import main

    status = main(["run", "--model", "glm4_moe", "--dtype", "float16", "--report-dir", str(tmp_path)])
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "glm4_moe" / "report-cpu-float16.json").read_text())
    md = (tmp_path / "glm4_moe" / "report-cpu-float16.md").read_text()
    return status, out, report, md


def test_the_command_exits_0_on_the_known_bug_and_names_it(engine_free, tmp_path, capsys):
    engine_free("blocks.1.mlp.hook_out")
    status, out, report, md = _cli(tmp_path, capsys)
    assert status == 0, out
    assert "known vLLM bug 'fp16 MoE output scaled by 1/routed_scaling_factor'" in out and "signature held" in out
    assert "not a failure of this command" in out
    assert report["summary"]["verdict"] == "fail" and report["known_vllm_bug"]["holds"]
    assert "**Known vLLM bug**" in md and "— **known vLLM bug**" in md
    matrix = (tmp_path / "support_matrix.md").read_text()
    assert "❌ fail — known vLLM bug: fp16 MoE output scaled by 1/routed_scaling_factor" in matrix
    assert "fail (known vLLM bug)</td>" in (tmp_path / "support_matrix.html").read_text()


def test_a_fault_elsewhere_is_a_plain_failure_exit_1_and_the_declaration_is_stale(engine_free, tmp_path, capsys):
    engine_free("blocks.1.attn.hook_out", rel_err=0.6006)
    status, out, report, md = _cli(tmp_path, capsys)
    assert status == 1, out
    s = report["summary"]
    assert s["verdict"] == "fail" and s["known_vllm_bug"] is None and not report["known_vllm_bug"]["holds"]
    assert "stale declaration: declared known vLLM bug" in out and "blocks.1.attn.hook_out" in out
    assert "**Stale declaration**" in md and "— **known vLLM bug**" not in md
    assert "stale: declared known vLLM bug" in (tmp_path / "support_matrix.md").read_text()


def test_a_run_the_bug_no_longer_shows_in_is_an_error_and_exits_1(engine_free, tmp_path, capsys):
    engine_free(None)  # vLLM fixed it: every row passes
    status, out, report, _ = _cli(tmp_path, capsys)
    assert status == 1 and not report["known_vllm_bug"]["holds"], out
    assert report["summary"]["verdict"] == "error" and "vLLM may have fixed it" in report["summary"]["stale_vllm_bug"]
    assert "💥 error — stale: declared known vLLM bug" in (tmp_path / "support_matrix.md").read_text()


def _path_target():
    """glm4_moe's checkpoint as a --model-path target: no declaration, its architecture's bugs as candidates."""
    from dataclasses import replace

    from harness.models.families import known_bugs_of_architecture

    target = _target()
    return replace(target, source="path", known_vllm_bug=None,
                   candidate_vllm_bugs=known_bugs_of_architecture(target.architecture))


def test_a_model_path_run_is_named_by_its_architectures_bug_where_it_shows_at_another_layer(engine_free, tmp_path):
    from harness.comparison.verdict import fails_run
    from harness.pipeline.runner import run_model

    target = _path_target()
    assert [b.first_failing for b in target.candidate_vllm_bugs] == [("blocks.{i}.mlp.hook_out",)]
    engine_free("blocks.2.mlp.hook_out", rel_err=0.3)  # another layer, another factor: no rel-err range
    result = run_model(target, Variant.make("float16", "cpu"), work_root=tmp_path).result
    assert result.known_vllm_bug["holds"] and result.known_vllm_bug["inferred_from"] == "glm4_moe"
    assert result.summary["verdict"] == "fail" and not fails_run(result.summary)
    from harness.reporting.markdown import to_markdown

    assert "declared on the family row `glm4_moe`" in to_markdown(result.to_dict())


def test_a_model_path_run_failing_elsewhere_is_a_plain_failure_naming_the_candidate_tried(engine_free, tmp_path):
    from harness.comparison.verdict import fails_run
    from harness.pipeline.runner import run_model

    engine_free("blocks.1.attn.hook_out")
    result = run_model(_path_target(), Variant.make("float16", "cpu"), work_root=tmp_path).result
    assert result.known_vllm_bug is None and fails_run(result.summary)
    assert [c["inferred_from"] for c in result.candidate_vllm_bugs] == ["glm4_moe"]
    assert "not blocks.{i}.mlp.hook_out" in result.candidate_vllm_bugs[0]["why"]
    assert result.summary["stale_vllm_bug"] is None  # a candidate that does not show is no stale declaration


def test_a_passing_model_path_run_checks_no_candidate(engine_free, tmp_path):
    from harness.pipeline.runner import run_model

    engine_free(None)
    result = run_model(_path_target(), Variant.make("float16", "cpu"), work_root=tmp_path).result
    assert result.summary["verdict"] == "pass" and result.candidate_vllm_bugs == []
