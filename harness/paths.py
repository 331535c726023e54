"""Where the repository and its caches are: one place, so moving a module never moves a cache."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_ROOT = REPO_ROOT / ".cache"  # checkpoints/, runs/ (ignored by git)
RUNS_ROOT = CACHE_ROOT / "runs"  # one folder per engine process: its log, records and outcome


def checkpoints_root() -> Path:
    """Where built and assembled checkpoints are cached: ``$VLLM_PARITY_CACHE`` or ``.cache/checkpoints``."""
    root = os.environ.get("VLLM_PARITY_CACHE")
    return Path(root) if root else CACHE_ROOT / "checkpoints"
