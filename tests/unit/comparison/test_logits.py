"""harness.comparison.logits: the ``logprobs`` row and the final-position ``argmax`` row, and the
teacher-forced greedy agreement of decode runs.

Contracts checked: equal log-probs pass both rows; a final-position top-1 that differs beyond a
near tie fails argmax with its message, a near tie (each top-1 in the other's top-5) passes and is
counted; entries vLLM did not return (NaN) are masked on HF's side; a non-finite HF log-prob makes
both rows errors (the argmax message says "argmax"); a prompt with an upstream event is set aside
from argmax whole, and every prompt set aside is inconclusive; greedy_agreement counts exact
tokens, near ties, divergences and set-aside steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from harness.comparison.gate import Band
from harness.comparison.logits import greedy_agreement, logit_rows
from harness.values.plan import Case

LP = Case("hf", "logprobs", "log_softmax(logits)")
AM = Case("hf", "argmax", "argmax(logits)")
BAND = Band(tolerance=1e-3, floor=1e-6, tolerance_median=1e-3, tolerance_scale=1e-3)


def _lp(*rows) -> torch.Tensor:
    return torch.log_softmax(torch.tensor(rows, dtype=torch.float64), -1)


@dataclass
class Ev:
    prompt: int
    token: int
    explained: bool = True
    why: str = "an expert flip"

    def upstream_of(self, hook):
        return True

    def describe(self):
        return f"prompt {self.prompt}, token {self.token}"


def test_equal_logprobs_pass_both_rows():
    a = _lp([3.0, 1, 0, 0, 0, 0, 0], [0, 0, 5.0, 0, 0, 0, 0])
    lp, am = logit_rows("toy", LP, AM, BAND, [(a.clone(), a)], [])
    assert (lp.status, am.status) == ("pass", "pass")
    assert am.worst == {"agree_positions": 2, "positions": 2, "final_near_ties": 0}
    assert am.rel_err == 0.0 and am.tolerance == 0.0 and am.message == ""
    assert lp.logit_metrics["top1_agree"] == 2 and lp.logit_metrics["kl_max"] == pytest.approx(0.0, abs=1e-15)
    assert am.logit_metrics == lp.logit_metrics


def test_final_argmax_beyond_a_near_tie_fails():
    # vLLM's final top-1 is token 6, HF's top-5 are tokens 0..4: no near tie
    hf = _lp([5.0, 4, 3, 2, 1, 0, -1])
    vllm = _lp([5.0, 4, 3, 2, 1, 0, 9])
    _, am = logit_rows("toy", LP, AM, BAND, [(vllm, hf)], [])
    assert am.status == "fail" and am.rel_err == 1.0
    assert am.message == ("toy: final-position argmax differs from HF in 1 prompt(s) beyond a near tie; "
                          "top-1 agreement 0/1 positions")


def test_near_tie_passes_and_is_counted():
    hf = _lp([5.0, 4.99, 0, 0, 0, 0, 0])
    vllm = _lp([4.99, 5.0, 0, 0, 0, 0, 0])
    lp, am = logit_rows("toy", LP, AM, BAND, [(vllm, hf)], [])
    assert am.status == "pass" and am.worst["final_near_ties"] == 1 and am.worst["agree_positions"] == 0


def test_entries_vllm_did_not_return_are_masked_on_hfs_side():
    hf = _lp([9.0, 8, 7, 6, 5, 4, 3, 2, 1, 0, -1, -2])
    vllm = hf.clone()
    vllm[0, 6:] = math.nan  # vLLM returned its top 6 only
    hf_wrong_tail = hf.clone()
    hf_wrong_tail[0, 10] += 20.0  # HF's tail differs, but vLLM did not return that entry
    lp, am = logit_rows("toy", LP, AM, BAND, [(vllm, hf_wrong_tail)], [])
    assert lp.status == "pass" and lp.rel_err == 0.0
    # the argmax row reads the masked pairs too: HF's top-1 among the returned entries agrees
    assert am.status == "pass" and am.worst["agree_positions"] == 1 and am.worst["final_near_ties"] == 0


def test_nonfinite_hf_logprobs_make_both_rows_errors():
    hf = _lp([1.0, 2, 3, 4, 5, 6, 7])
    hf[0, 2] = math.nan
    lp, am = logit_rows("toy", LP, AM, BAND, [(hf.clone().nan_to_num(0.0), hf)], [])
    assert lp.status == am.status == "error"
    assert lp.message == ("logprobs vs hf: non-finite values, not compared: NaN in HF's log-probs at prompt 0, "
                          "[pos=0, vocab=2]")
    assert am.message == ("argmax vs hf: non-finite values, not compared: NaN in HF's log-probs at prompt 0, "
                          "[pos=0, vocab=2]")


def test_event_sets_the_prompt_aside_from_argmax_whole():
    good = _lp([5.0, 0, 0, 0, 0, 0, 0])
    hf_bad = _lp([5.0, 4, 3, 2, 1, 0, -1], [5.0, 4, 3, 2, 1, 0, -1])
    vllm_bad = _lp([5.0, 4, 3, 2, 1, 0, -1], [5.0, 4, 3, 2, 1, 0, 9])
    lp, am = logit_rows("toy", LP, AM, BAND, [(good.clone(), good), (vllm_bad, hf_bad)], [Ev(1, 1)])
    assert lp.status == "pass"  # prompt 1's token 1 (the only wrong one) is set aside
    assert am.status == "pass"
    assert am.worst["positions"] == 1  # prompt 1 left out whole
    assert am.message == "; prompt(s) [1] set aside: an expert flip (prompt 1, token 1)"


def test_every_prompt_set_aside_is_inconclusive():
    a = _lp([5.0, 0, 0, 0, 0, 0, 0], [0, 5.0, 0, 0, 0, 0, 0])
    _, am = logit_rows("toy", LP, AM, BAND, [(a.clone(), a)], [Ev(0, 1)])
    assert am.status == "inconclusive"
    assert am.message == "argmax: every prompt set aside; prompt(s) [0] set aside: an expert flip (prompt 0, token 1)"
    assert am.logit_metrics == {}


def test_greedy_agreement_counts():
    # prompt of length 2, 3 generated tokens: rows 1, 2, 3 of a [4, V] log-prob matrix
    hf = _lp([0, 0, 0, 0, 0, 0, 0], [5.0, 0, 0, 0, 0, 0, 0], [0, 5.0, 4.9, 0, 0, 0, 0],
             [0, 1.0, 2, -3, 3, 4, 5])
    vllm = _lp([0, 0, 0, 0, 0, 0, 0], [5.0, 0, 0, 0, 0, 0, 0], [0, 4.9, 5.0, 0, 0, 0, 0],
               [0, 1.0, 2, 9, 3, 4, 5])
    out = greedy_agreement([[0, 2, 3]], [2], [(vllm, hf)])
    assert out["checked"] == 3 and out["exact"] == 1 and out["set_aside"] == 0
    assert out["near_ties"] == [{"prompt": 0, "step": 1, "pos": 2, "vllm": 2, "reference": 1,
                                 "gap": pytest.approx(0.1)}]
    assert len(out["diverged"]) == 1 and out["diverged"][0]["vllm"] == 3 and out["diverged"][0]["reference"] == 6


def test_greedy_agreement_sets_aside_and_stops_at_the_end():
    hf = _lp([5.0, 0, 0], [5.0, 0, 0], [5.0, 0, 0])
    out = greedy_agreement([[0, 1, 1, 1, 1]], [1], [(hf.clone(), hf)], aside={0: Ev(0, 1)})
    # rows 0, 1, 2 exist; row 0 is checked (exact), rows 1 and 2 are set aside, then the matrix ends
    assert out == {"checked": 1, "exact": 1, "near_ties": [], "diverged": [], "set_aside": 2}
