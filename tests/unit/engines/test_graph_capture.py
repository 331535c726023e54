"""Graph-safe capture (harness.engines.graph_capture): the graph itself writes every read into static
buffers that the worker drains after each forward, so full CUDA graphs (vLLM's default
``FULL_AND_PIECEWISE``) record decode steps too.

On the toy model of tests/unit/engines/test_vllm_worker.py (in-place add-norm and rotary kernels, one rotary
module shared by every layer), with its top module left uncompiled as vLLM's is:

* CPU: the graph path under ``torch.compile`` (``aot_eager``: bitwise; inductor) records what the
  sink path records, per forward of each token count (the shape table), for shared modules too.
* CUDA (skipped, naming it, without a GPU): a whole forward captured in one CUDA graph and replayed
  on new inputs -- the stale-capture check: the records after each replay are that replay's values
  (bitwise the eager reads of the new input) and differ from the captured input's; the sink path,
  in the same graph, records nothing on a replay (the bug this path removes).
"""
from __future__ import annotations

import types

import pytest
import torch

from harness.engines import graph_capture
from harness.engines.vllm_worker import CaptureExtension
from test_vllm_worker import READS, Toy, _reference  # this folder is on sys.path under pytest

CUDA = torch.cuda.is_available()
READS_IN = [[f"inner.{m}", r] for m, r in READS]


