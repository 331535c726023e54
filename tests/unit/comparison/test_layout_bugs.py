"""harness.comparison.known_issues.regroup_layout: a reference's wrong head split, compared regrouped only
where its signature holds, and an error the day it no longer does."""
from __future__ import annotations

import torch

from harness.comparison.known_issues import regroup_layout

ARCH, HOOK = "DeepseekV3ForCausalLM", "blocks.1.attn.hook_z"
SHOWS = {"v_head_dim": 32, "qk_rope_head_dim": 64}  # the model's values: the wrong split differs


def _pair(t=7, heads=4, v=32, rope=64):
    z = torch.randn(t, heads, v)
    return z, z.reshape(t, heads * v // rope, rope)  # TL 4.3.0's split: heads of qk_rope_head_dim


def test_the_split_by_the_rope_dim_is_regrouped_into_vllms_heads():
    subject, reference = _pair()
    pairs, note, stale = regroup_layout(ARCH, "bridge", HOOK, [(subject, reference)], SHOWS)
    assert not stale and "(7, 2, 64) -> (7, 4, 32)" in note and "TransformerLens 4.3.0" in note
    assert torch.equal(pairs[0][1], subject)  # the same numbers, in vLLM's layout


def test_a_fixed_reference_makes_the_entry_stale():
    subject, _ = _pair()
    pairs, note, stale = regroup_layout(ARCH, "compat", HOOK, [(subject, subject.clone())], SHOWS)
    assert "no longer reproduces" in stale and "retire" in stale and not note


def test_a_model_whose_v_dim_is_the_rope_dim_cannot_show_it():
    z = torch.randn(7, 8, 64)
    same = {"v_head_dim": 64, "qk_rope_head_dim": 64}  # TL's split by 64 is then the right one
    assert regroup_layout(ARCH, "bridge", HOOK, [(z, z.clone())], same)[1:] == ("", "")
    assert regroup_layout(ARCH, "bridge", HOOK, [(z, z.clone())], None)[1:] == ("", "")  # values unknown


def test_another_mismatch_or_another_row_is_left_alone():
    subject, _ = _pair()
    other = torch.randn(6, 2, 64)  # a different token count: not the documented bug
    assert regroup_layout(ARCH, "bridge", HOOK, [(subject, other)]) == ([(subject, other)], "", "")
    _, reference = _pair()
    assert regroup_layout("LlamaForCausalLM", "bridge", HOOK, [(subject, reference)])[1:] == ("", "")
    assert regroup_layout(ARCH, "hf", HOOK, [(subject, reference)])[1:] == ("", "")
    assert regroup_layout(ARCH, "bridge", "blocks.1.attn.hook_q", [(subject, reference)])[1:] == ("", "")
