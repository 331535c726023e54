"""``python -m harness``: the command line (harness.frontends.cli).

Trap: an interrupted ``run`` (exit status 130) may leave a references thread computing
(harness.pipeline.overlap: a daemon, never waited for on an interrupt); interpreter finalization
with a torch op in flight aborts the process (measured: exit status -6, SIGABRT, instead of 130).
Every report is written before ``main`` returns, so that exit skips finalization (``os._exit``); the captures
spilled to disk are deleted first (harness.spill.release_all: file removals, no torch op), as finalization would
have deleted them."""
import os
import sys

from harness.frontends.cli import INTERRUPTED, main

if __name__ == "__main__":
    rc = main()
    if rc == INTERRUPTED:
        from harness.spill import release_all

        release_all()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
