"""A pytest session keeps only the captures a later test reads (ParitySession.capture_readers).

The engines are replaced by a stand-in run whose captures are real spilled shards: what is under
test is the session's bookkeeping, not a parity claim."""
from __future__ import annotations

import pytest
import torch

from harness.frontends import pytest_plugin
from harness.spill import ReleasedError, SpilledTensors
from harness.values.results import ModelRun
from harness.values.variant import Variant


def _session(tmp_path, readers):
    session = object.__new__(pytest_plugin.ParitySession)
    session.variant, session.runs, session.selected = Variant.make("float32", "cpu"), {}, {}
    session.report_dir, session.settings, session.capture_readers = tmp_path / "reports", None, set(readers)
    session.target = lambda name: name
    return session


@pytest.fixture
def stand_in_engines(tmp_path, monkeypatch):
    made: dict[str, SpilledTensors] = {}
    shared = SpilledTensors(tmp_path / "references")  # one reference side every run shares (the runner's memo)
    shared.add({"r": torch.zeros(2)})
    made["references"] = shared

    def run_model(target, variant, hooks=None, settings=None):
        spill = SpilledTensors(tmp_path / f"spill-{target}-{variant.dtype}")
        spill.add({"x": torch.ones(3)})
        made[f"{target}-{variant.dtype}"] = spill
        return ModelRun(target, result=type("R", (), {"to_dict": lambda self: {}})(), subject=spill, refs=shared)

    monkeypatch.setattr("harness.pipeline.runner.run_model", run_model)
    monkeypatch.setattr("harness.reporting.report.write_report", lambda result, report_dir: None)
    return made


def test_a_run_no_test_reads_goes_once_its_report_is_written(tmp_path, stand_in_engines):
    session = _session(tmp_path, readers={("qwen3", "float32", False)})
    kept, gone = session.run("qwen3"), session.run("llama")
    assert torch.equal(kept.subject["x"], torch.ones(3))
    assert not (tmp_path / "spill-llama-float32").exists()
    with pytest.raises(ReleasedError, match="reads_captures"):
        gone.subject.get("x")
    assert session.run("llama") is gone  # the run itself (its rows, its report) stays the session's
    # the references another run may share are dropped from the run, never deleted under the other
    assert gone.refs is None and kept.refs is stand_in_engines["references"]
    assert torch.equal(stand_in_engines["references"]["r"], torch.zeros(2))


def test_a_reader_of_another_dtype_keeps_nothing_of_this_one(tmp_path, stand_in_engines):
    session = _session(tmp_path, readers={("qwen3", "bfloat16", False)})
    session.run("qwen3")
    assert not (tmp_path / "spill-qwen3-float32").exists()
