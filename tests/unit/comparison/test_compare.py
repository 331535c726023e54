"""Unit tests of the pure comparison functions."""
import math

import pytest
import torch

from harness.comparison.compare import ShapeMismatch, argmax_agreement, compare_tensors, failure_message
from harness.comparison.gate import Band


def test_identical_tensors_have_zero_error():
    x = torch.randn(5, 8)
    m = compare_tensors(x, x.clone())
    assert m.max_abs == 0 and m.rel_err == 0 and m.cos_min == pytest.approx(1.0)
    assert Band(1e-4, 0.0, 1e-4, 0.0, 1e-4, 0.0, ceiling=0.25).exceeded(m.rel_err, m.rel_median, m.scale_median) == ()


def test_worst_position_and_values_are_reported():
    ref = torch.ones(4, 3)
    subj = ref.clone()
    subj[2, 1] = 1.5
    m = compare_tensors(subj, ref)
    assert m.worst_index == (2, 1)
    assert m.subject_at_worst == 1.5 and m.reference_at_worst == 1.0
    assert m.rel_err == pytest.approx(0.5 / 3 ** 0.5)  # ||(0, .5, 0)|| / ||(1, 1, 1)|| in row 2
    msg = failure_message("x", m, 1e-4, ("pos", "d"))
    assert "pos=2" in msg and "d=1" in msg and "1.0e-04" in msg and "5.000e-01" in msg


def test_error_is_localized_to_the_worst_row_not_diluted():
    ref = torch.randn(64, 32)
    subj = ref.clone()
    subj[40] *= 1.1  # one token off by 10%
    m = compare_tensors(subj, ref)
    assert m.rel_err == pytest.approx(0.1, rel=1e-6) and m.worst_index[0] == 40


def test_relative_error_uses_reference_scale():
    ref = torch.full((3, 3), 100.0)
    m = compare_tensors(ref + 1e-3, ref)
    assert m.rel_err == pytest.approx(1e-5, rel=1e-3)


def test_nan_in_reference_is_ignored_nan_in_subject_is_infinite():
    ref = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    assert compare_tensors(torch.tensor([[1.0, 99.0], [2.0, 3.0]]), ref).max_abs == 0
    bad = compare_tensors(torch.tensor([[float("nan"), 0.0], [2.0, 3.0]]), ref)
    assert math.isinf(bad.max_abs) and Band(1.0).exceeded(bad.rel_err, math.nan, math.nan) == ("worst",)


def test_shape_mismatch_raises_with_both_shapes():
    with pytest.raises(ShapeMismatch, match=r"\(2, 3\).*\(3, 2\)"):
        compare_tensors(torch.zeros(2, 3), torch.zeros(3, 2))


def test_argmax_agreement():
    ref = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    assert argmax_agreement(ref.clone(), ref) == (2, 2, True, True)
    assert argmax_agreement(torch.tensor([[0.0, 1.0], [0.0, 1.0]]), ref, k=1) == (1, 2, False, False)
    # with top-2 over a vocab of 2 every flip is a near tie
    assert argmax_agreement(torch.tensor([[0.0, 1.0], [0.0, 1.0]]), ref, k=2) == (1, 2, False, True)


def test_masked_infinities_must_match_and_add_no_scale():
    ref = torch.tensor([[1.0, -math.inf], [2.0, 3.0]])
    assert compare_tensors(ref.clone(), ref).max_abs == 0
    m = compare_tensors(torch.tensor([[1.0, -5.0], [2.0, 3.0]]), ref)
    assert math.isinf(m.rel_err) and m.worst_index == (0, 1)


def test_finite_fast_path_gives_the_masked_paths_values_bitwise():
    from harness.comparison.compare import _masked, _unravel

    g = torch.Generator().manual_seed(0)
    for shape in [(7, 33), (3, 5, 11), (13,), ()]:
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        for s in (r + 1e-3 * torch.randn(shape, generator=g, dtype=torch.float64),
                  torch.where(torch.rand(shape, generator=g) < 0.2, torch.tensor(float("nan"), dtype=torch.float64),
                              r)):
            fast, general = _masked(s, r), _masked(s, r, general=True)
            for a, b in zip(fast[:5], general[:5]):
                assert torch.equal(a.reshape(-1).nan_to_num(), b.reshape(-1).nan_to_num())
                assert torch.equal(torch.isinf(a.reshape(-1)), torch.isinf(b.reshape(-1)))
            assert fast[5] is None and general[5] is None  # every entry compared
    for flat, shape in [(0, (2, 3)), (5, (2, 3)), (29, (2, 3, 5)), (4, (7,))]:
        assert _unravel(flat, shape) == tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))


