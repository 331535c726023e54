"""The references computed while the vLLM engine runs: one run's two sides at once.

Contract: :func:`overlaps(variant)` says whether a run may compute its references beside its
subject -- on the CPU, where the engine is its own process and the references are this one's,
and for a serving shape whose compared sequences are the prompts (one generated token:
``single``, ``prefix-cache``, ``chunked``); ``decode`` and ``preempt`` compare the sequences the
engine generated, which the references need first.  :class:`Beside` runs a function in a
thread and hands back its value, or raises what it raised, in the caller's thread.

Why it is safe: the two sides share nothing -- the engine reads its request file and writes its
captures in its own process; the references read the checkpoint -- and neither's numbers depend
on the other (the engine's thread count and the references' are what they were run one after
the other), so the report rows are identical; only the wall time changes.  On a 2-core CPU the
engine (one torch thread under vLLM, its boot mostly single-threaded Python) and the references
(this process's torch threads) overlap for most of the engine's 8-10 s per synthetic family.

Traps:
- The thread is a daemon: an interrupt (``KeyboardInterrupt`` in the main thread, where the
  engine is waited for and stopped) does not wait for the references to finish.
- A failed engine is the run's error, as before; its references are stopped at their next phase
  (:meth:`Beside.stop`: ``fn`` enters its phases through :attr:`Beside.stop_event`, harness.phases) and
  waited for, so they never run on beside the next model.  A vLLM refusal at boot (smollm2 under TP=2)
  thus costs the references' first phase, not all of them (tests/engine/test_engine_errors.py).
- Not on a GPU: vLLM sizes its KV cache from the device memory free at boot, which references
  computed on the same device would change.
"""
from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable

from harness.engines.serving import SCHEMES
from harness.values.variant import Variant


def overlaps(variant: Variant) -> bool:
    return variant.device == "cpu" and SCHEMES[variant.serving].max_tokens == 1


class Beside:
    """``fn(stop_event)`` running in a daemon thread from construction on."""

    def __init__(self, fn: Callable[[threading.Event], Any], name: str = "vp-references") -> None:
        self.stop_event = threading.Event()
        fn = partial(fn, self.stop_event)
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread by result()
            self._error = exc

    def wait(self) -> None:
        self._thread.join()

    def stop(self) -> None:
        """Stop ``fn`` at its next phase and wait for it; what it raised or returned is dropped."""
        self.stop_event.set()
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
