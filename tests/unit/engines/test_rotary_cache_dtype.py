"""The mechanism of the known vLLM 0.20.2 bug declared on ``modernbert`` for float32 on CUDA ("ModernBERT rotary tables
in float16"): vLLM's ``RotaryEmbedding`` casts its cos / sin cache to the dtype it is built with (``cache.to(dtype)``),
so a rotary built with ``dtype=torch.float16`` (vLLM 0.20.2's ModernBertAttention) rotates float32 queries with
float16-rounded tables.  Checked here with the installed vLLM's own class on the CPU (its native path, the same
arithmetic as the CUDA op), at the row's shape (4 heads of 32, 248 tokens, the global layer's theta 160000): the error
against the float32 tables is of float16's rounding (its unit roundoff is 4.9e-4), the size the H200 run measured at
the first layer's attention output (5.0e-4, docs/gpu/evidence/modernbert-rotary-fp16-2026-12-04).
Contract: the day vLLM stops rounding its tables to the dtype it is given, this test fails."""
from __future__ import annotations

import pytest
import torch

from harness.models.families import FAMILIES, known_bug_on


def _rows_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()).norm(dim=-1) / b.double().norm(dim=-1)).max())


def test_a_float16_rotary_cache_rounds_float32_queries_as_declared():
    pytest.importorskip("vllm", reason="vllm is not installed: its rotary class cannot be checked")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    T, H, D = 248, 4, 32
    params = {"rope_type": "default", "rope_theta": 160000.0}
    with set_current_vllm_config(VllmConfig()):
        half = get_rope(D, max_position=256, rope_parameters=params, dtype=torch.float16)
        full = get_rope(D, max_position=256, rope_parameters=params, dtype=torch.float32)
    assert half.cos_sin_cache.dtype == torch.float16 and full.cos_sin_cache.dtype == torch.float32
    gen = torch.Generator().manual_seed(0)
    pos = torch.arange(T)
    q, k = torch.randn(T, H * D, generator=gen), torch.randn(T, H * D, generator=gen)
    q16, k16 = half.forward_native(pos, q.clone(), k.clone())
    q32, k32 = full.forward_native(pos, q.clone(), k.clone())
    err = max(_rows_rel(q16.view(T, H, D), q32.view(T, H, D)), _rows_rel(k16.view(T, H, D), k32.view(T, H, D)))
    assert 1e-4 <= err <= 1e-3, f"float16 tables rotate float32 q / k off by {err:.3g}, not float16's rounding"
    assert known_bug_on(FAMILIES["modernbert"].known_vllm_bug, "float32", "cuda").name.startswith(
        "ModernBERT rotary tables in float16")
