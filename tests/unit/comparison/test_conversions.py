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


@pytest.mark.parametrize("offset,weight,bias", [(1.0, -1.0, None), (0.0, 0.0, None), (0.0, 0.0, "n.bias")],
                         ids=["gemma-1+w", "w", "layernorm-w-and-bias"])
def test_a_divisor_of_zero_converts_to_zero_and_is_named_left_out(offset, weight, bias):
    """A trained Gemma-3 holds norm weights of exactly -1: ``1 + w = 0``.  vLLM's ``x * 0`` holds no value
    to un-fold: 0 there, and :func:`left_out` names the dimension (the row leaves it out)."""
    from harness.comparison.conversions import left_out

    params = {"n.weight": torch.tensor([0.5, weight, 2.0])}
    b = torch.tensor([0.1, 0.2, 0.3])
    if bias:
        params[bias] = b
    x_hat = torch.tensor([[1.0, 4.0, -2.0]])
    scale = params["n.weight"] + offset
    raw = x_hat * scale + (b if bias else 0.0)  # what vLLM computes; the middle entry: 0 (+ its bias)
    spec = HookSpec("m", "out", (UnfoldNorm("n.weight", offset, bias=bias),))
    out = convert(spec, raw, params)
    assert torch.isfinite(out).all() and out[0, 1] == 0
    assert torch.allclose(out[0, [0, 2]], x_hat[0, [0, 2]])
    mask, why = left_out(spec, params)
    assert mask.tolist() == [False, True, False] and "= 0" in why
    assert left_out(HookSpec("m", "out", (UnfoldNorm("n.weight", offset, bias=bias),)),
                    {**params, "n.weight": torch.tensor([0.5, 0.7, 2.0])}) is None


def test_a_nonzero_read_where_the_divisor_is_zero_stays_non_finite():
    """vLLM wrote something where the weight says 0: not hidden as left out, the division's inf stays."""
    spec = HookSpec("m", "out", (UnfoldNorm("n.weight", 1.0),))
    out = convert(spec, torch.tensor([[1.0, 0.5]]), {"n.weight": torch.tensor([0.0, -1.0])})
    assert out[0, 0] == 1.0 and out[0, 1] == float("inf")
