"""The references computed while the vLLM engine runs: one run's two sides at once.

Contract: :func:`overlaps(variant, checkpoint)` says whether a run may compute its references beside its
subject -- on the CPU, where the engine is its own process and the references are this one's,
for a serving shape whose compared sequences are the prompts (one generated token:
``single``, ``prefix-cache``, ``chunked``; ``decode`` and ``preempt`` compare the sequences the
engine generated, which the references need first), and for a checkpoint whose weight files
hold at most :data:`OVERLAP_MAX_WEIGHT_BYTES`.  :class:`Beside` runs a function in a
thread and hands back its value, or raises what it raised, in the caller's thread.

Why it is safe: the two sides share nothing -- the engine reads its request file and writes its
captures in its own process; the references read the checkpoint -- and neither's numbers depend
on the other (the engine's thread count and the references' are what they were run one after
the other), so the report rows are identical; only the wall time changes.  On a 2-core CPU the
engine (one torch thread under vLLM, its boot mostly single-threaded Python) and the references
(this process's torch threads) overlap for most of the engine's 1.5-2.5 s per synthetic family
(a run 2.4-2.6 s one after the other, 1.9-2.4 s side by side: llama and gpt2, three runs each).
A larger model's two sides are both compute: the engine's forwards on one core and the references'
two threads then slow each other more than the overlap saves, and both hold the model at once.
Measured on the 2-core CI machine, the two ways taking turns in one process (docs/evidence.md, 2026-12-03):
gemma3_270m in fp32 68.9-74.0 s side by side against 61.2-67.7 s in turn, its sampled peak memory
11.4-12.4 GB against 7.9 GB; in bf16 56.5 s against 45.8-56.7 s; smollm2 in fp32 54.0-62.3 s against
48.3-62.5 s.

Traps:
- The thread is a daemon: an interrupt (``KeyboardInterrupt`` in the main thread, where the
  engine is waited for and stopped) does not wait for the references to finish.
- A failed engine is the run's error, as before; its references are stopped at their next phase
  (:meth:`Beside.stop`: ``fn`` enters its phases through :attr:`Beside.stop_event`, harness.phases) and
  waited for, so they never run on beside the next model.  A vLLM refusal at boot thus costs the
  references' first phase, not all of them; a larger checkpoint's none (tests/engine/test_engine_errors.py:
  smollm2 under TP=2).
- Not on a GPU: vLLM sizes its KV cache from the device memory free at boot, which references
  computed on the same device would change.
"""
from __future__ import annotations

import threading
from functools import partial
from pathlib import Path
from typing import Any, Callable

from harness.engines.serving import SCHEMES
from harness.values.variant import Variant


# the synthetic checkpoints' weights are 0.4-6 MB, the smallest real one's (smollm2) 538 MB
OVERLAP_MAX_WEIGHT_BYTES = 64 * 2 ** 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def weight_bytes(checkpoint: Path) -> int:
    """The size of a checkpoint's weight files: a folder's (:data:`WEIGHT_SUFFIXES`, not recursing), or the
    file itself (a GGUF file)."""
    if checkpoint.is_file():
        return checkpoint.stat().st_size
    return sum(p.stat().st_size for p in checkpoint.glob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())


def overlaps(variant: Variant, checkpoint: Path) -> bool:
    return (variant.device == "cpu" and SCHEMES[variant.serving].max_tokens == 1
            and weight_bytes(checkpoint) <= OVERLAP_MAX_WEIGHT_BYTES)


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
