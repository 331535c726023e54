"""--layers / --hook-kinds (harness.values.selection): parsing, resolution against a model's offer,
and the plan it gives (pure: no engine)."""
from __future__ import annotations

from argparse import ArgumentTypeError

import pytest

from harness.values.selection import HookSelection, SelectionError, parse_kinds, parse_layers

OFFERED = ["embed.hook_out", "blocks.0.hook_in", "blocks.0.attn.hook_z", "blocks.0.hook_out",
           "blocks.1.hook_in", "blocks.1.attn.hook_z", "blocks.1.hook_out", "ln_final.hook_normalized"]


def test_parse_layers_and_kinds():
    assert parse_layers("0,15,29") == {0, 15, 29}
    assert parse_layers("0-3,29") == {0, 1, 2, 3, 29}
    for bad in ("", "a", "3-1", "1,,2", "-1"):
        with pytest.raises(ArgumentTypeError, match="--layers"):
            parse_layers(bad)
    assert parse_kinds("hook_out, attn.hook_z") == {"hook_out", "attn.hook_z"}
    with pytest.raises(ArgumentTypeError, match="--hook-kinds"):
        parse_kinds(" , ")


def test_resolve_by_layer_kind_and_both():
    assert HookSelection(layers=frozenset({1})).resolve(OFFERED, 2) == {
        "embed.hook_out", "blocks.1.hook_in", "blocks.1.attn.hook_z", "blocks.1.hook_out", "ln_final.hook_normalized"}
    assert HookSelection(kinds=frozenset({"hook_out"})).resolve(OFFERED, 2) == {"blocks.0.hook_out", "blocks.1.hook_out"}
    assert HookSelection(frozenset({0}), frozenset({"attn.hook_z", "embed.hook_out"})).resolve(OFFERED, 2) == {
        "embed.hook_out", "blocks.0.attn.hook_z"}


def test_a_selection_that_does_not_fit_the_model_names_the_input():
    with pytest.raises(SelectionError, match=r"--layers 2,5: toy has 2 layers \(0-1\)"):
        HookSelection(layers=frozenset({2, 5})).resolve(OFFERED, 2, "toy")
    with pytest.raises(SelectionError, match="offers no mlp.hook_post"):
        HookSelection(kinds=frozenset({"mlp.hook_post"})).resolve(OFFERED, 2, "toy")


def test_the_plan_of_a_real_family_keeps_only_the_selection():
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.values.plan import build_plan
    from harness.values.variant import Variant

    target = target_for_family(FAMILIES["qwen3"])
    full = build_plan(target, Variant.make())
    plan = build_plan(target, Variant.make(), HookSelection(frozenset({1}), frozenset({"hook_out", "attn.hook_pattern"})))
    assert plan.selected == {"blocks.1.hook_out", "blocks.1.attn.hook_pattern"}
    assert {c.hook for c in plan.cases} >= {"blocks.1.hook_out", "blocks.1.attn.hook_pattern", "logprobs", "argmax"}
    inputs = set(plan.derived["blocks.1.attn.hook_pattern"].inputs)  # the rotated q and k it is computed from
    assert {c.hook for c in plan.cases} == {"blocks.1.hook_out", "blocks.1.attn.hook_pattern", "logprobs", "argmax",
                                            *inputs}
    assert set(plan.specs) == {"blocks.1.hook_out", *inputs} and set(plan.specs) < set(full.specs)
