"""harness.vocab.hook_rules: the hook groups named by rule.

Contracts checked: heads_first is True exactly for the [heads, query, key] kinds (pattern and
attention scores, at any layer or template); processed_hook is True exactly for the residual-stream
writes (embed.hook_out, blocks.{i}.hook_in / hook_resid_mid / hook_out / attn.hook_out /
mlp.hook_out, at any layer) and False for every other hook (q/k/v/z move in other ways, norms,
unembed, logits, the router); GATE matches a concrete layer's router logits only and gives the layer.
"""
from __future__ import annotations

import pytest

from harness.vocab.hook_rules import GATE, HEADS_FIRST_KINDS, RESIDUAL_WRITES, heads_first, processed_hook


def test_heads_first_kinds():
    assert HEADS_FIRST_KINDS == frozenset({"attn.hook_pattern", "attn.hook_attn_scores"})


@pytest.mark.parametrize("hook, expected", [
    ("blocks.0.attn.hook_pattern", True), ("blocks.17.attn.hook_attn_scores", True),
    ("blocks.{i}.attn.hook_pattern", True),
    ("blocks.0.attn.hook_q", False), ("blocks.0.attn.hook_z", False), ("blocks.0.hook_out", False),
    ("unembed.hook_out", False),
])
def test_heads_first(hook, expected):
    assert heads_first(hook) is expected


def test_the_residual_writes():
    assert RESIDUAL_WRITES == frozenset({
        "embed.hook_out", "blocks.{i}.hook_in", "blocks.{i}.hook_resid_mid", "blocks.{i}.hook_out",
        "blocks.{i}.attn.hook_out", "blocks.{i}.mlp.hook_out"})


@pytest.mark.parametrize("hook", [
    "embed.hook_out", "blocks.0.hook_in", "blocks.11.hook_resid_mid", "blocks.29.hook_out",
    "blocks.3.attn.hook_out", "blocks.3.mlp.hook_out",
])
def test_processed(hook):
    assert processed_hook(hook)


@pytest.mark.parametrize("hook", [
    "blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_v", "blocks.0.attn.hook_z",
    "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_in", "blocks.0.ln1.hook_normalized",
    "blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post", "blocks.0.mlp.hook_in",
    "ln_final.hook_normalized", "unembed.hook_out", "logprobs", "argmax",
    "blocks.0.mlp.gate.hook_out",  # a template matches literally: not mlp.hook_out
])
def test_not_processed(hook):
    assert not processed_hook(hook)


@pytest.mark.parametrize("hook, layer", [("blocks.0.mlp.gate.hook_out", "0"), ("blocks.27.mlp.gate.hook_out", "27")])
def test_gate_matches_router_logits(hook, layer):
    assert GATE.match(hook).group(1) == layer


@pytest.mark.parametrize("hook", ["blocks.{i}.mlp.gate.hook_out", "blocks.0.mlp.hook_out", "blocks.0.mlp.gate.hook_out.x",
                                  "blocks.0.mlp.hook_pre", "mlp.gate.hook_out"])
def test_gate_matches_nothing_else(hook):
    assert GATE.match(hook) is None


def test_only_expert_ids_are_sets_per_token():
    from harness.vocab.hook_rules import sorted_per_token

    assert sorted_per_token("blocks.0.mlp.gate.hook_expert_indices") and sorted_per_token("blocks.3.mlp.hook_expert_indices")
    assert not sorted_per_token("blocks.0.mlp.gate.hook_expert_weights") and not sorted_per_token("blocks.0.mlp.gate.hook_out")
