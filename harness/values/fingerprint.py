"""What a report was computed from, as one hash: ``--resume`` reruns only what changed.

Contract: :func:`fingerprint(target, variant)` hashes the harness's own code (every ``.py`` under
``harness/`` and ``overlays/``), the checkpoint (its ``config.json``, and each weight file's name,
size and modification time; a packaged checkpoint's provenance), the variant and the installed
library versions.  Two runs with equal fingerprints compare the same tensors by the same rules.

Trap: weights are identified by size and mtime, not content (hashing gigabytes per run would cost
more than the run); a checkpoint rewritten in place with the same size within one second would
be taken for the old one.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from harness.paths import REPO_ROOT


@lru_cache(maxsize=1)
def code_hash() -> str:
    h = hashlib.sha256()
    for folder in ("harness", "overlays"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            h.update(str(path.relative_to(REPO_ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def checkpoint_hash(checkpoint: Path, provenance: dict | None = None) -> str:
    h = hashlib.sha256()
    cfg = checkpoint / "config.json"
    h.update(cfg.read_bytes() if cfg.is_file() else b"")
    for path in sorted(checkpoint.glob("*.safetensors")) + sorted(checkpoint.glob("*.bin")):
        st = path.stat()
        h.update(f"{path.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(json.dumps(provenance or {}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def fingerprint(target, variant, versions: dict) -> str:
    ckpt = (checkpoint_hash(Path(target.checkpoint), getattr(target, "provenance", None))
            if target.checkpoint is not None else "none")  # a family no checkpoint can be built for (Refusal "hf:")
    parts = {"code": code_hash(), "checkpoint": ckpt,
             "variant": variant.to_dict(), "versions": {k: versions.get(k) for k in
                                                        ("vllm", "torch", "transformers", "transformer-lens")}}
    if getattr(target, "prompts", None) is not None:  # a --prompts file: its content (the defaults are code)
        parts["prompts"] = target.prompts.sha256
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]
