"""An engine process never outlives the harness: one function, run in the child before it execs or
forks on (cold starts, harness.engines.subject; warm ones, harness.engines.warm).

Trap: the engine runs in its own session, so a signal to the harness's process group (a CI job
cancelled, ``kill -TERM -PGID``) does not reach it; only the parent-death signal does.
"""
from __future__ import annotations

import signal


def die_with_parent() -> None:
    """In the engine, before exec: SIGKILL when the harness process dies (Linux ``PR_SET_PDEATHSIG``).
    A no-op where prctl is missing."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass
