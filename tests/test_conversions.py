"""Unit tests of overlay conversions (pure, small tensors)."""
import pytest
import torch

from harness.comparison.conversions import convert
from overlays.base import Cols, Heads, HookSpec, Mul, UnfoldNorm


def test_unfold_norm_divides_by_weight_plus_offset():
    w = torch.tensor([0.5, -0.25])
    x = torch.tensor([[1.0, 3.0]])
    spec = HookSpec("m", "out[0]", (UnfoldNorm("n.weight", 1.0),))
    assert torch.allclose(convert(spec, x, {"n.weight": w}), torch.tensor([[1 / 1.5, 3 / 0.75]]))
    spec0 = HookSpec("m", "out[0]", (UnfoldNorm("n.weight"),))
    assert torch.allclose(convert(spec0, x, {"n.weight": w}), torch.tensor([[2.0, -12.0]]))


def test_unfold_norm_missing_param_names_it():
    with pytest.raises(KeyError, match="n.weight"):
        convert(HookSpec("m", "out", (UnfoldNorm("n.weight"),)), torch.ones(1, 2), {})


def test_mul_rounds_factor_to_dtype():
    x = torch.ones(2, dtype=torch.bfloat16)
    out = convert(HookSpec("m", "out", (Mul(128 ** 0.5),)), x, {})
    assert out.dtype == torch.bfloat16
    assert out[0] == torch.tensor(128 ** 0.5, dtype=torch.bfloat16)


def test_cols_then_heads_splits_fused_qkv():
    t, n_q, n_kv, d = 3, 4, 2, 8
    q = torch.randn(t, n_q * d)
    k = torch.randn(t, n_kv * d)
    v = torch.randn(t, n_kv * d)
    fused = torch.cat([q, k, v], dim=-1)
    qs, ks = n_q * d, n_kv * d
    got_k = convert(HookSpec("qkv", "out[0]", (Cols(qs, qs + ks), Heads(n_kv, d))), fused, {})
    assert got_k.shape == (t, n_kv, d)
    assert torch.equal(got_k, k.view(t, n_kv, d))
    got_v = convert(HookSpec("qkv", "out[0]", (Cols(qs + ks, qs + 2 * ks), Heads(n_kv, d))), fused, {})
    assert torch.equal(got_v, v.view(t, n_kv, d))


def test_layernorm_unfold_subtracts_bias_then_divides():
    from overlays.base import UnfoldNorm

    w, b = torch.tensor([2.0, 0.5]), torch.tensor([1.0, -1.0])
    normalized = torch.tensor([[0.3, -0.7]])
    y = normalized * w + b  # what vLLM's LayerNorm returns
    spec = HookSpec("ln", "out", (UnfoldNorm("ln.weight", bias="ln.bias"),))
    assert torch.allclose(convert(spec, y, {"ln.weight": w, "ln.bias": b}), normalized)
    assert spec.params() == ["ln.weight", "ln.bias"] or set(spec.params()) == {"ln.weight", "ln.bias"}


def test_drop_batch_and_swap_axes():
    from overlays.base import DropBatch, SwapAxes

    x = torch.randn(1, 5, 2, 3)
    out = convert(HookSpec("m", "out", (DropBatch(), SwapAxes(0, 1))), x, {})
    assert out.shape == (2, 5, 3) and torch.equal(out, x[0].transpose(0, 1))
    with pytest.raises(ValueError, match="batch dim of 1"):
        convert(HookSpec("m", "out", (DropBatch(),)), torch.randn(2, 5), {})


def test_unknown_conversion_is_a_type_error():
    from harness.comparison.conversions import apply_one

    with pytest.raises(TypeError, match="unknown conversion"):
        apply_one(object(), torch.ones(1), {})
