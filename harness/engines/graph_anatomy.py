"""The capture's own cost on the graph path, taken apart inside the engine process: what
benchmarks/bench_capture_graphs.py measures through the worker's public entry points
(``CaptureExtension.vp_graph_copy_alone`` / ``vp_graph_drain_anatomy``), so no benchmark reads the
extension's state.

Contract: functions of one installed :class:`~harness.engines.vllm_worker.CaptureExtension` (``ext``) and a
forward of ``tokens`` (padded) tokens that the graph table knows, each timed synchronized, best of ``reps``:

* :func:`copy_alone` -- the forward's graph-buffer rows copied into the record buffers the drain wrote them
  to (``first``: that forward's record index in its call), nothing else: the bytes' own cost;
* :func:`drain_anatomy` -- ``drain`` (``GraphBuffers.drain`` into the records, as after a forward),
  ``bookkeeping`` (the same drain handing each view to a no-op: the Python loop, slicing, views, no copy),
  ``counts`` (the host read of the per-hook call counts) and ``layout`` (the batch layout recorded per
  forward).

Traps: the call counts are set back to what that forward left before each repetition; the records are
cleared in place between drain repetitions (record index 0 again: the same buffers, no allocation), and
reset after.  A record buffer not found, or of another shape, gets a twin (counted in ``twins``).  Reads
recorded outside the graph buffers (a hook after the forward: the logits processor) are not in the copy.
"""
from __future__ import annotations

import math
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
    """``{"s", "pairs", "twins", "bytes"}`` (module doc); ``s`` None with ``why`` where there is nothing to copy."""
    graph = getattr(ext, "_vp_graph", None)
    if graph is None or tokens not in graph.table:
        return {"s": None, "pairs": 0, "twins": 0, "why": "no graph buffers" if graph is None else
                f"no forward of {tokens} tokens in the graph table {sorted(graph.table)}"}
    pairs, seen, twins = [], {}, 0
    views = ext._vp_buffers._views
    for (slot, i), shapes in sorted(graph.table[tokens].items()):
        for r, (keys, _lo, _hi, _read) in enumerate(ext._vp_plans[slot]):
            shape = shapes[r]
            if shape is None or shape == "over":
                continue
            key = keys[i % len(keys)]
            n = first + seen.get(key, 0)
            seen[key] = seen.get(key, 0) + 1
            src = graph.flat[(slot, r, i)][:math.prod(shape)].view(shape)
            dst = views.get((key, n))
            if dst is None or dst.shape != src.shape or dst.dtype != src.dtype:
                dst, twins = torch.empty_like(src), twins + 1
            pairs.append((dst, src))

    def copy() -> None:
        for dst, src in pairs:
            dst.copy_(src)
    return {"s": _best(copy, reps), "pairs": len(pairs), "twins": twins,
            "bytes": sum(s.numel() * s.element_size() for _, s in pairs)}


def drain_anatomy(ext, tokens: int, reps: int = 5) -> dict:
    """``{"drain", "records_per_key", "bookkeeping", "counts", "layout"}`` in seconds (module doc); ``{}``
    where the graph table has no forward of ``tokens`` tokens."""
    from harness.engines.vllm_compat import batch_layout

    graph = getattr(ext, "_vp_graph", None)
    if graph is None or tokens not in graph.table:
        return {}
    expected = [0] * graph.counts.numel()
    for slot, _ in graph.table[tokens]:
        expected[slot] += 1
    exp = torch.tensor(expected, dtype=graph.counts.dtype, device=graph.counts.device)

    def as_left(prep: Callable[[], None] = lambda: None) -> Callable[[], None]:
        def go() -> None:
            prep()
            graph.counts.copy_(exp)
        return go
    res = {"drain": _best(lambda: graph.drain(tokens, ext._vp_plans, ext._vp_record_value), reps,
                          as_left(ext._vp_records.clear)),
           "records_per_key": max((len(v) for v in ext._vp_records.values()), default=0),
           "bookkeeping": _best(lambda: graph.drain(tokens, ext._vp_plans, lambda key, value: None), reps, as_left()),
           "counts": _best(lambda: graph.counts.tolist(), reps, as_left()),
           "layout": _best(lambda: batch_layout(ext.model_runner, None, None), reps, as_left())}
    graph.counts.zero_()  # as a drain leaves them
    ext.vp_reset()
    return res


__all__ = ["copy_alone", "drain_anatomy"]
