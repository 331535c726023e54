"""harness.comparison.rows: one compared row from a case's per-prompt (vLLM, reference) pairs.

Contracts checked: compare_prompts keeps the worst prompt's worst row, the largest median row error
and the largest-by-size median scale deviation, and fails on each statistic with its own message
(the worst row only where its tolerance is at or below the ceiling; the median and the scale
whatever the ceiling); compared_row turns a ``problem`` or missing pairs into an ``error`` row,
sets aside explained events' tokens (a token-0 event drops the prompt), leaves out an all-NaN /
empty reference, is ``inconclusive`` when nothing is left, reports a shape mismatch as an error and
records the worst token; nonfinite_logprobs names HF's non-finite entry or vLLM's dead position;
pairs_of needs every prompt's capture.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from harness.comparison.gate import Band
from harness.comparison.rows import axes_of, compare_prompts, compared_row, nonfinite_logprobs, pairs_of
from harness.values.plan import Case

CASE = Case("bridge", "blocks.1.hook_out", "blocks.1.hook_out")
BAND = Band(tolerance=1e-3, floor=1e-5, tolerance_median=1e-3, floor_median=1e-6, tolerance_scale=1e-3,
            floor_scale=None, ceiling=0.25)


def _ref(t=4, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, d, generator=g, dtype=torch.float64) + 2.0


@dataclass
class Ev:
    prompt: int
    token: int
    explained: bool = True
    why: str = "a flip"

    def upstream_of(self, hook):
        return True

    def describe(self):
        return f"prompt {self.prompt}, token {self.token}"


def test_equal_pairs_pass_with_zero_error():
    r0, r1 = _ref(seed=0), _ref(5, seed=1)
    row = compared_row("toy", CASE, BAND, [(r0.clone(), r0), (r1.clone(), r1)])
    assert row.status == "pass" and row.message == ""
    assert (row.rel_err, row.max_abs, row.rel_median, row.scale_median) == (0.0, 0.0, 0.0, 0.0)
    assert row.tolerance == 1e-3 and row.floor == 1e-5 and row.floor_median == 1e-6


def test_the_worst_prompt_is_reported_and_the_message_names_its_position():
    r0, r1 = _ref(seed=0), _ref(seed=1)
    s1 = r1.clone()
    s1[2, 1] += 1.0
    row = compared_row("toy", CASE, BAND, [(r0.clone(), r0), (s1, r1)])
    assert row.status == "fail"
    assert row.worst["prompt"] == 1 and row.worst["index"] == [2, 1] and row.worst["axes"] == ["pos", "d"]
    assert row.worst["token"] == 2
    assert row.worst["subject"] == pytest.approx(float(r1[2, 1]) + 1.0)
    assert row.worst["reference"] == pytest.approx(float(r1[2, 1]))
    assert "worst at [prompt=1, pos=2, d=1]" in row.message
    assert row.message.startswith("toy blocks.1.hook_out vs bridge:blocks.1.hook_out: rel_err ")
    # one of four rows moved: the median row of prompt 1 is 0, the median statistic passes
    assert row.rel_median == 0.0 and "median row error" not in row.message


def test_a_systematic_error_fails_the_median_whatever_the_ceiling():
    band = Band(tolerance=0.6, floor=0.15, tolerance_median=1e-3, floor_median=None, tolerance_scale=10.0,
                ceiling=0.25)
    r = _ref()
    s = r + 0.1 * torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)  # every row moved, norms ~kept
    row = compared_row("toy", CASE, band, [(s, r)])
    assert row.status == "fail"
    # the worst row (tolerance above the ceiling) does not decide: only the median's sentence
    assert row.message.startswith("toy blocks.1.hook_out vs bridge:blocks.1.hook_out: median row error ")
    assert "rel_err" not in row.message and "(floor not measured)" in row.message
    assert row.message.endswith("an error across most rows, not a few chaotic ones")


def test_worst_row_above_an_ungated_tolerance_passes():
    band = Band(tolerance=0.6, floor=0.15, tolerance_median=0.1, floor_median=0.01, tolerance_scale=0.1,
                ceiling=0.25)
    r = _ref(8)
    s = r.clone()
    s[3] *= -1  # one chaotic token far off (rel 2.0 > 0.6), the rest exact
    row = compared_row("toy", CASE, band, [(s, r)])
    assert row.status == "pass" and row.rel_err == pytest.approx(2.0) and row.rel_median == 0.0


def test_a_scale_error_fails_on_the_scale():
    band = Band(tolerance=1.0, floor=None, tolerance_median=1.0, tolerance_scale=1e-3, floor_scale=-2e-4,
                ceiling=0.25)
    r = _ref()
    row = compared_row("toy", CASE, band, [(r * 1.01, r)])
    assert row.status == "fail" and row.scale_median == pytest.approx(0.01, rel=1e-9)
    assert "typical row norm off by +1.000e-02" in row.message
    assert "tolerance 1.00e-03 (floor -2.00e-04): a scale error" in row.message


def test_largest_scale_deviation_by_size_keeps_its_sign():
    r = _ref()
    out = compare_prompts("x", [(r * 1.001, r), (r * 0.99, r)], Band(1.0, None, 1.0, None, 1.0))
    assert out["scale_median"] == pytest.approx(-0.01, rel=1e-9) and out["status"] == "pass"


def test_problem_or_no_pairs_is_an_error():
    row = compared_row("toy", CASE, BAND, [(_ref(), _ref())], problem="hook never fired")
    assert row.status == "error" and row.message == "hook never fired"
    row = compared_row("toy", CASE, BAND, None)
    assert row.status == "error" and row.message == "blocks.1.hook_out: no values for bridge"


def test_shape_mismatch_is_an_error_naming_both_shapes():
    row = compared_row("toy", CASE, BAND, [(torch.zeros(4, 2), _ref())])
    assert row.status == "error"
    assert row.message == ("blocks.1.hook_out vs bridge:blocks.1.hook_out: subject shape (4, 2) != "
                           "reference shape (4, 3)")


def test_an_explained_event_sets_aside_tokens_at_and_after_it():
    r = _ref(6)
    s = r.clone()
    s[4:] += 5.0  # wrong only after the event
    row = compared_row("toy", CASE, BAND, [(s, r)], events=[Ev(0, 4)])
    assert row.status == "pass" and row.rel_err == 0.0
    assert row.message == "; tokens set aside from the event on: a flip (prompt 0, token 4)"


def test_an_unexplained_event_sets_nothing_aside():
    r = _ref(6)
    s = r.clone()
    s[4:] += 5.0
    row = compared_row("toy", CASE, BAND, [(s, r)], events=[Ev(0, 4, explained=False)])
    assert row.status == "fail"


def test_a_token_zero_event_drops_the_prompt_and_all_dropped_is_inconclusive():
    r = _ref()
    row = compared_row("toy", CASE, BAND, [(r + 9, r)], events=[Ev(0, 0)])
    assert row.status == "inconclusive"
    assert row.message == ("blocks.1.hook_out vs bridge: every prompt set aside or empty; tokens set aside from "
                           "the event on: a flip (prompt 0, token 0)")


def test_an_all_nan_reference_compares_nothing_and_is_not_a_pass():
    r = torch.full((3, 3), math.nan, dtype=torch.float64)
    row = compared_row("toy", CASE, BAND, [(torch.zeros(3, 3), r)])
    assert row.status == "inconclusive"
    assert row.message == ("blocks.1.hook_out vs bridge: every prompt set aside or empty "
                           "[prompt(s) [0]: no entry to compare, left out]")
    ok = _ref()
    row = compared_row("toy", CASE, BAND, [(ok.clone(), ok), (torch.zeros(3, 3), r)])
    assert row.status == "pass" and row.message == " [prompt(s) [1]: no entry to compare, left out]"


def test_pos_axis_names_the_worst_token_of_a_pattern():
    case = Case("bridge", "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_pattern", derived=True)
    r = torch.softmax(torch.randn(2, 4, 4, dtype=torch.float64), -1)
    s = r.clone()
    s[1, 3, 0] += 0.5
    row = compared_row("toy", case, BAND, [(s, r)], pos_axis=1)
    assert row.status == "fail" and row.derived
    assert row.worst["index"] == [1, 3, 0] and row.worst["token"] == 3


def test_axes_of():
    assert axes_of(torch.zeros(2, 3)) == ("pos", "d")
    assert axes_of(torch.zeros(2, 3, 4)) == ("pos", "head", "d_head")
    assert axes_of(torch.zeros(2)) == ("pos",)
    assert axes_of(torch.zeros(1, 2, 3, 4)) == ()


def test_nonfinite_logprobs_names_hf_or_vllm():
    lp = torch.log_softmax(torch.randn(3, 5, dtype=torch.float64), -1)
    assert nonfinite_logprobs([(lp.clone(), lp)]) == ""
    bad = lp.clone()
    bad[2, 4] = math.nan
    assert nonfinite_logprobs([(lp.clone(), lp), (lp.clone(), bad)]) == (
        "logprobs vs hf: non-finite values, not compared: NaN in HF's log-probs at prompt 1, [pos=2, vocab=4]")
    top_k = lp.clone()
    top_k[:, 2:] = math.nan  # vLLM's top-k: NaN elsewhere is fine ...
    assert nonfinite_logprobs([(top_k, lp)]) == ""
    top_k[1] = math.nan  # ... but a position with no finite value is not
    assert nonfinite_logprobs([(top_k, lp)]) == ("logprobs vs hf: non-finite values, not compared: vLLM returned "
                                                 "no finite log-prob at prompt 0, pos=1")


def test_pairs_of():
    store = {0: {"h": torch.ones(1)}, 1: {"h": torch.zeros(1)}}
    subject = [torch.ones(1) * 2, torch.ones(1) * 3]
    pairs = pairs_of(subject, store, "h", 2)
    assert [tuple(float(x) for x in p) for p in pairs] == [(2.0, 1.0), (3.0, 0.0)]
    assert pairs_of(None, store, "h", 2) is None
    assert pairs_of(subject, {0: {"h": torch.ones(1)}}, "h", 2) is None  # prompt 1 missing
    assert pairs_of(subject, store, "other", 2) is None
