"""The benchmarks' probes of the capture, apart from the capture: a mixin of ``vp_*`` entry points that
only benchmarks/ loads, as :class:`BenchCaptureExtension`
(``worker_extension_cls=harness.engines.boot.BENCH_EXTENSION``).  The suite's engines load
:class:`~harness.engines.vllm_worker.CaptureExtension` alone, which captures and nothing else.

Contract: :class:`BenchProbes` reads and resets the state :class:`~harness.engines.vllm_worker.CaptureExtension`
keeps (its records, hook handles, forward timers, the graph path's buffers); it installs nothing itself.
The driver calls its methods by name with ``llm.collective_rpc``, as it does the capture's:

* :meth:`~BenchProbes.vp_uninstall` -- every hook removed, the forward timers too: the bare forward;
* :meth:`~BenchProbes.vp_take` -- record count and bytes since the last reset, and the hooks installed;
* :meth:`~BenchProbes.vp_copy_floor` -- the current records copied once more, alone (the bytes' own cost);
* :meth:`~BenchProbes.vp_take_forward_times` -- the extension's own forward timers, without the drain;
* :meth:`~BenchProbes.vp_take_record_stats` -- tensors and bytes per forward of the last request;
* :meth:`~BenchProbes.vp_graph_copy_alone`, :meth:`~BenchProbes.vp_graph_drain_anatomy` -- the graph
  path's copy and drain taken apart (harness.engines.graph_anatomy);
* :meth:`~BenchProbes.vp_set_drain` -- the graph path's drain as it was before 2026-12-03, for a
  side-by-side comparison (benchmarks/bench_capture_peers.py).

Traps: ``vp_take`` and ``vp_take_record_stats`` reset the records (``vp_reset``), which ``vp_dump`` does
not: a benchmark that also dumps them dumps first.  vLLM mixes the extension class into its worker after
checking that no attribute clashes with the worker's, inherited ones included: every name here keeps the
``vp_`` prefix.
"""
from __future__ import annotations

import time

import torch

from harness.engines.vllm_worker import CaptureExtension


class BenchProbes:
    """Benchmark-only entry points over a :class:`~harness.engines.vllm_worker.CaptureExtension`'s state."""

    def vp_set_drain(self, overlap: bool) -> None:
        """Graph path: ``True`` (the default) times forwards by CUDA events and enqueues the drain's copy
        before its one host wait; ``False`` the way before 2026-12-03 -- synchronized timers, the counts read
        before the copy -- kept for benchmarks/bench_capture_peers.py's side-by-side comparison."""
        self._vp_wait = not overlap

    def vp_uninstall(self) -> None:
        """Remove every hook this extension installed (the forward timers too): the bare forward."""
        for handle in getattr(self, "_vp_handles", []):
            handle.remove()
        self._vp_handles = []

    def vp_take(self) -> dict:
        """Record count and bytes since the last reset, and the hooks installed; then reset."""
        records = [t for ts in getattr(self, "_vp_records", {}).values() for t in ts]
        out = {"records": len(records), "bytes": sum(t.numel() * t.element_size() for t in records),
               "hooks": max(len(getattr(self, "_vp_handles", [])) - 2, 0)}  # minus the two forward timers
        self.vp_reset()
        return out

    def vp_copy_floor(self, reps: int = 5) -> float:
        """Seconds to copy every current record once into a twin buffer, nothing else running in this
        process (best of ``reps``): what the captured bytes alone cost on this machine."""
        records = [t for ts in getattr(self, "_vp_records", {}).values() for t in ts]
        twins = [torch.empty_like(t) for t in records]
        sync = torch.cuda.synchronize if any(t.is_cuda for t in records) else (lambda: None)
        best = float("inf")
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            for dst, src in zip(twins, records):
                dst.copy_(src)
            sync()
            best = min(best, time.perf_counter() - t0)
        return best

    def vp_take_forward_times(self) -> list[float]:
        """The model forwards' seconds since the last take (the extension's own timers: a piecewise step's
        pre/post-hook pair, a full-graph replay's wrapper; without the drain), then cleared."""
        times = self._vp_times()
        if hasattr(self, "_vp_forward_s"):
            self._vp_forward_s.clear()
        return times

    def vp_take_record_stats(self, calls: int = 2) -> dict:
        """Per forward of the last request (record ``n`` of each read, ``n < calls``: 0 the prefill, 1 the
        first decode step), ``[tensors, bytes]``, and the hooks installed; then reset.  Nothing installed:
        zeros."""
        records = getattr(self, "_vp_records", None)
        out = {"hooks": max(len(getattr(self, "_vp_handles", [])) - 2, 0) if records is not None else 0,
               "forwards": []}
        for n in range(calls):
            ts = [v[n] for v in (records or {}).values() if len(v) > n]
            out["forwards"].append([len(ts), sum(t.numel() * t.element_size() for t in ts)])
        if records is not None:
            self.vp_reset()
        return out

    def vp_graph_copy_alone(self, tokens: int, first: int, reps: int = 5) -> dict:
        """Graph path: a forward's bytes copied alone (harness.engines.graph_anatomy.copy_alone)."""
        from harness.engines.graph_anatomy import copy_alone

        return copy_alone(self, tokens, first, reps)

    def vp_graph_drain_anatomy(self, tokens: int, reps: int = 5) -> dict:
        """Graph path: a forward's drain taken apart (harness.engines.graph_anatomy.drain_anatomy)."""
        from harness.engines.graph_anatomy import drain_anatomy

        return drain_anatomy(self, tokens, reps)


class BenchCaptureExtension(CaptureExtension, BenchProbes):
    """The capture plus the benchmarks' probes: the worker extension benchmarks/ boots with."""
