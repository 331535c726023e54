"""The graph path's cost taken apart (harness.engines.graph_anatomy) through the benchmark extension's
public entry points (harness.engines.bench_probes), as benchmarks/bench_capture_graphs.py drives them on a
GPU: here on the toy model of tests/unit/engines/test_vllm_worker.py, compiled, with the graph path forced
(no CUDA graph: the buffers, table and drain are the same code)."""
from __future__ import annotations

import torch

from harness.engines.bench_probes import BenchCaptureExtension
from test_graph_capture import READS_IN, Outer, _ext  # this folder is on sys.path under pytest
from test_vllm_worker import Toy


def _forward(monkeypatch, tokens: int = 5):
    torch.manual_seed(0)
    model = Outer(Toy())
    ext = _ext(model, READS_IN, "graph", monkeypatch, BenchCaptureExtension)
    model.compile_inner("aot_eager")
    with torch.inference_mode():
        model(torch.randn(tokens, 4))
    return ext


def test_forward_times_and_record_stats_are_taken_once(monkeypatch):
    ext = _forward(monkeypatch)
    assert len(ext.vp_take_forward_times()) == 1 and ext.vp_take_forward_times() == []
    stats = ext.vp_take_record_stats()
    assert stats["hooks"] == len(ext._vp_plans)  # one hook per hooked (module, side), timers not counted
    (n0, b0), (n1, b1) = stats["forwards"]
    assert n0 == len(READS_IN) and b0 > 0 and (n1, b1) == (0, 0)  # one forward: record 0 of every read
    assert ext._vp_records == {} and ext.vp_take_record_stats()["forwards"] == [[0, 0], [0, 0]]  # reset


def test_copy_alone_and_drain_anatomy_measure_the_forward_in_the_table(monkeypatch):
    ext = _forward(monkeypatch)
    copy = ext.vp_graph_copy_alone(5, 0, reps=2)
    assert copy["pairs"] == len(READS_IN) and copy["twins"] == 0 and copy["s"] > 0 and copy["bytes"] > 0
    assert ext.vp_graph_copy_alone(7, 0)["s"] is None  # no forward of 7 tokens was captured
    anatomy = ext.vp_graph_drain_anatomy(5, reps=2)
    assert set(anatomy) == {"drain", "records_per_key", "bookkeeping", "counts", "layout", "resolve"}
    assert anatomy["records_per_key"] == 1  # the drain repeated on step 0, not appended
    assert all(anatomy[k] > 0 for k in ("drain", "bookkeeping", "counts", "resolve"))
    assert ext._vp_records == {} and ext._vp_graph.counts.sum().item() == 0
    assert ext.vp_graph_drain_anatomy(7) == {}


def test_a_bare_engine_reports_no_capture_path():
    ext = BenchCaptureExtension()  # nothing installed (the benchmark's `none` engine)
    assert ext.vp_take_forward_times() == [] and ext.vp_take_record_stats() == {"hooks": 0, "forwards": [[0, 0], [0, 0]]}
    assert ext.vp_graph_copy_alone(5, 0)["s"] is None and ext.vp_graph_drain_anatomy(5) == {}