class Outer(torch.nn.Module):
    """vLLM's shape: the top module (the timers' hooks) stays Python, the inner model is compiled."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner
        self._run = [inner]  # a plain list: the compiled callable is no submodule

    def compile_inner(self, backend: str) -> None:
        torch._dynamo.reset()
        self._run = [torch.compile(self.inner, fullgraph=True, backend=backend)]

    def forward(self, x):
        return self._run[0](x)


def _ext(model, reads, path: str, monkeypatch, cls=CaptureExtension):
    monkeypatch.setenv(graph_capture.ENV, path)
    monkeypatch.setenv(graph_capture.ROWS_ENV, "16")
    ext = cls()
    ext.model_runner = types.SimpleNamespace(model=model)
    assert ext.vp_install(reads) == []
    assert (ext._vp_graph is not None) == (path == "graph")
    return ext


def _records(ext):
    return {k: [t.clone() for t in v] for k, v in ext._vp_records.items()}


def _run(model, xs):
    with torch.inference_mode():
        for x in xs:
            model(x)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_graph_path_records_what_the_sink_path_records_per_token_count(backend, monkeypatch):
    """Forwards of 5, 3 and 5 tokens: each drain reads its own shapes (the table is per token
    count), shared-module calls go to their layers, in-place kernels run after the copy."""
    torch.manual_seed(0)
    xs = [torch.randn(5, 4), torch.randn(3, 4), torch.randn(5, 4)]
    got = {}
    for path in ("sink", "graph"):
        torch.manual_seed(1)
        model = Outer(Toy())
        ext = _ext(model, READS_IN, path, monkeypatch)
        model.compile_inner(backend)
        _run(model, xs)
        got[path] = _records(ext)
        if path == "graph":
            assert ext._vp_graph.table.keys() == {5, 3}
            assert ext._vp_graph.counts.sum().item() == 0  # drained
            assert len(ext._vp_forward_s) == 3
    assert got["graph"].keys() == got["sink"].keys()
    for key, records in got["sink"].items():
        assert [r.shape[0] for r in got["graph"][key]] == [5, 3, 5], key
        for a, b in zip(got["graph"][key], records):
            if backend == "aot_eager":
                assert torch.equal(a, b), key  # the same copy / add as the sink
            else:
                assert torch.allclose(a, b, rtol=1e-6, atol=1e-6), key


def test_graph_path_matches_the_reads_taken_by_hand(monkeypatch):
    torch.manual_seed(0)
    model, x = Outer(Toy()), torch.randn(5, 4)
    want = _reference(model.inner, x)
    ext = _ext(model, READS_IN, "graph", monkeypatch)
    model.compile_inner("aot_eager")
    _run(model, [x])
    got = _records(ext)
    assert {k.removeprefix("inner.") for k in got} == set(want)
    for key, records in got.items():
        assert len(records) == 1 and torch.equal(records[0], want[key.removeprefix("inner.")][0]), key


class Split(Outer):
    """A module the compiled graph does not hold, called eagerly *inside* the forward (as vLLM runs a
    module inside a splitting op between piecewise graphs: Mamba-1's mixer), and a head called after
    the forward returns (as vLLM's logits processor is)."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__(inner)
        self.mid = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.mid(self._run[0](x))


def test_a_python_hook_inside_the_forward_goes_through_the_buffers_and_one_after_it_to_the_sink(monkeypatch):
    """Inside a forward (begin .. drain) an eager hook takes the graph op's body: it is counted, its
    shape enters the table of this token count, and the drain hands over its rows, so a later replay
    of the same token count (whose full graph recorded that body at capture) counts it the same way.
    After the forward (the head) the eager sink records it directly.  Both equal the sink path's."""
    torch.manual_seed(0)
    xs = [torch.randn(5, 4), torch.randn(3, 4), torch.randn(5, 4)]
    reads = READS_IN + [["mid", "out"], ["head", "out"]]
    got = {}
    for path in ("sink", "graph"):
        torch.manual_seed(1)
        model = Split(Toy())
        ext = _ext(model, reads, path, monkeypatch)
        model.compile_inner("aot_eager")
        with torch.inference_mode():
            for x in xs:
                model.head(model(x))
        got[path] = _records(ext)
        if path == "graph":
            graph = ext._vp_graph
            mid_slot = next(i for i, plan in enumerate(ext._vp_plans) if plan[0][0] == ("mid|out",))
            head_slot = next(i for i, plan in enumerate(ext._vp_plans) if plan[0][0] == ("head|out",))
            assert (mid_slot, 0) in graph.table[5] and (mid_slot, 0) in graph.table[3]
            assert all((head_slot, 0) not in entries for entries in graph.table.values())
            assert not graph.open and graph.counts.sum().item() == 0
    assert got["graph"].keys() == got["sink"].keys()
    for key, records in got["sink"].items():
        assert [r.shape[0] for r in got["graph"][key]] == [5, 3, 5], key
        assert all(torch.equal(a, b) for a, b in zip(got["graph"][key], records)), key


def test_a_forward_larger_than_the_buffers_raises_while_capture_is_on(monkeypatch):
    torch.manual_seed(0)
    model = Outer(Toy())
    ext = _ext(model, READS_IN, "graph", monkeypatch)  # 16 rows
    model.compile_inner("aot_eager")
    ext.vp_set_enabled(False)
    _run(model, [torch.randn(20, 4)])  # boot-like forward, capture off: writes nothing, no error
    assert ext._vp_records == {}
    ext.vp_set_enabled(True)
    with pytest.raises(RuntimeError, match="larger than the buffers' 16 rows"):
        _run(model, [torch.randn(20, 4)])


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device: CUDA graph capture and replay (torch.cuda.CUDAGraph)")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_stale_capture_a_replay_records_its_own_inputs(backend, monkeypatch):
    """One CUDA graph holds the whole forward (vLLM's full graph for decode steps): the top module's
    hooks run at capture only.  Replays on new inputs must record the new values."""
    torch.manual_seed(0)
    out = {}
    for path in ("graph", "sink"):
        torch.manual_seed(1)
        model = Outer(Toy()).cuda()
        ext = _ext(model, READS_IN, path, monkeypatch)
        monkeypatch.setattr("harness.engines.vllm_worker._CUDA", True)
        model.compile_inner(backend)
        static = torch.randn(8, 4, device="cuda")
        with torch.inference_mode():
            for _ in range(2):  # warm up (compile) outside the capture
                model(static)
            ext.vp_reset()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
                model(static)
            torch.cuda.current_stream().wait_stream(stream)
            assert ext._vp_records == {}, "a capture is no forward"
            inputs = [torch.randn(8, 4, device="cuda") for _ in range(3)]
            for x in inputs:
                static.copy_(x)
                if path == "graph":  # what the V1 runner's wrapped _model_forward does around a replay
                    ext._vp_around(lambda _x: graph.replay(), (static,), {}, "v1")
                else:
                    graph.replay()
        out[path] = (_records(ext), inputs, model, ext)
    records, inputs, model, ext = out["graph"]
    assert len(ext._vp_forward_s) == 3 and ext._vp_replays == 3
    for n, x in enumerate(inputs):
        want = _reference(model.inner, x)
        for key, recs in records.items():
            assert len(recs) == 3, key
            ref = want[key.removeprefix("inner.")][0]
            if backend == "aot_eager":
                assert torch.equal(recs[n], ref), (key, n)
            else:
                assert torch.allclose(recs[n], ref, rtol=1e-5, atol=1e-5), (key, n)
            if n:
                assert not torch.equal(recs[n], recs[n - 1]), f"{key}: replay {n} recorded replay {n - 1}'s values"
    assert out["sink"][0] == {}, "the sink path records nothing on a full-graph replay"


def test_forward_calls_are_wrapped_where_each_runner_replays_a_full_graph():
    """V1: ``_model_forward``; V2: ``cudagraph_manager.run_fullgraph``, whose manager exists only after
    the model loads (wrapped on the first ``execute_model``); the replay's rows from the stashed batch."""
    import numpy as np

    from harness.engines.vllm_compat import replay_inputs, track_batch_requests, wrap_forward_calls

    seen = []

    def around(original, args, kwargs, kind):
        seen.append(kind)
        return original(*args, **kwargs)

    class V1:
        def _model_forward(self, input_ids=None, positions=None):
            return "fwd"

    v1 = V1()
    assert wrap_forward_calls(v1, around) == ["_model_forward"]
    assert v1._model_forward(input_ids=torch.zeros(4), positions=torch.arange(4)) == "fwd" and seen == ["v1"]
    assert replay_inputs(v1, "v1", (), {"positions": torch.arange(4)})[0] == 4

    class Manager:
        def run_fullgraph(self, desc):
            return "replayed"

    class V2:
        cudagraph_manager = None  # made by initialize_kv_cache, after load_model

        def prepare_inputs(self, scheduler_output, desc):
            return types.SimpleNamespace(req_ids=["b", "a"], query_start_loc_np=np.array([0, 1, 3]),
                                         positions=torch.tensor([5, 0, 1, 0]), input_ids=torch.tensor([7, 8, 9, 0]))

        def execute_model(self, scheduler_output):
            batch = self.prepare_inputs(scheduler_output, None)
            return self.cudagraph_manager.run_fullgraph(types.SimpleNamespace(num_tokens=4)), batch

    v2 = V2()
    track_batch_requests(v2)
    wrap_forward_calls(v2, around)
    v2.cudagraph_manager = Manager()
    out, _ = v2.execute_model(None)
    assert out == "replayed" and seen == ["v1", "v2"]
    tokens, positions, input_ids, layout = replay_inputs(v2, "v2", (types.SimpleNamespace(num_tokens=4),), {})
    assert tokens == 4 and layout == {"req_ids": ["b", "a"], "query_start_loc": [0, 1, 3]}
    assert positions.tolist() == [5, 0, 1, 0] and input_ids.tolist() == [7, 8, 9, 0]


def test_v2_asks_for_the_whole_vocabulary_by_its_size():
    """vLLM 0.20.2's V2 runner takes ``logprobs=-1`` for NO_LOGPROBS (no sampled-token row)."""
    from harness.engines.vllm_compat import sampling_kwargs

    assert sampling_kwargs(-1)["logprobs"] == -1
    assert sampling_kwargs(-1, 151, "v1")["logprobs"] == -1
    assert sampling_kwargs(-1, 151, "v2") == {**sampling_kwargs(-1), "logprobs": 151}
    assert sampling_kwargs(20, 151, "v2")["logprobs"] == 20


# -- the batched drain (GraphBuffers.drain: one plan per token count, one copy per dtype, records resolved
# when read) against the per-read drain it replaced ------------------------------------------------------
class Cast(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.bfloat16)


class Pick(torch.nn.Module):
    def forward(self, x):
        return x.argmax(-1)


class Mixed(torch.nn.Module):
    """Two toy layers (their rotary module shared: called twice per forward) and reads of three dtypes."""

    def __init__(self):
        super().__init__()
        self.toy = Toy(2)
        self.cast = Cast()
        self.pick = Pick()

    def forward(self, x):
        y = self.toy(x)
        z = self.cast(y)
        return y + z.float() + self.pick(z).unsqueeze(-1).float()


# layer 1's rotary reads only: the shared module's call 0 is unrequested (None in the table), call 1 is layer 1's
READS_MIXED = [[f"inner.toy.{m}", r] for m, r in READS if not m.startswith(("layers.2", "layers.0.rotary_emb"))] + \
              [["inner.cast", "out"], ["inner.pick", "out"]]


def _per_read_drain(graph, tokens, plans, into):
    """The drain before the batched one, as it was: per (slot, call) in order, per read, the buffer's rows
    viewed in the table's shape and copied into a record of its own."""
    import math

    for (slot, i), shapes in sorted(graph.table.get(tokens, {}).items()):
        for r, (keys, _lo, _hi, _read) in enumerate(plans[slot]):
            shape = shapes[r]
            if shape is None:
                continue
            assert shape != "over"
            shape = shape[0]  # (shape, copied by the kernel)
            view = graph.flat[(slot, r, i)][:math.prod(shape)].view(shape)
            into.setdefault(keys[i % len(keys)], []).append(torch.empty_like(view).copy_(view))


def _spy(ext, graph):
    """Run the per-read drain into ``ref`` before each real drain; ``steps``: each drained (T, plan)."""
    ref, steps = {}, []
    real = graph.drain

    def drain(tokens, plans, n, copy=True):
        if n is not None:
            _per_read_drain(graph, tokens if tokens is not None else -1, plans, ref)
        out = real(tokens, plans, n, copy)
        if out is not None:
            steps.append((tokens, out.plan))
        return out
    graph.drain = drain
    return ref, steps


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_batched_drain_records_bitwise_what_the_per_read_drain_recorded(backend, monkeypatch):
    """Several forwards of several token counts, a shared module called twice per forward, reads of three
    dtypes: the batched drain's records are the per-read drain's, bit for bit, key by key, in the same order;
    one plan per token count, built once."""
    torch.manual_seed(0)
    model = Outer(Mixed())
    ext = _ext(model, READS_MIXED, "graph", monkeypatch)
    model.compile_inner(backend)
    graph = ext._vp_graph
    ref, steps = _spy(ext, graph)
    sizes = [5, 3, 5, 7, 3, 5]
    _run(model, [torch.randn(t, 4) for t in sizes])
    assert [t for t, _ in steps] == sizes
    assert len(ext._vp_pending) == len(sizes) and ext._vp_store == {}  # nothing resolved before it is read
    plan5 = {id(p) for t, p in steps if t == 5}
    assert len(plan5) == 1 and set(graph.plans) == {3, 5, 7}  # one plan per T, reused by every drain of T
    assert {p.groups[g][0] for t, p in steps for g in range(len(p.groups))} == {torch.float32, torch.bfloat16,
                                                                               torch.int64}
    got = ext._vp_records
    assert ext._vp_pending == []
    assert list(got) == list(ref)  # the same keys, first recorded in the same order
    for key, records in ref.items():
        assert len(got[key]) == len(sizes), key
        for a, b in zip(got[key], records):
            assert a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous(), key
            assert torch.equal(_bits(a), _bits(b)), key
    assert len(got["inner.toy.layers.1.rotary_emb|out[0]"]) == len(sizes)
    assert "inner.toy.layers.0.rotary_emb|out[0]" not in got  # unrequested call of the shared module


def test_a_count_mismatch_raises_when_the_records_are_read_and_records_nothing(monkeypatch):
    """The drain does not wait for the device: it keeps a snapshot of the counts, and reading the records
    checks every pending step at once; a step whose hooks ran a different number of times than its capture
    recorded raises there, and none of the pending steps becomes a record.  The old order (``wait_first``,
    the benchmark's ``residual-wait``) raises in the drain itself."""
    torch.manual_seed(0)
    model = Outer(Mixed())
    ext = _ext(model, READS_MIXED, "graph", monkeypatch)
    model.compile_inner("aot_eager")
    _run(model, [torch.randn(5, 4), torch.randn(5, 4)])  # the plan of 5 tokens is built and cached
    graph = ext._vp_graph
    before = {k: len(v) for k, v in ext._vp_records.items()}
    expected = graph.plans[5].expected
    bad = ((expected[:1] + [expected[1] + 1] + expected[2:], 5),  # a hook ran once more
           ([0] * len(expected), 5),  # nothing ran (a replay that recorded nothing)
           (expected, 9))  # no capture of 9 tokens
    for counts, tokens in bad:
        graph.begin(5)
        graph.counts.copy_(torch.tensor(expected))
        ext._vp_drain(5)  # a good step before the bad one: dropped with it
        graph.begin(tokens)
        graph.counts.copy_(torch.tensor(counts))
        ext._vp_drain(tokens)  # no host wait: nothing checked yet
        assert graph.counts.sum().item() == 0 and not graph.open and len(ext._vp_pending) == 2
        with pytest.raises(RuntimeError, match=f"pending step 1, forward of {tokens} tokens: hook slots ran"):
            ext._vp_records
        assert ext._vp_pending == []
        assert {k: len(v) for k, v in ext._vp_records.items()} == before
    for counts, tokens in bad:
        graph.begin(tokens)
        graph.counts.copy_(torch.tensor(counts))
        with pytest.raises(RuntimeError, match=f"forward of {tokens} tokens: hook slots ran"):
            graph.drain(tokens, ext._vp_plans, 7, wait_first=True)
        assert graph.counts.sum().item() == 0 and not graph.open
    assert {k: len(v) for k, v in ext._vp_records.items()} == before


def test_records_taken_after_n_steps_are_in_step_order_and_dump_as_the_sink_path(monkeypatch, tmp_path):
    """The records resolved lazily are those of each step in step order (each equal to the reads taken by
    hand on that step's input), dumped under the same keys with the same bits as the sink path's; after a
    reset the next call's steps reuse the record tensors of the same step index."""
    from safetensors.torch import load_file

    torch.manual_seed(0)
    xs = [torch.randn(5, 4), torch.randn(3, 4), torch.randn(5, 4), torch.randn(4, 4)]
    dumps, exts = {}, {}
    for path in ("sink", "graph"):
        torch.manual_seed(1)
        model = Outer(Toy())
        ext = exts[path] = _ext(model, READS_IN, path, monkeypatch)
        model.compile_inner("aot_eager")
        _run(model, xs)
        summary = ext.vp_dump(str(tmp_path / f"{path}.safetensors"))
        assert summary["calls"] == {k: len(xs) for k, _ in summary["calls"].items()}
        dumps[path] = load_file(summary["path"])
    assert dumps["graph"].keys() == dumps["sink"].keys()
    for name, value in dumps["sink"].items():
        assert torch.equal(_bits(dumps["graph"][name]), _bits(value)), name
    ext = exts["graph"]
    inner = ext.model_runner.model.inner

    def by_hand(x):  # the inner module called eagerly, outside a forward: its hooks would record through the sink
        ext.vp_set_enabled(False)
        try:
            return _reference(inner, x)
        finally:
            ext.vp_set_enabled(True)
    records = ext._vp_records
    for n, x in enumerate(xs):
        want = by_hand(x)
        for key, recs in records.items():
            assert len(recs) == len(xs) and torch.equal(recs[n], want[key.removeprefix("inner.")][0]), (key, n)
    first = {k: v[1].data_ptr() for k, v in records.items()}
    ext.vp_reset()
    assert ext._vp_records == {} and ext._vp_steps == 0
    ys = [torch.randn(5, 4), torch.randn(3, 4)]
    _run(ext.model_runner.model, ys)
    again = ext._vp_records
    assert {k: v[1].data_ptr() for k, v in again.items()} == first  # step 1's record tensor, reused
    for n, x in enumerate(ys):
        want = by_hand(x)
        for key, recs in again.items():
            assert len(recs) == 2 and torch.equal(recs[n], want[key.removeprefix("inner.")][0]), (key, n)


TWO_SLOTS = [((("a|out",), 0, 1, "out"),), ((("b|out", "c|out"), 0, 1, "out"),)]  # slot 1: a module shared twice


def buffer_steps(graph):
    """``(plans, forward, drained)`` for tests of GraphBuffers alone, with :data:`TWO_SLOTS`: ``forward(tokens,
    calls, width)`` writes a random read per call (``write`` counts it) and returns them; ``drained(tokens, n)``
    drains step ``n``, checks its counts and returns ``(step, records by key)``."""
    from harness.engines.graph_capture import check_steps
    from harness.engines.reads import sum_terms

    def forward(tokens, calls, width=3):
        graph.begin(tokens)
        vals = []
        for slot in calls:
            x = torch.randn(tokens, width)
            graph.write(slot, TWO_SLOTS[slot], [x], sum_terms)
            vals.append(x)
        return vals

    def drained(tokens, n):
        step = graph.drain(tokens, TWO_SLOTS, n)
        check_steps([step])
        store = {}
        step.plan.resolve(step.flats, store)
        return step, store
    return TWO_SLOTS, forward, drained


def test_drain_plans_follow_the_table_and_the_buffers():
    """GraphBuffers alone: a plan is rebuilt when the table of its token count changes (a new call) or a
    buffer is reallocated (a larger shape before capture); after capture a buffer cannot grow; a forward
    larger than the buffers raises only while recording; capture off drains nothing."""
    from harness.engines.graph_capture import GraphBuffers

    graph = GraphBuffers(2, rows=8, device=torch.device("cpu"))
    plans, forward, drained = buffer_steps(graph)

    a, b = forward(4, [0, 1])
    plan, got = drained(4, 0)
    plan = plan.plan
    assert plan.expected == [1, 1] and torch.equal(got["a|out"][0], a) and torch.equal(got["b|out"][0], b)
    forward(4, [0, 1])
    assert drained(4, 1)[0].plan is plan  # unchanged table: the same plan
    a, b, c = forward(4, [0, 1, 1])  # a second call of slot 1 (the shared module's next path): a new entry
    plan2, got = drained(4, 2)
    plan2 = plan2.plan
    assert plan2 is not plan and plan2.expected == [1, 2]
    assert [torch.equal(got[k][0], v) for k, v in (("a|out", a), ("b|out", b), ("c|out", c))] == [True] * 3
    a, b, c = forward(4, [0, 1, 1], width=10)  # more than the 3 x 8 elements allocated: the buffers grow
    plan3, got = drained(4, 0)
    assert plan3.plan is not plan2 and got["a|out"][0].shape == (4, 10) and torch.equal(got["c|out"][0], c)
    graph.captured = True
    with pytest.raises(RuntimeError, match="cannot grow"):
        forward(4, [0], width=30)  # 120 elements, the buffer holds 10 x 8
    graph.captured = False
    forward(9, [0])  # 9 tokens > 8 rows: nothing written, the table says "over"
    assert graph.drain(9, plans, None) is None  # capture off: no error
    forward(9, [0])
    with pytest.raises(RuntimeError, match="larger than the buffers' 8 rows"):
        graph.drain(9, plans, 0)
