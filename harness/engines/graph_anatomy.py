"""The capture's own cost on the graph path, taken apart inside the engine process: what
benchmarks/bench_capture_graphs.py measures through the worker's public entry points
(``BenchProbes.vp_graph_copy_alone`` / ``vp_graph_drain_anatomy``, harness.engines.bench_probes: the
benchmarks' extension), so no benchmark reads the extension's state.

Contract: functions of one installed :class:`~harness.engines.vllm_worker.CaptureExtension` (``ext``) and a
forward of ``tokens`` (padded) tokens that the graph table knows, each timed synchronized, best of ``reps``:

* :func:`copy_alone` -- the forward's graph-buffer rows copied into the flat record tensors the drain wrote
  them to (``first``: that forward's step index since the reset, the record index of each of its reads in
  its call), with the drain's own batched copy (one ``torch.cat(out=)`` per dtype), nothing else: the
  bytes' own cost;
* :func:`drain_anatomy` -- ``drain`` (``GraphBuffers.drain`` into the records of step 0, as after a
  forward), ``bookkeeping`` (the same drain without the copy: plan and record-tensor lookup, the counts'
  snapshot), ``counts`` (the host read of the per-hook call counts: the check the drain leaves to the
  moment the records are read), ``layout`` (the batch layout recorded per forward) and ``resolve`` (one
  drained step split into the per-key record lists: also left to the moment the records are read, off
  the step).

Traps: the call counts are set back to what that forward left before each repetition; the drain repeats
on step 0 (the same record tensors, no allocation once the pool holds them), its steps are not added to
the worker's records, and the records are reset after.  A record tensor not in the pool, or smaller, gets
a twin (counted in ``twins``).  Reads recorded outside the graph buffers (a hook after the forward: the
logits processor) are not in the copy.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _best(fn: Callable[[], object], reps: int, prep: Callable[[], None] = lambda: None) -> float:
    out = float("inf")
    for _ in range(reps):
        prep()
        _sync()
        t = time.perf_counter()
        fn()
        _sync()
        out = min(out, time.perf_counter() - t)
    return out


def copy_alone(ext, tokens: int, first: int, reps: int = 5) -> dict:
    """``{"s", "pairs", "twins", "bytes"}`` (module doc); ``s`` None with ``why`` where there is nothing to copy.
    ``pairs``: the reads copied (sources), ``twins``: the flat record tensors that had to be made."""
    graph = getattr(ext, "_vp_graph", None)
    if graph is None or tokens not in graph.table:
        return {"s": None, "pairs": 0, "twins": 0, "why": "no graph buffers" if graph is None else
                f"no forward of {tokens} tokens in the graph table {sorted(graph.table)}"}
    plan = graph.plan(tokens, ext._vp_plans)
    groups, twins = [], 0
    for dtype, sources, _sizes, total in plan.groups:
        dst = graph.pool.get((first, dtype))
        if dst is None or dst.numel() < total:
            dst, twins = torch.empty(total, dtype=dtype, device=graph.counts.device), twins + 1
        groups.append((sources, dst[:total]))

    def copy() -> None:
        for sources, dst in groups:
            torch.cat(sources, out=dst)
    return {"s": _best(copy, reps), "pairs": sum(len(sources) for sources, _ in groups), "twins": twins,
            "bytes": sum(dst.numel() * dst.element_size() for _, dst in groups)}


def drain_anatomy(ext, tokens: int, reps: int = 5) -> dict:
    """``{"drain", "records_per_key", "bookkeeping", "counts", "layout", "resolve"}`` in seconds (module doc);
    ``{}`` where the graph table has no forward of ``tokens`` tokens."""
    from harness.engines.vllm_compat import batch_layout

    graph = getattr(ext, "_vp_graph", None)
    if graph is None or tokens not in graph.table:
        return {}
    plan = graph.plan(tokens, ext._vp_plans)
    exp = torch.tensor(plan.expected, dtype=graph.counts.dtype, device=graph.counts.device)

    def as_left() -> None:
        graph.counts.copy_(exp)
    res = {"drain": _best(lambda: graph.drain(tokens, ext._vp_plans, 0), reps, as_left)}
    as_left()
    step = graph.drain(tokens, ext._vp_plans, 0)
    store: dict = {}
    step.plan.resolve(step.flats, store)
    res.update(records_per_key=max((len(v) for v in store.values()), default=0),
               bookkeeping=_best(lambda: graph.drain(tokens, ext._vp_plans, 0, copy=False), reps, as_left),
               counts=_best(lambda: graph.counts.tolist(), reps, as_left),
               layout=_best(lambda: batch_layout(ext.model_runner, None, None), reps, as_left),
               resolve=_best(lambda: step.plan.resolve(step.flats, {}), reps))
    graph.counts.zero_()  # as a drain leaves them
    ext.vp_reset()
    return res


__all__ = ["copy_alone", "drain_anatomy"]
