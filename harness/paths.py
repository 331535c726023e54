"""Where the repository and its caches are: one place, so moving a module never moves a cache."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_ROOT = REPO_ROOT / ".cache"  # checkpoints/, runs/ (ignored by git)