def test_rows_set_aside_do_not_drag_the_guard_down():
    """The one-entry row guard is a tenth of the median norm of the rows compared.  A reference whose later
    query rows are all set aside (NaN from an event on) must measure its first query's near-zero row as the
    same reference without those rows does: against the guard, not raw (measured on a Qwen3-Next shape in
    bf16: the guard fell below a score of -0.037 whose condition number was 150, and read rel 0.37)."""
    t = 8
    ref = torch.full((t, t), -math.inf, dtype=torch.float64)
    for q in range(t):
        ref[q, : q + 1] = torch.linspace(1.0, 2.0, q + 1, dtype=torch.float64)
    ref[0, 0] = -0.037  # the first query's one entry, near zero
    sub = ref.clone()
    sub[0, 0] = -0.023
    whole = compare_tensors(sub, ref)
    aside_ref, aside_sub = ref.clone(), sub.clone()
    aside_ref[3:] = math.nan  # every query from 3 on set aside in the reference
    aside_sub[3:] = 0.0
    aside = compare_tensors(aside_sub, aside_ref)
    kept = sorted([0.037, math.sqrt(1 + 4), math.sqrt(1 + 1.5 ** 2 + 4)])  # rows 0-2, the rows compared
    assert math.isclose(aside.rel_err, 0.014 / (0.1 * kept[1]), rel_tol=1e-9)  # against the guard: 0.063
    assert whole.rel_err < 0.1  # and the whole reference's guard too
    # counted as zero norms, the five rows set aside would have made the median 0 and the row read 0.014 / 0.037


def test_all_finite_is_exact_or_falls_back():
    from harness.comparison.compare import all_finite

    x = torch.ones(4, 5)
    assert all_finite(x)
    for bad in (math.nan, math.inf, -math.inf):
        y = x.clone()
        y[2, 3] = bad
        assert not all_finite(y)
    # finite entries whose sum overflows: "not all finite" sends the caller to its exact path
    big = torch.full((4,), 3e38)
    assert not all_finite(big)
    assert compare_tensors(big, big).rel_err == 0.0
    assert all_finite(torch.arange(5))  # integers hold no NaN


def test_top_k_mask_keeps_each_row_s_k_largest_entries():
    from harness.comparison.compare import top_k_mask

    lp = torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 4.0, 3.0, 2.0]], dtype=torch.float64), -1)
    masked = top_k_mask(lp, 2)
    assert torch.isnan(masked).sum() == 4
    assert not torch.isnan(masked[0, 1]) and not torch.isnan(masked[0, 3])
    assert not torch.isnan(masked[1, 0]) and not torch.isnan(masked[1, 1])


def _row_norms_allocating(x: torch.Tensor, squares: torch.Tensor) -> torch.Tensor:
    return x.pow(2).sum(-1).sqrt()


def test_shared_square_buffer_gives_the_allocating_forms_metrics_bitwise(monkeypatch):
    """compare_tensors squares into one buffer (harness.comparison.compare._row_norms); every metric must be
    the one the allocating ``x.pow(2)`` gives, bit for bit: contiguous and strided inputs, float32 and
    float64, NaN and infinities in either side, a vocabulary-wide row, 1-d and 0-d tensors."""
    import struct

    import harness.comparison.compare as compare

    g = torch.Generator().manual_seed(1)

    def bits(m) -> tuple:
        return tuple(struct.pack("<d", v) if isinstance(v, float) else v for v in m.to_dict().values())

    def cases():
        for shape in [(6, 1000), (3, 4, 65), (2, 300_001), (9,), ()]:
            for dtype in (torch.float32, torch.float64):
                r = torch.randn(shape, generator=g).to(dtype)
                s = r + 1e-3 * torch.randn(shape, generator=g).to(dtype)
                yield s, r
                if len(shape) == 2 and shape[0]:
                    yield s.T.contiguous().T, r.T.contiguous().T  # strided: a transposed layout
                    yield s[:, ::2], r[:, ::2]  # a strided last dim
                    nan_r = r.clone()
                    nan_r[0, : shape[1] // 2] = float("nan")  # entries the reference did not return
                    yield s, nan_r
                    inf_both = r.clone()
                    inf_both[-1, 0] = -math.inf  # a masked score, held by both sides
                    inf_s = s.clone()
                    inf_s[-1, 0] = -math.inf
                    yield inf_s, inf_both
                    bad = s.clone()
                    bad[0, 1] = float("nan")  # a NaN in the subject only
                    yield bad, r

    pairs = list(cases())
    fast = [bits(compare.compare_tensors(s, r)) for s, r in pairs]
    monkeypatch.setattr(compare, "_row_norms", _row_norms_allocating)
    slow = [bits(compare.compare_tensors(s, r)) for s, r in pairs]
    assert fast == slow
