"""Captures spilled to disk: written in shards as they are made, read back one tensor at a time.

Contract: :class:`SpilledTensors` is a read-only ``Mapping[str, torch.Tensor]`` (``in``, ``get``,
``items``, ``len``) over safetensors shards in one folder.  :meth:`SpilledTensors.add` writes one
shard (a dict of tensors) and indexes its keys; ``spilled[key]`` reads that one tensor back from
disk into a fresh tensor, every time (nothing is cached, so what is held is what the caller holds).
:meth:`SpilledTensors.adopt` indexes a shard another process wrote (the vLLM subject's).

Why: a run's captures (every hook, every prompt, five engines) are several times the model's
size (SmolLM2-135M fp32: about 2.2 GB against 0.54 GB of weights); held whole they set the
run's peak memory.  On disk, only the tensors a comparison is using are in memory.

Traps:

* Reads use plain file reads, not ``mmap`` (safetensors' own ``safe_open`` maps the file, and
  every page read through a mapping stays in this process's RSS until the kernel reclaims it:
  the measured peak would not fall).  The shard format is safetensors' (an 8-byte header
  length, a JSON header of dtype, shape and byte offsets, the data), so any safetensors reader
  reads the shards too.
* Each shard's file stays open; the folder may be deleted right after the captures are made
  (harness.pipeline.runner does): open files stay readable on Linux and macOS, and the disk
  space is freed when the last reader is garbage-collected.
* safetensors refuses tensors that share memory (the bridge caches one tensor under two hook
  names) and non-contiguous views: :meth:`add` writes each distinct storage once and a later
  key that shares one is cloned.
"""
from __future__ import annotations

import itertools
import json
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_COUNTER = itertools.count()


def _header(handle) -> tuple[dict, int]:
    """A safetensors file's header (key -> dtype, shape, data_offsets) and where its data starts."""
    handle.seek(0)
    (n,) = struct.unpack("<Q", handle.read(8))
    header = json.loads(handle.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


class SpilledTensors(Mapping):
    def __init__(self, folder: str | os.PathLike, name: str = "captures"):
        self.folder, self.name = Path(folder), name
        self._index: dict[str, tuple[object, dict, int]] = {}  # key -> (open file, entry, data start)

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
        """Index a safetensors shard written elsewhere; its file stays open for reading."""
        handle = open(path, "rb")  # noqa: SIM115 -- held for the mapping's life (see the module's traps)
        header, start = _header(handle)
        for key, entry in header.items():
            self._index[key] = (handle, entry, start)

    def __getitem__(self, key: str) -> torch.Tensor:
        handle, entry, start = self._index[key]
        begin, end = entry["data_offsets"]
        handle.seek(start + begin)
        data = bytearray(handle.read(end - begin))
        dtype = _DTYPES[entry["dtype"]]
        if not data:
            return torch.empty(entry["shape"], dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(entry["shape"])

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def nbytes(self) -> int:
        """What the tensors take on disk (and would take in memory, all loaded)."""
        return sum(e["data_offsets"][1] - e["data_offsets"][0] for _, e, _ in self._index.values())
