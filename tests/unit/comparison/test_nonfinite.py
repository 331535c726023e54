"""harness.comparison.nonfinite: the first NaN / infinity of a capture, where it sits, and the
sentence an error row carries.

Contracts checked: first_nonfinite returns ``(index, label)`` of the first non-finite entry in
row-major order ("NaN", "+inf", "-inf") or None (finite, empty, integer tensors); ``-inf`` is
allowed only when asked (masked attention scores, NEG_INF_KINDS) while NaN and +inf never are;
describe names the engine, hook, prompt and the position by axis name when the axes fit the
index, by raw index otherwise.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.comparison.nonfinite import NEG_INF_KINDS, describe, first_nonfinite


def test_finite_empty_and_integer_tensors_have_none():
    assert first_nonfinite(torch.zeros(3, 4)) is None
    assert first_nonfinite(torch.empty(0, 4)) is None
    assert first_nonfinite(torch.tensor([1, 2, 3])) is None
    assert first_nonfinite(torch.full((2, 2), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)) is None


@pytest.mark.parametrize("value, label", [(math.nan, "NaN"), (math.inf, "+inf"), (-math.inf, "-inf")])
def test_label_and_index(value, label):
    t = torch.zeros(3, 4)
    t[1, 2] = value
    assert first_nonfinite(t) == ((1, 2), label)


def test_first_in_row_major_order():
    t = torch.zeros(2, 3, 4)
    t[1, 0, 0] = math.nan
    t[0, 2, 3] = math.inf
    t[0, 2, 1] = -math.inf
    assert first_nonfinite(t) == ((0, 2, 1), "-inf")
    assert first_nonfinite(t, allow_neg_inf=True) == ((0, 2, 3), "+inf")


def test_neg_inf_allowed_only_when_asked_and_never_nan_or_pos_inf():
    scores = torch.tensor([[0.5, -math.inf], [0.1, 0.2]])
    assert first_nonfinite(scores, allow_neg_inf=True) is None
    assert first_nonfinite(scores) == ((0, 1), "-inf")
    scores[1, 1] = math.nan
    assert first_nonfinite(scores, allow_neg_inf=True) == ((1, 1), "NaN")
    scores[1, 1] = math.inf
    assert first_nonfinite(scores, allow_neg_inf=True) == ((1, 1), "+inf")


def test_low_precision_and_one_dim():
    t = torch.zeros(5, dtype=torch.bfloat16)
    t[3] = math.nan
    assert first_nonfinite(t) == ((3,), "NaN")
    h = torch.zeros(2, 2, dtype=torch.float16)
    h[0, 1] = 70000.0  # overflows fp16 to +inf
    assert first_nonfinite(h) == ((0, 1), "+inf")


def test_neg_inf_kinds_are_the_attention_scores():
    assert NEG_INF_KINDS == frozenset({"attn.hook_attn_scores"})
    assert "attn.hook_pattern" not in NEG_INF_KINDS  # a pattern is a softmax: -inf there is a bug


def test_describe_with_axes():
    msg = describe("vLLM", "blocks.3.hook_out", 2, ((5, 7), "NaN"), ("pos", "d"))
    assert msg == "NaN in vLLM's blocks.3.hook_out at prompt 2, [pos=5, d=7]"


def test_describe_with_head_axes():
    msg = describe("TransformerBridge", "blocks.0.attn.hook_q", 0, ((1, 2, 3), "+inf"), ("pos", "head", "d_head"))
    assert msg == "+inf in TransformerBridge's blocks.0.attn.hook_q at prompt 0, [pos=1, head=2, d_head=3]"


def test_describe_axes_that_do_not_fit_give_the_raw_index():
    assert describe("HF", "log-probs", 1, ((4, 9), "-inf"), ("pos",)) == "-inf in HF's log-probs at prompt 1, [[4, 9]]"
    assert describe("HF", "x", 0, ((4,), "NaN")) == "NaN in HF's x at prompt 0, [[4]]"


def test_round_trip_first_nonfinite_into_describe():
    t = torch.ones(4, 3)
    t[2, 0] = math.nan
    assert describe("vLLM", "embed.hook_out", 0, first_nonfinite(t), ("pos", "d")) == \
        "NaN in vLLM's embed.hook_out at prompt 0, [pos=2, d=0]"
