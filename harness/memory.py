"""Peak memory per phase, sampled: this process and its vLLM engine processes together.

Contract: ``with MemorySampler(phases) as mem: ...`` samples, every ``interval_s`` in a daemon
thread, the RSS of this process and of every descendant (the vLLM engine, its workers) with
psutil; :meth:`MemorySampler.summary` returns, in MiB::

    {"rss_peak_mib": <this process + descendants, at the same instant>,
     "rss_self_peak_mib": <this process>, "rss_engines_peak_mib": <descendants>,
     "by_phase": {phase: <this process + descendants>}, "interval_s": ..., "samples": n}

A sample belongs to the innermost phase open in ``phases`` at that instant
(:attr:`harness.phases.Phases.open`); a sample outside every phase is filed under ``"-"``.

Traps:

* A spike shorter than the interval can be missed.  :func:`harness.phases.peak_memory`'s
  ``ru_maxrss`` (a lifetime peak, never missed) bounds this process from above.
* Unlike ``ru_maxrss`` these are this run's own peaks: in pytest or a ``--jobs 1`` CLI run an
  earlier model's peak does not leak into a later model's report.
* A sample costs about 1.4 ms (psutil walks /proc for the descendants; measured on the 2-core CI
  machine): at 20 per second, under 3 % of one core.
* Pages a child shares with its parent count in both: the tree sum is an upper bound of what
  the machine holds.  A warm engine (harness.engines.warm) is forked from a server that imported
  torch and vLLM: the server is left out of the sum, and the engine's RSS counts the imported pages
  it shares with the server, as a cold engine's counts its own imports.
* glibc keeps freed blocks below its mmap threshold in the heap, and raises that threshold (up to
  32 MB) each time a larger block is freed: a reference model's activations then stay in RSS after
  the model is gone, and the next model stacks on top.  :func:`return_frees_promptly` pins the
  threshold (the runner calls it): measured on SmolLM2-135M fp32's reference side, RSS between
  phases fell from 1.78 GB to 0.87-1.34 GB (four runs).
"""
from __future__ import annotations

import threading

from harness.phases import Phases

MIB = 2 ** 20
MMAP_THRESHOLD_BYTES = 1 << 20  # blocks this large or larger are mmapped: freeing one unmaps it
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


def _glibc():
    """The C library when it is glibc (``mallopt``, ``malloc_trim``), else None (macOS, musl)."""
    try:
        import ctypes

        lib = ctypes.CDLL("libc.so.6")
        return lib if hasattr(lib, "malloc_trim") else None
    except OSError:
        return None


def trim_heap() -> None:
    """Collect garbage now (a released model's hooks hold reference cycles) and hand the heap's free
    pages back to the OS (``malloc_trim``); no-op beyond the collection where the C library is not glibc."""
    import gc

    gc.collect()
    lib = _glibc()
    if lib is not None:
        lib.malloc_trim(0)


def return_frees_promptly() -> bool:
    """Pin glibc's mmap threshold at :data:`MMAP_THRESHOLD_BYTES` for this process (setting it turns off
    glibc's dynamic raising), so a freed tensor of 1 MiB or more goes back to the OS at once.  Idempotent;
    False where the C library is not glibc (nothing changes there).  Costs a page fault per fresh page
    of a large block instead of reusing heap; not measured apart (the run got faster with it and the
    comparison changes together, docs/benchmarks.md, "Memory and time at real size")."""
    lib = _glibc()
    return lib is not None and bool(lib.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


NOT_AN_ENGINE: set[int] = set()  # descendants left out of the engine tree (harness.engines.warm registers its server)


def _tree_rss() -> tuple[int, int]:
    """(this process's RSS, the sum of its live descendants' RSS), in bytes."""
    import psutil

    me = psutil.Process()
    children = 0
    for child in me.children(recursive=True):
        if child.pid in NOT_AN_ENGINE:  # the warm engine server: its imports are no engine's; its children are
            continue
        try:
            children += child.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass  # exited between listing and reading: it holds nothing now
    return me.memory_info().rss, children


class MemorySampler:
    def __init__(self, phases: Phases | None = None, interval_s: float = 0.05):
        self.phases, self.interval_s = phases, interval_s
        self.peak = self.peak_self = self.peak_children = 0
        self.by_phase: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """One reading, attributed to the innermost open phase."""
        own, children = _tree_rss()
        phase = self.phases.open[-1] if self.phases is not None and self.phases.open else "-"
        total = own + children
        self.peak, self.peak_self = max(self.peak, total), max(self.peak_self, own)
        self.peak_children = max(self.peak_children, children)
        self.by_phase[phase] = max(self.by_phase.get(phase, 0), total)
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    def summary(self) -> dict:
        return {"rss_peak_mib": self.peak / MIB, "rss_self_peak_mib": self.peak_self / MIB,
                "rss_engines_peak_mib": self.peak_children / MIB,
                "by_phase": {k: v / MIB for k, v in self.by_phase.items()},
                "interval_s": self.interval_s, "samples": self.samples}
