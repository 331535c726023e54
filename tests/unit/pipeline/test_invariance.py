"""harness.pipeline.invariance.compare_logprobs: what counts as a difference between a capture-on and
a capture-off run (every value bitwise, the NaN pattern, a missing prompt, a shape, the greedy token).
The engines' run: tests/engine/test_capture_invariance.py."""
from __future__ import annotations

import torch

from harness.pipeline.invariance import compare_logprobs


# -- the comparison itself ---------------------------------------------------------
def _lp(seed: int = 0, t: int = 3, v: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(t, v, generator=g, dtype=torch.float64), dim=-1)


def test_identical_log_probs_are_identical():
    a = {0: _lp(0), 1: _lp(1)}
    b = {k: v.clone() for k, v in a.items()}
    b[1][0, 2] = float("nan")
    a[1][0, 2] = float("nan")  # the same NaN (not returned) on both sides
    r = compare_logprobs(a, b)
    assert r.identical and r.n_differing == 0 and r.max_abs_diff == 0.0 and r.first_difference is None
    assert r.n_compared == 2 * 18 - 1 and r.greedy_on == r.greedy_off


def test_one_ulp_is_a_difference():
    a = {0: _lp(0), 1: _lp(1)}
    b = {k: v.clone() for k, v in a.items()}
    b[1][2, 4] = torch.nextafter(b[1][2, 4], torch.tensor(0.0, dtype=torch.float64))
    r = compare_logprobs(a, b)
    assert not r.identical and r.n_differing == 1
    assert 0 < r.max_abs_diff < 1e-15
    assert r.first_difference.startswith("prompt 1 row 2 token 4:"), r.first_difference


def test_signed_zero_nan_pattern_missing_prompt_and_shape_are_differences():
    a, b = {0: _lp(0)}, {0: _lp(0)}
    a[0][0, 0], b[0][0, 0] = 0.0, -0.0  # equal as numbers, not as bits
    assert compare_logprobs(a, b).n_differing == 1
    a, b = {0: _lp(0)}, {0: _lp(0)}
    b[0][1, 3] = float("nan")
    r = compare_logprobs(a, b)
    assert r.n_differing == 1 and "NaN (not returned) only in the capture-off run" in r.first_difference
    r = compare_logprobs({0: _lp(0), 1: _lp(1)}, {0: _lp(0)})
    assert r.n_differing == 1 and r.first_difference == "prompt 1: only in the capture-on run"
    r = compare_logprobs({0: _lp(0)}, {0: _lp(0, t=4)})
    assert r.n_differing == 1 and "shape/dtype" in r.first_difference


def test_a_changed_greedy_token_is_reported():
    a = {0: _lp(0)}
    b = {0: a[0].clone()}
    top = int(a[0][-1].argmax())
    b[0][-1, (top + 1) % 6] = 0.0  # now the most likely token
    r = compare_logprobs(a, b)
    assert r.token_mismatches == (0,) and r.greedy_on[0] == top and r.greedy_off[0] == (top + 1) % 6
    assert not r.identical and "greedy token mismatches at prompts [0]" in r.describe()
