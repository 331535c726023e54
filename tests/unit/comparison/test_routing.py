"""Expert-routing flips (harness.comparison.routing) on small tensors: what is set aside, and what never is."""
import pytest
import torch

from harness.comparison.routing import after_routing, find_flips, routing_module
from harness.comparison.set_aside import mask_from, set_aside

TOL = 1e-2  # a router hook's calibrated tolerance (row-wise relative error)


def _logits(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_a_near_tie_flip_is_explained_by_the_router_difference():
    ref = _logits([3.0, 1.0005, 1.0, -2.0], [0.0, 5.0, 1.0, 2.0])
    subj = _logits([3.0, 0.9995, 1.0, -2.0], [0.0, 5.0, 1.0, 2.0])  # experts 1 and 2 swap at token 0
    (f,) = find_flips(subj, ref, k=2, prompt=3, layer=1, tolerance=TOL)
    assert (f.prompt, f.layer, f.token) == (3, 1, 0)
    assert f.gap == pytest.approx(5e-4) and f.noise == pytest.approx(1e-3) and f.explained


def test_a_flip_with_the_router_outside_its_tolerance_is_not_explained():
    ref = _logits([3.0, 1.2, 1.0, -2.0])
    subj = _logits([3.0, 1.0, 1.01, -2.0])  # router rel err 0.057 > 1e-2
    (f,) = find_flips(subj, ref, k=2, prompt=0, layer=0, tolerance=TOL)
    assert f.rel_err == pytest.approx(0.2 / ref[0].norm().item(), rel=0.1) and not f.explained
    # a swap always needs a router difference of at least half the gap
    assert f.noise >= f.gap / 2


def test_a_wrong_router_explains_nothing():
    """A mapping bug in the router moves its logits far beyond its tolerance: no prompt is set aside."""
    ref = _logits([3.0, 2.0, 1.9, -2.0])
    subj = _logits([3.0, -5.0, 1.0, -2.0])
    (f,) = find_flips(subj, ref, k=2, prompt=0, layer=0, tolerance=TOL)
    assert f.gap == pytest.approx(0.1) and f.noise == pytest.approx(7.0) and not f.explained
    assert set_aside("blocks.0.hook_out", [f]) == {}


def test_same_expert_sets_are_no_flip_even_when_their_order_changes():
    ref = _logits([3.0, 2.999, 1.0, -2.0])
    subj = _logits([2.999, 3.0, 1.0, -2.0])
    assert find_flips(subj, ref, k=2, prompt=0, layer=0, tolerance=TOL) == []


def test_what_lies_downstream_of_a_layers_routing():
    assert not after_routing("embed.hook_out", 0)
    assert not after_routing("blocks.1.mlp.gate.hook_out", 1) and not after_routing("blocks.1.mlp.hook_in", 1)
    assert not after_routing("blocks.1.attn.hook_q", 1) and not after_routing("blocks.1.hook_resid_mid", 1)
    assert after_routing("blocks.1.mlp.hook_out", 1) and after_routing("blocks.1.hook_out", 1)
    assert after_routing("blocks.2.attn.hook_q", 1) and after_routing("blocks.2.mlp.gate.hook_out", 1)
    assert not after_routing("blocks.0.hook_out", 1)
    assert after_routing("ln_final.hook_normalized", 1) and after_routing("logprobs", 0)


def test_a_mixer_that_routes_sets_its_own_output_aside_not_its_input():
    """Nemotron-H's MoE is the layer's mixer: a flip there moves mixer.hook_out, never the mixer's input or
    logits; a hybrid's Mamba mixer before an MoE MLP stays upstream of that MLP's flip."""
    assert routing_module("blocks.1.mixer.gate.hook_out") == "mixer"
    assert routing_module("blocks.1.mixer.gate.hook_expert_indices") == "mixer"
    assert routing_module("blocks.1.mlp.gate.hook_out") == "mlp"
    assert after_routing("blocks.1.mixer.hook_out", 1, "mixer") and after_routing("blocks.1.hook_out", 1, "mixer")
    assert not after_routing("blocks.1.mixer.hook_in", 1, "mixer")
    assert not after_routing("blocks.1.mixer.gate.hook_out", 1, "mixer")
    assert not after_routing("blocks.1.norm.hook_normalized", 1, "mixer") and not after_routing("blocks.1.hook_in", 1, "mixer")
    assert after_routing("blocks.2.mixer.hook_in", 1, "mixer") and not after_routing("blocks.0.mixer.hook_out", 1, "mixer")
    assert not after_routing("blocks.1.mixer.hook_out", 1)  # an MLP's flip: the layer's mixer ran before it
    with pytest.raises(ValueError, match="module 'attn'"):
        after_routing("blocks.1.hook_out", 1, "attn")


def test_a_flip_carries_the_module_that_routed():
    s, r = _logits([1.0, 0.9999, 0.0]), _logits([0.9999, 1.0, 0.0])
    (flip,) = find_flips(s, r, 1, 0, 1, TOL, module="mixer")
    assert flip.module == "mixer" and flip.upstream_of("blocks.1.mixer.hook_out")
    assert not flip.upstream_of("blocks.1.mixer.hook_in")


def test_explained_flips_set_their_prompt_aside_downstream_only():
    ref = _logits([3.0, 1.0005, 1.0, -2.0])
    near = find_flips(_logits([3.0, 0.9995, 1.0, -2.0]), ref, 2, prompt=2, layer=1, tolerance=TOL)
    assert set(set_aside("blocks.1.hook_out", near)) == {2}
    assert set_aside("blocks.1.mlp.gate.hook_out", near) == {}
    assert set_aside("blocks.0.hook_out", near) == {}


def test_an_ungated_router_row_explains_no_flip():
    """bf16 router tolerances above the ceiling (1.3-2.6 measured on Mixtral) would explain any flip."""
    ref = _logits([3.0, 1.0005, 1.0, -2.0])
    (f,) = find_flips(_logits([3.0, 0.9995, 1.0, -2.0]), ref, 2, prompt=0, layer=0, tolerance=2.0, gated=False)
    assert not f.explained and "above the ceiling" in f.describe()
    assert set_aside("blocks.0.hook_out", [f]) == {}


def test_tokens_at_and_after_the_flip_are_set_aside_not_the_prompt():


    ref = torch.arange(12.0).reshape(4, 3)
    masked = mask_from(ref, 2, 0)
    assert torch.equal(masked[:2], ref[:2]) and torch.isnan(masked[2:]).all()
    heads_first = torch.ones(2, 4, 3)
    assert torch.isnan(mask_from(heads_first, 1, 1)[:, 1:]).all() and not torch.isnan(mask_from(heads_first, 1, 1)[:, :1]).any()
    # the earliest token of the prompt's explained flips is the one that counts
    ref_l = _logits([3.0, 1.0005, 1.0, -2.0], [3.0, 1.0005, 1.0, -2.0])
    flips = find_flips(_logits([3.0, 1.0005, 1.0, -2.0], [3.0, 0.9995, 1.0, -2.0]), ref_l, 2, prompt=0, layer=0,
                       tolerance=TOL)
    assert set_aside("blocks.0.hook_out", flips)[0].token == 1


# -- the router's own rule (overlays.base.Routing) ---------------------------------------------------
def test_grouped_rule_chooses_groups_first_then_experts_with_the_bias():
    from harness.comparison.routing import chosen
    from overlays.base import Routing

    rule = Routing("sigmoid", n_group=2, topk_group=1, bias="b")
    # group 0 = experts 0..1, group 1 = experts 2..3; by raw logits expert 2 is best, but with the bias
    # group 0 (two strong experts) wins: the choice is experts 0 and 1
    logits = torch.tensor([[1.0, 0.9, 1.2, -3.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0])
    mask, gap = chosen(logits, 2, rule, bias)
    assert mask.tolist() == [[True, True, False, False]] and float(gap[0]) > 0
    mask, _ = chosen(logits, 2, rule, torch.tensor([0.0, 0.0, 0.0, 2.0]))  # a bias moves the whole group
    assert mask.tolist() == [[False, False, True, True]]
    plain, plain_gap = chosen(logits, 2)  # no rule: the top-2 logits, gap in logits
    assert plain.tolist() == [[True, False, True, False]] and float(plain_gap[0]) == pytest.approx(0.1)


def test_a_group_flip_is_found_and_a_wrong_bias_explains_nothing():
    from harness.comparison.routing import find_flips
    from overlays.base import Routing

    rule = Routing("sigmoid", n_group=2, topk_group=1, bias="b")
    ref = torch.tensor([[0.50, 0.50, 0.502, 0.499]])  # group scores nearly tie: group 1 by a hair
    sub = torch.tensor([[0.503, 0.50, 0.50, 0.499]])  # rounding tips group 0
    bias = torch.zeros(4)
    (flip,) = find_flips(sub, ref, 2, prompt=0, layer=1, tolerance=0.05, routing=rule,
                         subject_bias=bias, reference_bias=bias)
    assert flip.explained and flip.bias_rel_err == 0.0 and flip.gap < 1e-2
    assert not find_flips(ref, ref, 2, 0, 1, 0.05, routing=rule, subject_bias=bias, reference_bias=bias)
    shifted = torch.tensor([1.0, 0.0, 0.0, 0.0])
    (flip,) = find_flips(ref, ref, 2, 0, 1, 0.05, routing=rule, subject_bias=shifted, reference_bias=torch.full((4,), 0.1))
    assert not flip.explained and flip.bias_rel_err > 0.05  # right logits, wrong bias: a routing bug
    (flip,) = find_flips(sub, ref, 2, 0, 1, 0.05, routing=rule, subject_bias=None, reference_bias=bias)
    assert not flip.explained and flip.bias_rel_err == float("inf")  # the engine's bias unknown
