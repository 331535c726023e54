"""Own routing flips (harness.comparison.chaos.find_own_flips / OwnFlip): a reference's run-dtype expert choice
against its truth-dtype choice, found from the references' captures alone, set aside downstream of that layer's
routing at and after the token, in the floors as in the rows."""
import torch

from harness.comparison.chaos import ChaoticToken, OwnFlip, event_from_dict, find_own_flips
from harness.comparison.set_aside import set_aside
from harness.references.reference import _floors, _own_flips

IDX = "blocks.{}.mlp.gate.hook_expert_indices"


def _ids(rows):
    return torch.tensor(rows, dtype=torch.long)


def test_a_flip_is_a_different_set_not_a_different_order():
    run = {0: {IDX.format(0): _ids([[0, 1], [2, 3], [1, 0]]), "blocks.0.hook_out": torch.zeros(3, 4)}}
    truth = {0: {IDX.format(0): _ids([[1, 0], [2, 1], [0, 1]]), "blocks.0.hook_out": torch.ones(3, 4)}}
    (f,) = find_own_flips(run, truth)  # rows 0 and 2 are the same sets in another order; the residual is no choice
    assert (f.prompt, f.layer, f.token, f.run, f.truth) == (0, 0, 1, (2, 3), (1, 2))
    assert f.explained and "own" in f.why and "[2, 3]" in f.describe()


def test_any_engines_name_and_one_event_per_token():
    ids = {0: _ids([[0, 1], [0, 1]]), 1: _ids([[0, 1], [0, 2]])}
    run = {1: {"blocks.2.mlp.router.hook_expert_indices": ids[1], IDX.format(2): ids[1]}}
    truth = {1: {"blocks.2.mlp.router.hook_expert_indices": ids[0], IDX.format(2): ids[0]}}
    assert [(f.prompt, f.layer, f.token) for f in find_own_flips(run, truth)] == [(1, 2, 1)]
    assert find_own_flips(run, {1: {IDX.format(2): ids[0][:1]}}) == []  # another shape: nothing decided
    flips = _own_flips((run, truth), (run, truth))
    assert len(flips) == 1 and _own_flips((run, truth), known=flips) == []


def test_scope_is_downstream_of_that_layers_routing():
    f = OwnFlip(0, 1, 4, IDX.format(1), (0, 1), (0, 2))
    downstream = ["blocks.1.mlp.hook_out", "blocks.1.hook_out", IDX.format(1), "blocks.2.attn.hook_q",
                  "ln_final.hook_normalized", "unembed.hook_out", "logprobs"]
    upstream = ["blocks.1.mlp.gate.hook_out", "blocks.1.attn.hook_z", "blocks.1.hook_resid_mid",
                "blocks.0.hook_out", "embed.hook_out"]
    assert all(f.upstream_of(h) for h in downstream) and not any(f.upstream_of(h) for h in upstream)
    # the earliest token of the prompt's events sets the row's tokens aside, a chaotic token or an own flip
    chaos = ChaoticToken(0, 0, 6, 0.4, 0.25)
    assert set_aside("blocks.2.hook_out", [chaos, f])[0] is f
    assert set_aside("blocks.1.attn.hook_z", [chaos, f])[0] is chaos


def test_floors_leave_out_the_flipped_tokens_downstream_only():
    truth = torch.ones(6, 4)
    run = truth.clone()
    run[3:] += 1.0  # the flip's O(1) downstream of token 3
    f = OwnFlip(0, 0, 3, IDX.format(0), (0, 1), (0, 2))
    hooks = ("blocks.0.hook_out", "blocks.0.mlp.gate.hook_out")
    worst, _, _ = _floors({0: {h: run for h in hooks}}, {0: {h: truth for h in hooks}}, chaos=[f])
    assert worst["blocks.0.hook_out"] == 0.0  # set aside from the token on
    assert worst["blocks.0.mlp.gate.hook_out"] == 1.0  # the router logits come before the choice: still the floor


def test_round_trip_through_a_dict():
    f = OwnFlip(2, 1, 5, IDX.format(1), (1, 3), (1, 2))
    c = ChaoticToken(0, 3, 1, 0.3, 0.25)
    assert event_from_dict(f.to_dict()) == f and event_from_dict(c.to_dict()) == c


def test_the_routers_own_rule_decides_from_its_logits():
    from overlays.base import Routing

    gate = "blocks.1.mlp.gate.hook_out"
    truth = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 1.0, 0.999, 0.0]])
    run = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 0.999, 1.0, 0.0]])  # a top-2 near-tie swapped at token 1
    (f,) = find_own_flips({0: {gate: run}}, {0: {gate: truth}}, {gate: (2, None)})
    assert (f.layer, f.token, f.run, f.truth) == (1, 1, (0, 2), (0, 1))
    assert find_own_flips({0: {gate: run}}, {0: {gate: truth}}) == []  # logits alone are no choice without a rule
    # a sparsemixer member crossing its threshold: the same two ids, another weighting
    sm = Routing("sparsemixer", jitter_eps=0.01)
    truth = torch.tensor([[1.0, 0.979, 0.5, 0.0]])  # expert 1 just outside 2 * eps of expert 0
    run = torch.tensor([[1.0, 0.981, 0.5, 0.0]])  # ... and just inside
    (f,) = find_own_flips({0: {gate: run}}, {0: {gate: truth}}, {gate: (2, sm)})
    assert f.run == f.truth == (0, 1) and "threshold" in f.describe()
    biased = Routing("sigmoid", 1, 1, "gate.e_score_correction_bias")
    assert find_own_flips({0: {gate: run}}, {0: {gate: truth}}, {gate: (2, biased)}) == []  # left to the ids
