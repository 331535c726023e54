"""Stored references: the reference side of a run, computed once, saved with a manifest, reused.

Contract: :func:`manifest(target, variant, plan, prompts)` says everything the reference captures
and floors depend on -- the checkpoint (harness.values.fingerprint.checkpoint_hash), the prompts'
token ids, dtype, device, the gate key (TF32 floors), the hooks and the compatibility-mode names
asked for, the reference code (``harness/references/*.py``, ``harness/comparison/chaos.py`` and the routing scope
its own flips take, ``harness/comparison/routing.py``) and
the versions of torch, transformers and TransformerLens -- and :func:`key` hashes it.
:class:`ReferenceStore(root)` keeps one entry per key under ``root/<model>/<key>/``
(``tensors.safetensors`` + ``entry.json``): :meth:`ReferenceStore.load` returns the stored
:class:`~harness.references.reference.ReferenceCapture` or None, :meth:`ReferenceStore.save` writes
one atomically.  vLLM is in no part of the key: a vLLM upgrade re-runs only vLLM, and two vLLM lines
are compared against the same stored references (``--references-dir``).

Traps:
- A decode run's references are on the generated sequence, so they match a stored entry only where
  the engine generated the same tokens (the prompts are in the key).
- Tensors are stored as they were captured (dtype included); floats in JSON round-trip exactly.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from harness.paths import REPO_ROOT

FORMAT = 1
_STORES = ("bridge", "compat", "compat_processed", "hf")


def _reference_code_hash() -> str:
    h = hashlib.sha256()
    files = sorted((REPO_ROOT / "harness" / "references").glob("*.py")) + [
        REPO_ROOT / "harness" / "comparison" / n for n in ("chaos.py", "routing.py")]
    for path in files:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def manifest(target, variant, plan, prompts: list[list[int]], versions: dict) -> dict:
    from harness.logprob_request import logprob_k
    from harness.kernel_path import cpu_kernel_path, label as kernel_label
    from harness.values.fingerprint import checkpoint_hash

    return {
        "format": FORMAT, "model": target.name,
        "checkpoint": checkpoint_hash(Path(target.checkpoint), getattr(target, "provenance", None)),
        "prompts": [list(map(int, p)) for p in prompts],
        "dtype": variant.dtype, "device": variant.device, "gate": variant.gate_key,
        "hooks": sorted([*plan.specs, *plan.derived]), "compat_names": sorted(plan.compat_names),
        "processed_names": sorted(plan.processed_names),
        "logprob_k": logprob_k(target.vocab_size),
        # ATen's kernels compute the references: another path, other bf16 roundings (harness.kernel_path)
        "kernel_path": kernel_label(cpu_kernel_path()) if variant.device == "cpu" else variant.device,
        "reference_code": _reference_code_hash(),
        "versions": {k: versions.get(k) for k in ("torch", "transformers", "transformer-lens")},
        # an encoder's token types are inputs too (overlays.base.Encoder); absent for every causal LM
        **({"token_types": types} if (types := plan.token_types(prompts)) is not None else {}),
    }


def key(man: dict) -> str:
    return hashlib.sha256(json.dumps(man, sort_keys=True).encode()).hexdigest()[:20]


class ReferenceStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, man: dict) -> Path:
        return self.root / man["model"] / key(man)

    def load(self, man: dict):
        """The stored references of ``man``, or None where none are stored."""
        from safetensors.torch import load_file

        from harness.comparison.chaos import event_from_dict
        from harness.references.reference import ReferenceCapture

        folder = self.path(man)
        if not (folder / "entry.json").is_file():
            return None
        entry = json.loads((folder / "entry.json").read_text())
        if entry["manifest"] != man:  # a hash collision or a hand-edited entry: never trust it
            raise ValueError(f"{folder}: stored manifest differs from this run's; delete the folder")
        flat = load_file(str(folder / "tensors.safetensors"))
        stores: dict[str, dict] = {s: {} for s in _STORES}
        logprobs: dict[int, torch.Tensor] = {}
        for name, tensor in flat.items():
            store, p, hook = name.split("/", 2)
            if store == "logprobs":
                logprobs[int(p)] = tensor
            else:
                stores[store].setdefault(int(p), {})[hook] = tensor
        return ReferenceCapture(
            bridge=stores["bridge"], compat=stores["compat"], logprobs=logprobs, hf=stores["hf"],
            floors=entry["floors"], meta={**entry["meta"], "stored": str(folder)},
            floor_stats=entry["floor_stats"], compat_processed=stores["compat_processed"],
            chaos=[event_from_dict(c) for c in entry["chaos"]])

    def save(self, refs, man: dict) -> Path:
        """Write ``refs`` under ``man``'s key (atomically: a temporary folder, then a rename)."""
        from safetensors.torch import save_file

        # clone: the references hold aliases (one tensor under two hook names), which safetensors refuses
        flat = {f"{store}/{p}/{hook}": t.detach().clone().contiguous() for store in _STORES
                for p, hooks in (getattr(refs, store) or {}).items() for hook, t in hooks.items()}
        flat.update({f"logprobs/{p}/-": t.detach().clone().contiguous() for p, t in refs.logprobs.items()})
        folder = self.path(man)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
        save_file(flat, str(tmp / "tensors.safetensors"))
        entry = {"manifest": man, "floors": refs.floors, "floor_stats": refs.floor_stats,
                 "chaos": [c.to_dict() for c in refs.chaos],
                 "meta": {k: v for k, v in refs.meta.items() if _jsonable(v)}}
        (tmp / "entry.json").write_text(json.dumps(entry, indent=1, allow_nan=True))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        return folder


def _jsonable(value) -> bool:
    try:
        json.dumps(value, allow_nan=True)
        return True
    except (TypeError, ValueError):
        return False
