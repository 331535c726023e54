"""How a run is carried out, beside what is run (the :class:`~harness.values.variant.Variant`).

Contract: :class:`RunSettings` is one frozen value built once by each front end
(harness.frontends.options.run_settings, for the CLI and the pytest plugin) and handed to
:func:`harness.pipeline.runner.run_model`.  Nothing here changes what is compared, so nothing here
is in a report's fingerprint or name:

* ``engine_timeout_s`` (``--engine-timeout``): seconds each vLLM process may run before its process
  group is killed and the model is an error;
* ``references_dir`` (``--references-dir``): where reference captures and floors are stored and
  reused (harness.references.stored); None computes them every time;
* ``selection`` (``--layers``, ``--hook-kinds``): capture and compare only those hooks
  (harness.values.selection).  It changes how much is compared, not how: the run is a selective
  run, whose report is ``...-selection`` (never a full report's name, left out of the matrix, never
  skipped by ``--resume``), so it needs no place in the fingerprint either.

Trap: settings are picklable (``--jobs`` sends them to worker processes).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.values.selection import HookSelection


@dataclass(frozen=True)
class RunSettings:
    engine_timeout_s: float = 900
    references_dir: Path | None = None
    selection: HookSelection | None = None
