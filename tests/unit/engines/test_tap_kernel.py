"""The graph path's copy kernel (harness.engines.tap_kernel) and the direct steps it allows
(harness.engines.graph_capture.GraphBuffers.prepare): a recorded forward whose plan is known has the
kernel write its reads straight into the step's record tensors, so its drain copies nothing.

The Triton kernel runs only on CUDA (those tests skip without a GPU, naming it).  On the CPU,
:class:`FakeKernel` stands in for it: it writes, with torch, where the destination table points among the
graph's own tensors (static buffers, record pool) and fails on any other address -- so the table, the
direct steps and their drain are tested here, against the same run without the kernel, bit for bit.
"""
from __future__ import annotations

import pytest
import torch

from harness.engines import tap_kernel
from harness.engines.graph_capture import GraphBuffers
from harness.engines.reads import sum_terms
from test_graph_capture import (READS_IN, READS_MIXED, Mixed, Outer, _bits, _ext, _records, _run,  # noqa: E402
                                buffer_steps)
from test_vllm_worker import Toy

CUDA = torch.cuda.is_available()


class FakeKernel:
    """tap_kernel.launch with torch: the read's rows, row-major, at the address ``dests[entry]`` holds."""

    def __init__(self) -> None:
        self.graph: GraphBuffers | None = None
        self.launches = 0

    def __call__(self, dests, entry, counts, slot, tensors, rows, cols, strides) -> None:
        addr = int(dests[entry])
        value = sum_terms(tensors, "fake").reshape(-1)
        for t in list(self.graph.flat.values()) + list(self.graph.pool.values()):
            base, size = t.data_ptr(), t.numel() * t.element_size()
            if base <= addr < base + size:
                assert t.dtype == value.dtype
                off = (addr - base) // t.element_size()
                assert off + value.numel() <= t.numel(), "the kernel would write past its tensor"
                t.view(-1)[off:off + value.numel()].copy_(value)
                break
        else:
            raise AssertionError(f"address {addr:#x} is none of the graph's tensors")
        if slot >= 0:
            counts[slot] += 1
        self.launches += 1


def test_kernel_terms_take_row_strided_reads_of_one_shape_and_dtype():
    x = torch.randn(5, 4)
    assert tap_kernel.kernel_terms([x])[1:] == (5, 4, [4])
    assert tap_kernel.kernel_terms([x[:, 1:3]])[1:] == (5, 2, [4])  # a column slice: rows strided
    assert tap_kernel.kernel_terms([None, x])[1:] == (5, 4, [4])  # None counts as zero
    assert tap_kernel.kernel_terms([x.t()]) is None  # columns not contiguous
    assert tap_kernel.kernel_terms([torch.randn(5, 2, 3)])[1:] == (5, 6, [6])
    assert tap_kernel.kernel_terms([torch.randn(5, 3, 2).transpose(1, 2)]) is None
    assert tap_kernel.kernel_terms([torch.tensor(3.0)])[1:] == (1, 1, [0])
    assert tap_kernel.kernel_terms([x, x])[1:] == (5, 4, [4, 4])
    assert tap_kernel.kernel_terms([x, x, x]) is None  # three terms: torch's left-to-right sum
    assert tap_kernel.kernel_terms([x, x.double()]) is None  # promotion: torch's rules
    assert tap_kernel.kernel_terms([x, x[:1]]) is None  # broadcasting
    ints = torch.arange(10).view(5, 2)
    assert tap_kernel.kernel_terms([ints])[1:] == (5, 2, [2])
    assert tap_kernel.kernel_terms([ints, ints]) is None  # sums in float only
    assert tap_kernel.kernel_terms([x.double(), x.double()]) is None
    assert tap_kernel.kernel_terms([x > 0]) is None
    assert tap_kernel.kernel_terms([torch.empty(0, 4)]) is None


def test_the_kernel_is_off_without_cuda_or_when_asked(monkeypatch):
    cuda = torch.device("cuda")
    assert tap_kernel.launcher(torch.device("cpu")) is None
    monkeypatch.setenv(tap_kernel.ENV, "0")
    assert tap_kernel.launcher(cuda) is None
    monkeypatch.delenv(tap_kernel.ENV)
    assert (tap_kernel.launcher(cuda) is not None) == CUDA


