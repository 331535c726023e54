"""The logit rows: full-prompt log-probs against HF's, and final-position argmax agreement.

Contract: :func:`logit_rows(model, lp_case, am_case, band, pairs, events)` returns the ``logprobs``
row (compared like any hook, on ``[T, vocab]`` log-probs) and the ``argmax`` row: the final
position's top-1 must agree except at a near tie (each top-1 within the other's top-5, as vLLM's
``check_logprobs_close`` allows).  Pure.

Traps: vLLM returns only its top-k log-probs for a large vocabulary; the entries it did not return
are NaN on its side and are masked on HF's (after the non-finite check, never before).  A prompt with
an upstream event (an explained expert-routing flip, a chaotic token: harness.comparison.set_aside)
is set aside from the argmax row whole (its final position is always downstream of the event).
"""
from __future__ import annotations

import math

import torch

from harness.comparison.compare import argmax_agreement, logit_metrics
from harness.comparison.gate import Band
from harness.comparison.set_aside import Event, set_aside
from harness.comparison.rows import compared_row, nonfinite_logprobs
from harness.values.plan import Case
from harness.values.results import HookResult


def logit_rows(model: str, lp_case: Case, am_case: Case, band: Band, pairs: list, events: list[Event]
               ) -> list[HookResult]:
    # reference entries vLLM did not return (top-k mode) are masked out
    bad = nonfinite_logprobs(pairs)
    pairs = [(s, torch.where(torch.isnan(s), torch.full_like(r, math.nan), r)) for s, r in pairs]
    row = compared_row(model, lp_case, band, None if bad else pairs,
                       bad, events=events)
    if bad:
        am = HookResult(model, "hf", "argmax", am_case.reference_hook, None, "argmax", "error", 0.0,
                        message=bad.replace("logprobs", "argmax", 1))
        return [row, am]
    aside = set_aside("argmax", list(events))
    pairs = [pair for p, pair in enumerate(pairs) if p not in aside]
    row.logit_metrics = logit_metrics(pairs) if pairs else {}
    agree = [argmax_agreement(s, r) for s, r in pairs]
    n_agree, n_pos = sum(a[0] for a in agree), sum(a[1] for a in agree)
    # Final-position top-1 must agree, except for a near tie (each top-1 within the
    # other's top-5, as vLLM's check_logprobs_close allows): bf16 can flip those.
    last_ok = all(a[3] for a in agree)
    ties = sum(a[3] and not a[2] for a in agree)
    am = HookResult(model, "hf", "argmax", am_case.reference_hook, None, "argmax",
                    "pass" if last_ok else "fail", 0.0, rel_err=0.0 if last_ok else 1.0,
                    worst={"agree_positions": n_agree, "positions": n_pos, "final_near_ties": ties},
                    message="" if last_ok else
                    f"{model}: final-position argmax differs from HF in {sum(not a[3] for a in agree)} "
                    f"prompt(s) beyond a near tie; top-1 agreement {n_agree}/{n_pos} positions")
    am.logit_metrics = row.logit_metrics
    if aside:
        am.message += f"; prompt(s) {sorted(aside)} set aside: " + "; ".join(
            f"{e.why} ({e.describe()})" for _, e in sorted(aside.items()))
        if not pairs:
            am.status, am.message = "inconclusive", f"argmax: every prompt set aside{am.message}"
    return [row, am]


def greedy_agreement(generated: list[list[int]], prompt_lengths: list[int], pairs: list, k: int = 5,
                     aside: dict | None = None) -> dict:
    """Decode runs (harness.engines.serving): every token vLLM generated greedily against the
    reference's top-1 at that position, teacher-forced on the same sequence.  ``pairs``: per prompt
    (vLLM's, the reference's) ``[L, V]`` log-probs; token ``i`` of prompt ``p`` was sampled from
    row ``prompt_lengths[p] - 1 + i``.  A mismatch is a near tie when vLLM's token is in the
    reference's top-k and the reference's top-1 in vLLM's top-k (as the argmax row allows).
    ``aside``: prompt -> an explained upstream event (harness.comparison.set_aside): its tokens at
    and after the event are not checked (a flipped expert at a near tie changes what follows)."""
    out = {"checked": 0, "exact": 0, "near_ties": [], "diverged": [], "set_aside": 0}
    for p, (gen, (s, r)) in enumerate(zip(generated, pairs)):
        for i, tok in enumerate(gen):
            row = prompt_lengths[p] - 1 + i
            if row >= r.shape[0]:
                break
            if aside and p in aside and row >= aside[p].token:
                out["set_aside"] += 1
                continue
            r_lp = torch.nan_to_num(r[row].double(), nan=-math.inf)
            s_lp = torch.nan_to_num(s[row].double(), nan=-math.inf)
            ref_top = int(r_lp.argmax())
            out["checked"] += 1
            if ref_top == tok:
                out["exact"] += 1
                continue
            kk = min(k, r_lp.shape[-1])
            tie = tok in r_lp.topk(kk).indices.tolist() and ref_top in s_lp.topk(kk).indices.tolist()
            where = {"prompt": p, "step": i, "pos": row, "vllm": tok, "reference": ref_top,
                     "gap": float(r_lp[ref_top] - r_lp[tok])}
            (out["near_ties"] if tie else out["diverged"]).append(where)
    return out
