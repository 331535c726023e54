"""Python's cyclic garbage collector told which objects live as long as the process.

Contract: :func:`freeze_long_lived(*imports)` imports ``imports`` (best effort), collects once, then
moves every object alive into the collector's permanent generation (``gc.freeze``): later
collections -- Python's own full ones and every explicit ``gc.collect`` (vLLM calls it twice while
loading weights and three times more while booting; the reference side calls it after each model,
:func:`harness.memory.trim_heap`) -- no longer walk them.  A process that imported torch,
transformers, TransformerLens and vLLM holds about 430,000 such objects; walking them cost 0.25-0.3 s
per full collection here, 1.5-2.5 s of a warm vLLM engine's 2.8 s boot, and 1.7 s of a synthetic
family's reference side (measured on the 2-core CI machine, docs/evidence.md 2026-12-03: a warm
engine's boot 2.7-3.0 s -> 0.35-1.0 s, a synthetic family's whole run 4.0-4.3 s -> 2.0-2.9 s).  Where to call it:
the warm engine server before its first fork (harness.engines.warm: every engine it forks inherits
the frozen heap, and no collection writes to those pages, so they stay shared), a cold engine after
its imports, the command line and a pytest session before their first run
(harness.pipeline.runner.freeze_before_runs, with the run's imports).  Nothing it does changes
a number: it decides only when memory is freed.

Traps:
- A frozen object is never collected.  Call it only where what is alive then lives until the process
  ends -- modules, a command's arguments, pytest's collected items -- never while a model, a capture
  or a spilled mapping (harness.spill: it removes its files when collected) is alive: a reference
  cycle frozen now and dropped later would stay, with its memory and its files.  Objects made after
  the call are collected as before.
- At exit the heap is unfrozen (``atexit``): the interpreter's last collection then finalizes those
  objects as it would have, instead of leaving them to native libraries that report leaks (nanobind,
  under Triton, printed "leaked 514 functions" at the exit of a frozen process).
- Calling it again freezes what was made since: the same rule applies to those objects.
"""
from __future__ import annotations

import atexit
import gc
import importlib

_unfreeze_at_exit = False


def freeze_long_lived(*imports: str) -> int:
    """Import ``imports`` (a name this environment lacks is passed over), collect, freeze; the number of
    objects frozen in all (``gc.get_freeze_count``)."""
    global _unfreeze_at_exit
    for name in imports:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 -- an optional import: whoever needs the module imports it itself
            pass
    gc.collect()
    gc.freeze()
    if not _unfreeze_at_exit:
        atexit.register(gc.unfreeze)
        _unfreeze_at_exit = True
    return gc.get_freeze_count()