def _with_kernel(monkeypatch, model, reads, kernel: FakeKernel | None):
    monkeypatch.setattr(tap_kernel, "launcher", lambda device: kernel)
    ext = _ext(model, reads, "graph", monkeypatch)
    if kernel is not None:
        kernel.graph = ext._vp_graph
    return ext


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_direct_steps_record_bitwise_what_the_buffers_record(backend, monkeypatch):
    """Forwards of several token counts, a shared module, reads of three dtypes (one of them summed):
    with the kernel (each token count's first forward through the buffers, the later ones direct) the
    records are those of the same run without it, bit for bit, in the same order."""
    sizes = [5, 3, 5, 7, 3, 5, 5]
    got, direct = {}, []
    for name, kernel in (("torch", None), ("kernel", FakeKernel())):
        torch.manual_seed(0)
        model = Outer(Mixed())
        ext = _with_kernel(monkeypatch, model, READS_MIXED, kernel)
        model.compile_inner(backend)
        graph = ext._vp_graph
        ext.vp_set_enabled(True)
        if kernel is not None:
            real = graph.prepare

            def prepare(tokens, plans, n, _real=real, _graph=graph):
                _real(tokens, plans, n)
                direct.append(_graph.direct is not None)
            graph.prepare = prepare
        torch.manual_seed(1)
        _run(model, [torch.randn(t, 4) for t in sizes])
        got[name] = _records(ext)
    assert kernel.launches > 0
    assert direct == [False, False, True, False, True, True, True]  # a token count's first forward builds its plan
    assert list(got["kernel"]) == list(got["torch"])
    for key, records in got["torch"].items():
        assert len(got["kernel"][key]) == len(sizes), key
        for a, b in zip(got["kernel"][key], records):
            assert a.shape == b.shape and a.dtype == b.dtype, key
            assert torch.equal(_bits(a), _bits(b)), key


def test_the_toys_records_are_the_sinks_with_the_kernel(monkeypatch):
    """The toy model of the sink tests (in-place add-norm after the read, a rotary module shared by every
    layer): the kernel's direct steps record what the eager sink records."""
    sizes = [4, 4, 6, 4]
    got = {}
    for path in ("sink", "graph"):
        torch.manual_seed(0)
        model = Outer(Toy())
        if path == "graph":
            ext = _with_kernel(monkeypatch, model, READS_IN, FakeKernel())
        else:
            ext = _ext(model, READS_IN, "sink", monkeypatch)
        model.compile_inner("aot_eager")
        ext.vp_set_enabled(True)
        torch.manual_seed(1)
        _run(model, [torch.randn(t, 4) for t in sizes])
        got[path] = _records(ext)
    assert got["graph"].keys() == got["sink"].keys()
    for key, records in got["sink"].items():
        assert [torch.equal(a, b) for a, b in zip(got["graph"][key], records)] == [True] * len(sizes), key


def test_a_direct_step_whose_reads_change_is_drained_from_the_buffers():
    """GraphBuffers alone: a direct step in which a hook is called once more than its plan holds (a new
    entry) sends the reads the kernel already wrote back to their buffers and drains the step as before;
    one whose reads change shape or dtype writes them to the buffers at once; the destinations go back to
    the static buffers after every step."""
    kernel = FakeKernel()
    graph = GraphBuffers(2, rows=8, device=torch.device("cpu"), launch=kernel)
    kernel.graph = graph
    plans, forward, steps_drained = buffer_steps(graph)

    def drained(tokens, n):
        step, store = steps_drained(tokens, n)
        assert torch.equal(graph.dests, graph.static_dests)  # the static destinations after every step
        return step, store

    forward(4, [0, 1])
    plan = drained(4, 0)[0].plan
    assert set(plan.kernel) == {(0, 0, 0), (1, 0, 0)} and plan.copied == []
    graph.prepare(4, plans, 1)
    assert graph.direct is not None and not torch.equal(graph.dests, graph.static_dests)
    a, b = forward(4, [0, 1])
    step, got = drained(4, 1)
    assert step.plan is plan and step.flats[0].data_ptr() == graph.pool[(1, torch.float32)].data_ptr()
    assert torch.equal(got["a|out"][0], a) and torch.equal(got["b|out"][0], b)
    graph.prepare(4, plans, 2)
    a, b, c = forward(4, [0, 1, 1])  # slot 1 called twice: (1, 0, 1) is no entry of the plan
    step, got = drained(4, 2)
    assert step.plan is not plan and step.plan.expected == [1, 2]
    assert [torch.equal(got[k][0], v) for k, v in (("a|out", a), ("b|out", b), ("c|out", c))] == [True] * 3
    graph.prepare(4, plans, 3)
    a, b, c = forward(4, [0, 1, 1], width=2)  # another shape: to the buffers at once
    assert graph.direct.redirected == {(0, 0, 0), (1, 0, 0), (1, 0, 1)}
    step, got = drained(4, 3)
    assert got["a|out"][0].shape == (4, 2)
    assert [torch.equal(got[k][0], v) for k, v in (("a|out", a), ("b|out", b), ("c|out", c))] == [True] * 3
    graph.prepare(4, plans, 4)
    graph.begin(4)  # the same shapes in another dtype: new buffers, written there, not into the records
    a, b, c = (torch.randn(4, 2).to(torch.bfloat16) for _ in range(3))
    for slot, x in ((0, a), (1, b), (1, c)):
        graph.write(slot, plans[slot], [x], sum_terms)
    assert graph.direct.redirected == {(0, 0, 0), (1, 0, 0), (1, 0, 1)}
    step, got = drained(4, 4)
    assert [torch.equal(got[k][0], v) for k, v in (("a|out", a), ("b|out", b), ("c|out", c))] == [True] * 3
    graph.prepare(4, plans, 5)
    graph.release()  # a reset between prepare and the forward: no direct step, the static buffers again
    assert graph.direct is None and torch.equal(graph.dests, graph.static_dests)


