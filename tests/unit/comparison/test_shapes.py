"""harness.comparison.shapes: the canonical layout the comparison sees.

Contracts checked (which hooks are heads-first: tests/unit/vocab/test_hook_rules.py):
reference_to_canonical drops a batch dim of 1 (only of 1),
detaches and moves to the CPU; subject_to_canonical keeps the request's first n_tokens rows.
"""
from __future__ import annotations

import pytest
import torch

from harness.comparison.shapes import reference_to_canonical, subject_to_canonical


def test_reference_drops_a_batch_of_one():
    t = torch.randn(1, 5, 8, requires_grad=True)
    out = reference_to_canonical("blocks.0.hook_out", t)
    assert out.shape == (5, 8) and not out.requires_grad and out.device.type == "cpu"
    assert torch.equal(out, t[0].detach())


def test_reference_keeps_a_batch_above_one_and_a_leading_dim_of_other_size():
    t = torch.randn(2, 5, 8)
    assert reference_to_canonical("x", t).shape == (2, 5, 8)
    pattern = torch.rand(1, 4, 6, 6)  # [batch, heads, q, k]
    assert reference_to_canonical("blocks.0.attn.hook_pattern", pattern).shape == (4, 6, 6)


def test_reference_one_token_prompt_of_a_1d_value():
    # a [1] tensor (one token's scalar) loses its only dim: the documented rule is "a batch dim of 1"
    assert reference_to_canonical("x", torch.tensor([3.0])).shape == ()
    assert reference_to_canonical("x", torch.tensor(3.0)).shape == ()


def test_subject_keeps_the_requests_rows():
    t = torch.arange(40.0).reshape(10, 4)
    out = subject_to_canonical(t, 7)
    assert out.shape == (7, 4) and torch.equal(out, t[:7])
    assert subject_to_canonical(t, 10).shape == (10, 4)


def test_a_batch_first_read_is_cut_along_its_token_dim():
    """vLLM 0.20.2's Transformers backend under CUDA graphs: HF modules run on [1, T_padded, d] (a 7-token prompt in
    the graph of 8), which a cut along dim 0 left padded ("subject shape (8, 128) != reference shape (7, 128)")."""
    from overlays.base import DropBatch, HookSpec

    padded = torch.arange(8 * 4, dtype=torch.float32).view(1, 8, 4)
    spec = HookSpec("model.layers.0.self_attn.q_proj", "out", (DropBatch(),))
    out = subject_to_canonical(padded, 7, spec.raw_token_dim)
    assert out.shape == (1, 7, 4) and torch.equal(out, padded[:, :7])
    assert subject_to_canonical(padded, 7).shape == (1, 8, 4)  # dim 0, the old cut: the padding kept
    heads_first = torch.zeros(1, 2, 8, 4)  # HF's heads-first [1, heads, T, d] (HookSpec.token_dim 2)
    assert subject_to_canonical(heads_first, 7, 2).shape == (1, 2, 7, 4)
    assert subject_to_canonical(torch.tensor(3.0), 7, 1).shape == ()  # no token dim: as it is


def test_a_reference_set_of_expert_ids_is_sorted_like_vllms():
    ids = torch.tensor([[[3, 1], [0, 2]]])  # [batch 1, T, k] in the router's score order
    assert reference_to_canonical("blocks.1.mlp.gate.hook_expert_indices", ids).tolist() == [[1, 3], [0, 2]]
    w = torch.tensor([[[0.2, 0.8]]])
    assert torch.equal(reference_to_canonical("blocks.1.mlp.gate.hook_expert_weights", w), w[0])  # not a set


def test_a_read_with_its_heads_folded_into_the_rows_is_unfolded_before_its_token_rows_are_cut():
    from harness.comparison.shapes import unflatten_rows

    canonical = torch.arange(7 * 4 * 3, dtype=torch.float32).view(7, 4, 3)  # [T, heads, d]
    padded = torch.cat([canonical, torch.full((1, 4, 3), -1.0)])  # a graph's padded forward of 8 tokens
    folded = padded.reshape(-1, 3)  # vLLM 0.20.2's CUDA GDN norm input: [T x heads, d]
    assert torch.equal(subject_to_canonical(unflatten_rows(4, folded), 7), canonical)
    assert unflatten_rows(4, canonical) is canonical  # the CPU line's [T, heads, d]: as it is
    assert unflatten_rows(None, folded) is folded
    with pytest.raises(ValueError, match="no multiple of 4"):
        unflatten_rows(4, folded[:-1])
