"""Chaotic tokens (harness.comparison.chaos): found from the reference's own floor run only, set
aside from their layer on, and never a way for a mapping error before them to pass."""
import math

import torch

from harness.comparison.chaos import ChaoticToken, find_chaotic
from harness.comparison.gate import Band
from harness.comparison.rows import compared_row
from harness.comparison.set_aside import set_aside
from harness.values.plan import Case
from harness.references.reference import _floors


def _stream(n_layers=3, T=5, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"blocks.{i}.hook_out": torch.randn(T, d, generator=g) for i in range(n_layers)}


def test_found_at_the_first_layer_that_carries_it_and_only_once():
    truth = {0: _stream()}
    run = {0: {k: v.clone() for k, v in truth[0].items()}}
    run[0]["blocks.1.hook_out"][2] *= 1.5  # 0.5 > ceiling 0.25 from layer 1 on
    run[0]["blocks.2.hook_out"][2] *= 1.6
    run[0]["blocks.2.hook_out"][4] *= 1.01  # 0.01: rounding, not chaos
    found = find_chaotic(run, truth, 0.25)
    assert [(c.prompt, c.layer, c.token) for c in found] == [(0, 1, 2)]
    assert math.isclose(found[0].floor, 0.5, rel_tol=1e-6)
    assert find_chaotic(run, truth, math.inf) == []  # a dtype without a ceiling has no chaos


def test_set_aside_from_its_layer_on_and_downstream_only():
    c = ChaoticToken(prompt=0, layer=2, token=3, floor=0.4, ceiling=0.25)
    for hook in ("blocks.2.attn.hook_q", "blocks.2.hook_out", "blocks.5.mlp.hook_post", "ln_final.hook_normalized",
                 "unembed.hook_out", "logprobs", "argmax"):
        assert set_aside(hook, [c]) == {0: c}, hook
    for hook in ("blocks.1.hook_out", "embed.hook_out", "hook_embed", "blocks.0.attn.hook_pattern"):
        assert set_aside(hook, [c]) == {}, hook


def _row(subject, reference, events, tol=0.02):
    band = Band(tol, 0.005, tol, 0.005, tol, 0.0)
    return compared_row("m", Case("bridge", "blocks.2.attn.hook_z", "blocks.2.attn.hook_z"), band,
                        [(subject, reference)], events=events)


def test_tokens_after_it_are_left_out_but_a_bug_before_it_still_fails():
    ref = torch.randn(6, 4, 8, generator=torch.Generator().manual_seed(1))
    chaotic = ChaoticToken(0, 1, 3, 0.4, 0.25)
    diverged = ref.clone()
    diverged[3:] += 5.0  # every row from the chaotic token on: what attention carries
    assert _row(diverged, ref, []).status == "fail"
    kept = _row(diverged, ref, [chaotic])
    assert kept.status == "pass" and "chaotic token" in kept.message
    wrong = diverged.clone()
    wrong[:3] *= 1.1  # a 10 % scale error on the tokens before it
    assert _row(wrong, ref, [chaotic]).status == "fail"
    at_zero = ChaoticToken(0, 1, 0, 0.4, 0.25)
    assert _row(diverged, ref, [at_zero]).status == "inconclusive"  # nothing compared is never pass


def test_floors_leave_out_the_same_tokens():
    truth = {0: {"blocks.2.hook_out": torch.ones(5, 4)}}
    run = {0: {"blocks.2.hook_out": torch.ones(5, 4)}}
    run[0]["blocks.2.hook_out"][1:] *= 1.01
    run[0]["blocks.2.hook_out"][3] *= 2.0
    worst, median, _ = _floors(run, truth)
    assert math.isclose(worst["blocks.2.hook_out"], 1.02, rel_tol=1e-3)
    worst, median, _ = _floors(run, truth, [ChaoticToken(0, 2, 3, 1.0, 0.25)])
    assert math.isclose(worst["blocks.2.hook_out"], 0.01, rel_tol=1e-3)


def test_references_that_disagree_set_tokens_aside_for_processed_rows_only():
    """A near-tie only processed compatibility mode flips (its own rounding of a router) is found by
    comparing the two references, with the residual hook's tolerance as the bound."""
    truth = {0: _stream()}
    other = {0: {k: v.clone() for k, v in truth[0].items()}}
    other[0]["blocks.0.hook_out"][4] *= 1.2  # 0.2: below the ceiling, above a 0.05 tolerance
    found = find_chaotic(other, truth, 0.25, source="references", limit=lambda hook: 0.05)
    assert [(c.layer, c.token, c.source) for c in found] == [(0, 4, "references")]
    assert "references disagree" in found[0].why
    assert find_chaotic(other, truth, 0.25, source="references") == []  # the ceiling alone misses it


def test_a_prompt_with_nothing_to_compare_is_never_a_pass():
    ref = torch.randn(6, 8, generator=torch.Generator().manual_seed(2))
    assert _row(ref.clone(), ref, []).status == "pass"
    nan = torch.full_like(ref, math.nan)  # every reference entry ignored
    assert _row(ref.clone(), nan, []).status == "inconclusive"
    empty = ref[:0]  # no row returned
    assert _row(empty, empty, []).status == "inconclusive"
    band = Band(0.02, 0.005, 0.02, 0.005, 0.02, 0.0)
    both = compared_row("m", Case("bridge", "blocks.2.attn.hook_z", "blocks.2.attn.hook_z"), band,
                        [(ref.clone() * 2, ref), (empty, empty)])
    assert both.status == "fail" and "no entry to compare" in both.message  # the other prompt still decides


def test_a_floor_leaves_out_the_dims_its_rows_leave_out():
    """A un-fold whose divisor is 0 leaves a dim out of the compared rows (harness.comparison.conversions
    .left_out); the floor must leave it out too, or a dim that holds most of a row's norm (Gemma-3-270M:
    93-97 %) calibrates the tolerance of the dims that are compared."""
    import torch

    from harness.references.reference import _floors

    truth = torch.tensor([[100.0, 1.0, 1.0], [100.0, 1.0, -1.0]], dtype=torch.float64)
    run = truth + torch.tensor([[0.0, 0.05, 0.0], [0.0, 0.0, 0.05]], dtype=torch.float64)
    hook = "blocks.0.ln2.hook_normalized"
    everything, _, _ = _floors({0: {hook: run}}, {0: {hook: truth}})
    kept, _, _ = _floors({0: {hook: run}}, {0: {hook: truth}}, left_out={hook: torch.tensor([True, False, False])})
    assert everything[hook] < 1e-3 < kept[hook]
    assert abs(kept[hook] - 0.05 / 2 ** 0.5) < 1e-9
