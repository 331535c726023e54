"""Where a run's time and memory go: named wall-clock phases and peak memory.

Contract: a :class:`Phases` collects ``name -> seconds`` in an ordered dict (start order):
``with phases("subject"): ...`` times one phase; ``phases.child("references")`` hands a
callee the same dict under the prefix ``references.`` (its sub-phases follow their parent);
``phases.add(name, s)`` records a duration measured elsewhere (the vLLM engine's boot, in
its own process).  :func:`peak_memory` returns peak RSS of this process and of its
finished children, and this process's peak GPU memory where CUDA is in use.

Traps:

* A phase that raises still records its time up to the exception (the report of a
  crashed model says how far it got); a name timed twice accumulates.
* ``ru_maxrss`` is a *lifetime* peak: in pytest, or a CLI run with ``--jobs 1``, every model
  runs in one process, so ``rss_self`` includes earlier models and ``rss_children`` is the
  largest engine process that finished so far (only waited-for children count).  With
  ``--jobs N`` each job has its own process and both are that job's own.  The GPU peak
  is reset per model (:func:`reset_gpu_peak`) and covers this process only; the vLLM
  engine's GPU memory is its own process's.
* ``ru_maxrss`` is kilobytes on Linux and bytes on macOS.
* ``stop`` (a ``threading.Event``, shared with children): once it is set, entering any phase raises
  :class:`PhaseStopped` -- how a run stops the references it computes beside an engine that failed
  (harness.pipeline.overlap), at their next phase, instead of finishing work no row will use.

Standard library only (torch is looked at only if already imported), so any layer may use it.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any
from contextlib import contextmanager
from dataclasses import dataclass, field


class PhaseStopped(Exception):
    """A phase was entered after its :class:`Phases`' ``stop`` was set."""


@dataclass
class Phases:
    seconds: dict[str, float] = field(default_factory=dict)
    prefix: str = ""
    # the phases open right now, outermost first (shared with children): harness.memory files samples by it
    open: list[str] = field(default_factory=list)
    stop: Any = None  # a threading.Event, or None: never stopped (module doc)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        key = self.prefix + name
        if self.stop is not None and self.stop.is_set():
            raise PhaseStopped(f"{key}: stopped before it began")
        self.seconds.setdefault(key, 0.0)  # inserted at the start: a parent precedes its sub-phases
        start = time.perf_counter()
        self.open.append(key)
        try:
            yield
        finally:
            self.seconds[key] += time.perf_counter() - start
            self.open.remove(key)

    def child(self, name: str) -> Phases:
        """Sub-phases of ``name`` for a callee, recorded as ``name.<sub>`` in this same dict."""
        return Phases(self.seconds, f"{self.prefix}{name}.", self.open, self.stop)

    def stoppable(self, stop) -> Phases:
        """These same phases (one dict), entered only while ``stop`` is not set."""
        return Phases(self.seconds, self.prefix, self.open, stop)

    def own(self) -> dict[str, float]:
        """This prefix's phases, the prefix stripped (a callee's view of what it timed)."""
        n = len(self.prefix)
        return {k[n:]: v for k, v in self.seconds.items() if k.startswith(self.prefix)}

    def add(self, name: str, seconds: float | None) -> None:
        """A duration measured elsewhere; ``None`` (not measured) is left out, never recorded as 0."""
        if seconds is not None:
            key = self.prefix + name
            self.seconds[key] = self.seconds.get(key, 0.0) + float(seconds)


def _kib_to_mib(maxrss: int) -> float:
    return maxrss / (1024 * 1024) if sys.platform == "darwin" else maxrss / 1024


def _torch_cuda():
    """torch.cuda where this process already started CUDA; else None (never starts it: a
    parent that touches CUDA before spawning engine processes changes what they may do)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.cuda if torch.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 -- a CPU build without a driver: no GPU to report
        return None


def reset_gpu_peak() -> None:
    cuda = _torch_cuda()
    if cuda is not None:
        cuda.reset_peak_memory_stats()


def peak_memory() -> dict:
    """Peak memory in MiB: ``rss_self`` and ``rss_children`` (see the module's traps),
    ``gpu_allocated`` / ``gpu_reserved`` (torch's caching allocator, this process) or None."""
    import resource

    out = {"rss_self_mib": _kib_to_mib(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
           "rss_children_mib": _kib_to_mib(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss),
           "gpu_allocated_mib": None, "gpu_reserved_mib": None}
    cuda = _torch_cuda()
    if cuda is not None:
        out["gpu_allocated_mib"] = cuda.max_memory_allocated() / 2**20
        out["gpu_reserved_mib"] = cuda.max_memory_reserved() / 2**20
    return out
