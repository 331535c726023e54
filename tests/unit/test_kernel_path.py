"""harness.kernel_path: the kernel path's name, oneDNN's effective ISA, and the AVX2 emulation's
refusals (pure; the emulated engine run is tests/engine/test_numerics.py's)."""
from __future__ import annotations

import pytest

from harness import kernel_path as kp


def test_labels_name_the_vllm_library_and_the_attention_isa():
    assert kp.label({"vllm_library": "_C_AVX2", "attention": "vec"}) == "avx2"
    assert kp.label({"vllm_library": "_C_AVX512", "attention": "vec"}) == "avx512"
    assert kp.label({"vllm_library": "_C", "attention": "vec"}) == "avx512-bf16"
    assert kp.label({"vllm_library": "_C", "attention": "amx"}) == "avx512-bf16-amx"
    assert kp.label({"vllm_library": "_C_AVX2", "emulated": "avx2"}) == "avx2-emulated"
    assert kp.label({"device": "cuda", "attention": "FLASH_ATTN", "graphs": "piecewise"}) == \
        "cuda-FLASH_ATTN-piecewise"
    assert kp.label(None) == "unknown"
    assert kp.label({"aten_capability": "AVX2"}) == "avx2"  # references only: ATen's capability


def test_onednn_isa_is_the_cpu_s_best_capped_by_its_environment_variable(monkeypatch):
    flags = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"}
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert kp._onednn_isa(flags) == "AVX512_CORE_BF16"
    assert kp._onednn_isa({"avx2"}) == "AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert kp._onednn_isa(flags) == "AVX2"
    assert kp._onednn_isa({"avx2"}) == "AVX2"


def test_the_emulation_needs_its_environment_before_the_process_starts(monkeypatch):
    monkeypatch.setenv(kp.EMULATE_ENV, "avx2")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    with pytest.raises(kp.EmulationError, match="ATEN_CPU_CAPABILITY=avx2"):
        kp.apply_emulation()
    with pytest.raises(kp.EmulationError, match="only avx2"):
        kp.emulated_env("avx512")
    monkeypatch.delenv(kp.EMULATE_ENV)
    assert kp.apply_emulation() is None


def test_this_process_describes_its_kernel_path():
    path = kp.cpu_kernel_path()
    assert path["aten_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR", "VSX", "SVE256")
    assert isinstance(path["cpu_avx512"], bool) and path["emulated"] is None
