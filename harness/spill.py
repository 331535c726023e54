"""Captures spilled to disk: written in shards as they are made, read back one tensor at a time.

Contract: :class:`SpilledTensors` is a read-only ``Mapping[str, torch.Tensor]`` (``in``, ``get``,
``items``, ``len``) over safetensors shards in one folder.  :meth:`SpilledTensors.add` writes one
shard (a dict of tensors) and indexes its keys; ``spilled[key]`` reads that one tensor back from
disk into a fresh tensor, every time (nothing is cached, so what is held is what the caller holds).
:meth:`SpilledTensors.adopt` indexes a shard another process wrote (the vLLM subject's) and takes
it over.

Why: a run's captures (every hook, every prompt, five engines) are several times the model's
size (SmolLM2-135M fp32: about 2.2 GB against 0.54 GB of weights); held whole they set the
run's peak memory.  On disk, only the tensors a comparison is using are in memory.

Traps:

* Reads use plain file reads, not ``mmap`` (safetensors' own ``safe_open`` maps the file, and
  every page read through a mapping stays in this process's RSS until the kernel reclaims it:
  the measured peak would not fall).  The shard format is safetensors' (an 8-byte header
  length, a JSON header of dtype, shape and byte offsets, the data), so any safetensors reader
  reads the shards too.
* No file stays open between reads (a pytest session keeps every run's captures: open handles
  would pile up against ``ulimit -n``).  The shards are the mapping's: they are deleted when it is
  garbage-collected (``weakref.finalize``, at the latest when Python exits), and ``owns`` names a
  folder deleted with it (the vLLM subject's work folder).  So nothing may delete a folder a live
  mapping reads from.
* :meth:`release` deletes the shards before the mapping dies (a pytest session releases every run
  no later test reads: harness.frontends.pytest_plugin).  A released mapping raises
  :class:`ReleasedError` on every read, never an empty answer: a reader the session did not
  know of fails with the fix named, instead of seeing every capture "missing".
* safetensors refuses tensors that share memory (the bridge caches one tensor under two hook
  names) and non-contiguous views: :meth:`add` writes each distinct storage once and a later
  key that shares one is cloned.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import struct
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_COUNTER = itertools.count()
# every mapping alive, by a serial (a Mapping is unhashable: no WeakSet), for release_all
_LIVE: "weakref.WeakValueDictionary[int, SpilledTensors]" = weakref.WeakValueDictionary()


def _header(handle) -> tuple[dict, int]:
    """A safetensors file's header (key -> dtype, shape, data_offsets) and where its data starts."""
    handle.seek(0)
    (n,) = struct.unpack("<Q", handle.read(8))
    header = json.loads(handle.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def _remove(paths: list[Path], folders: list[Path], parent: Path) -> None:
    """A mapping's finalizer: its shards, the folders it owns, and its write folder once empty."""
    for path in paths:
        try:
            path.unlink()
        except OSError:
            pass
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        parent.rmdir()  # only when empty: other mappings may write to the same folder
    except OSError:
        pass


class ReleasedError(RuntimeError):
    """A read of captures whose shards :meth:`SpilledTensors.release` deleted."""


class SpilledTensors(Mapping):
    def __init__(self, folder: str | os.PathLike, name: str = "captures", owns: str | os.PathLike | None = None):
        """``folder``: where :meth:`add` writes; ``owns``: a folder deleted with this mapping."""
        self.folder, self.name = Path(folder), name
        self._index: dict[str, tuple[Path, dict, int]] = {}  # key -> (shard, entry, data start)
        self._paths: list[Path] = []
        self._folders: list[Path] = [Path(owns)] if owns is not None else []
        self._finalizer = weakref.finalize(self, _remove, self._paths, self._folders, self.folder)
        self._released = False
        _LIVE[next(_COUNTER)] = self

    def add(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Write ``tensors`` as one new shard and index them (a key written again is replaced)."""
        if not tensors:
            return
        from safetensors.torch import save_file

        seen: set[int] = set()
        out: dict[str, torch.Tensor] = {}
        for key, value in tensors.items():
            t = value.detach().cpu().contiguous()
            ptr = t.untyped_storage().data_ptr()
            out[key] = t.clone() if ptr in seen and t.numel() else t
            seen.add(ptr)
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{self.name}-{os.getpid()}-{next(_COUNTER)}.safetensors"
        save_file(out, str(path))
        self.adopt(path)

    def adopt(self, path: str | os.PathLike) -> None:
        """Index a safetensors shard (written here or by another process); it is this mapping's now."""
        path = Path(path)
        with open(path, "rb") as handle:
            header, start = _header(handle)
        self._paths.append(path)
        for key, entry in header.items():
            self._index[key] = (path, entry, start)

    def _live(self) -> dict[str, tuple[Path, dict, int]]:
        if self._released:
            raise ReleasedError(f"the {self.name} spilled in {self.folder} were released (their shards deleted) "
                                "before this read (in a pytest session, a test that reads a run's captures after its "
                                "report declares it: pytest.mark.reads_captures((model, dtype, compiled)))")
        return self._index

    def __getitem__(self, key: str) -> torch.Tensor:
        path, entry, start = self._live()[key]
        begin, end = entry["data_offsets"]
        dtype = _DTYPES[entry["dtype"]]
        if end == begin:
            return torch.empty(entry["shape"], dtype=dtype)
        with open(path, "rb") as handle:
            handle.seek(start + begin)
            data = bytearray(handle.read(end - begin))
        return torch.frombuffer(data, dtype=dtype).reshape(entry["shape"])

    def __iter__(self) -> Iterator[str]:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def __contains__(self, key: object) -> bool:
        return key in self._live()

    def nbytes(self) -> int:
        """What the tensors take on disk (and would take in memory, all loaded)."""
        return sum(e["data_offsets"][1] - e["data_offsets"][0] for _, e, _ in self._index.values())

    def release(self) -> None:
        """Delete the shards (and the owned folder) now; every later read raises :class:`ReleasedError`."""
        self._index.clear()
        self._released = True
        self._finalizer()


def release_all() -> int:
    """Release every live mapping (their shards and owned folders deleted): for an exit that skips the
    interpreter's finalization (``os._exit``: harness/__main__.py on an interrupt), which would otherwise leave
    every run's captures on disk.  The count released."""
    live = [m for m in list(_LIVE.values()) if not m._released]
    for mapping in live:
        mapping.release()
    return len(live)


def release_spills(value: object) -> int:
    """Release every :class:`SpilledTensors` inside ``value`` (walking dataclasses, mappings, lists and
    tuples); the count released.  Plain tensors are left to the garbage collector."""
    if isinstance(value, SpilledTensors):
        if value._released:
            return 0
        value.release()
        return 1
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(release_spills(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, Mapping):
        return sum(release_spills(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(release_spills(v) for v in value)
    return 0