def _triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _triton(), reason="needs Triton (its interpreter runs the kernel on CPU tensors)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_the_kernel_itself_in_tritons_interpreter_copies_sums_and_counts_as_torch(dtype, monkeypatch):
    """The kernel's own code (the table's address, contiguous and row-strided reads, a None term, the count) on the
    CPU, in Triton's interpreter.  The interpreter rounds fp32 to bfloat16 toward zero where CUDA rounds to nearest
    even, so a bfloat16 *sum* is left to the CUDA test below; every other case is bitwise torch's."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(tap_kernel, "_KERNEL", [])  # defined afresh, interpreted, and dropped after
    src = (torch.randn(7, 12) * 100).to(dtype)
    other = (torch.randn(7, 12) * 100).to(dtype)
    cases = [[src], [src[:, 2:9]], [None, src], [torch.tensor(5).to(dtype)]]
    if dtype not in (torch.int64, torch.bfloat16):
        cases.append([src, other])
    counts = torch.zeros(3, dtype=torch.int64)
    dests = torch.zeros(4, dtype=torch.int64)
    for terms in cases:
        tensors, rows, cols, strides = tap_kernel.kernel_terms(terms)
        out = torch.full((rows * cols + 3,), -1).to(dtype)  # 3 elements past the read: never written
        dests[1] = out.data_ptr()
        tap_kernel.launch(dests, 1, counts, 2, tensors, rows, cols, strides)
        want = sum_terms(terms, "want").reshape(-1)
        assert torch.equal(_bits(out[:rows * cols]), _bits(want)), (dtype, len(terms))
        assert torch.equal(out[rows * cols:], torch.full((3,), -1).to(dtype))
    out = torch.empty(src.numel(), dtype=dtype)
    dests[1] = out.data_ptr()
    tap_kernel.launch(dests, 1, counts, -1, *tap_kernel.kernel_terms([src]))
    assert counts.tolist() == [0, 0, len(cases)] and torch.equal(out, src.reshape(-1))  # slot -1 counts nothing


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device: the Triton copy kernel and CUDA graphs")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_the_kernel_copies_and_sums_bitwise_as_torch_and_follows_its_table_in_a_graph(dtype):
    dev = torch.device("cuda")
    src = (torch.randn(7, 12, device=dev) * 100).to(dtype)
    other = (torch.randn(7, 12, device=dev) * 100).to(dtype)
    cases = [[src], [src[:, 2:9]], [None, src]]
    if dtype != torch.int64:
        cases.append([src, other])
    counts = torch.zeros(3, dtype=torch.int64, device=dev)
    dests = torch.zeros(4, dtype=torch.int64, device=dev)
    for terms in cases:
        tensors, rows, cols, strides = tap_kernel.kernel_terms(terms)
        out = torch.empty(rows * cols, dtype=dtype, device=dev)
        dests[1] = out.data_ptr()
        tap_kernel.launch(dests, 1, counts, 2, tensors, rows, cols, strides)
        want = sum_terms(terms, "want")
        assert torch.equal(_bits(out), _bits(want)), (dtype, len(terms))
    assert counts.tolist() == [0, 0, len(cases)]
    a, b = torch.empty_like(src), torch.empty_like(src)
    static = src.clone()
    dests[0] = a.data_ptr()
    tensors, rows, cols, strides = tap_kernel.kernel_terms([static])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(g, stream=stream):
        tap_kernel.launch(dests, 0, counts, -1, tensors, rows, cols, strides)
    torch.cuda.current_stream().wait_stream(stream)
    for target in (a, b):
        static.copy_((torch.randn(7, 12, device=dev) * 100).to(dtype))
        dests[0] = target.data_ptr()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(target, static), "a replay writes where the table points when it runs"
    assert counts.tolist() == [0, 0, len(cases)]  # slot -1 counts nothing
