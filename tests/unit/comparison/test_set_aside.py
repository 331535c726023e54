"""harness.comparison.set_aside: which tokens an upstream event sets aside from a row (pure).

Contracts checked: set_aside(hook, events) returns, per prompt, the explained event upstream of
``hook`` at the earliest token (ties by layer); an unexplained event sets nothing aside (a mapping
bug must fail); an event not upstream of the hook sets nothing aside; mask_from writes NaN at and
after ``token`` along ``pos_axis`` on a float copy (never in place, integer / low-precision
promoted to at least float32); note names each event's ``why`` and ``describe()`` in prompt order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.comparison.chaos import ChaoticToken
from harness.comparison.set_aside import mask_from, note, set_aside


@dataclass
class Ev:
    prompt: int
    token: int
    layer: int = 0
    explained: bool = True
    why: str = "a flip"

    def upstream_of(self, hook: str) -> bool:
        return hook != "embed.hook_out"

    def describe(self) -> str:
        return f"p{self.prompt} t{self.token} l{self.layer}"


def test_earliest_explained_event_per_prompt():
    events = [Ev(0, 5), Ev(0, 3), Ev(1, 4), Ev(1, 2, explained=False)]
    out = set_aside("blocks.1.hook_out", events)
    assert set(out) == {0, 1}
    assert (out[0].prompt, out[0].token) == (0, 3)
    assert (out[1].prompt, out[1].token) == (1, 4)  # the unexplained earlier one is ignored


def test_tie_on_token_goes_to_the_lower_layer():
    a, b = Ev(0, 3, layer=7, why="late"), Ev(0, 3, layer=2, why="early")
    assert set_aside("blocks.9.hook_out", [a, b])[0] is b


def test_unexplained_sets_nothing_aside():
    assert set_aside("blocks.1.hook_out", [Ev(0, 1, explained=False)]) == {}


def test_not_upstream_sets_nothing_aside():
    assert set_aside("embed.hook_out", [Ev(0, 1)]) == {}
    assert set_aside("blocks.0.hook_out", []) == {}


def test_with_real_chaotic_tokens():
    c = ChaoticToken(prompt=0, layer=3, token=2, floor=0.4, ceiling=0.25)
    assert set_aside("blocks.2.hook_out", [c]) == {}  # before its layer: compared
    assert set_aside("blocks.3.hook_out", [c]) == {0: c}
    assert set_aside("ln_final.hook_normalized", [c]) == {0: c}
    assert set_aside("logprobs", [c]) == {0: c}
    assert set_aside("embed.hook_out", [c]) == {}


def test_mask_from_positions_at_and_after_the_token():
    r = torch.arange(12.0).reshape(4, 3)
    out = mask_from(r, 2, 0)
    assert torch.equal(out[:2], r[:2])
    assert bool(torch.isnan(out[2:]).all())
    assert not bool(torch.isnan(r).any())  # a copy, never in place


def test_mask_from_along_the_query_axis_of_a_pattern():
    r = torch.rand(2, 4, 4)  # [heads, query, key]
    out = mask_from(r, 1, 1)
    assert torch.equal(out[:, :1], r[:, :1])
    assert bool(torch.isnan(out[:, 1:]).all())


def test_mask_from_token_zero_masks_everything_and_past_the_end_nothing():
    r = torch.ones(3, 2)
    assert bool(torch.isnan(mask_from(r, 0, 0)).all())
    assert torch.equal(mask_from(r, 3, 0), r)


def test_mask_from_promotes_dtypes():
    assert mask_from(torch.ones(3, 2, dtype=torch.bfloat16), 1, 0).dtype == torch.float32
    assert mask_from(torch.ones(3, 2, dtype=torch.int64), 1, 0).dtype == torch.float32
    assert mask_from(torch.ones(3, 2, dtype=torch.float64), 1, 0).dtype == torch.float64
    assert math.isnan(float(mask_from(torch.ones(3, 2, dtype=torch.int64), 1, 0)[1, 0]))


def test_note():
    assert note({}) == ""
    aside = {1: Ev(1, 4, why="w1"), 0: Ev(0, 2, why="w0")}
    assert note(aside) == "; tokens set aside from the event on: w0 (p0 t2 l0); w1 (p1 t4 l0)"
