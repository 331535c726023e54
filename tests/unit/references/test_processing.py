"""harness.references.processing: which hooks get a ``compat-processed`` row, and the transform
that puts vLLM's value in HookedTransformer coordinates.

Contracts checked: processed_hook is True exactly for the residual-stream writes (embed.hook_out,
blocks.{i}.hook_in / hook_resid_mid / hook_out / attn.hook_out / mlp.hook_out, at any layer) and
False for every other hook (q/k/v/z move in other ways, norms, unembed, logits); to_hooked_coordinates
centres over the last dim for LayerNorm ("LN", "LNPre") and returns the value itself for RMSNorm
or an unknown / missing normalization type.
"""
from __future__ import annotations

import pytest
import torch

from harness.references.processing import CENTRED_NORMS, RESIDUAL_WRITES, processed_hook, to_hooked_coordinates


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


def test_centred_norms():
    assert CENTRED_NORMS == ("LN", "LNPre")


@pytest.mark.parametrize("norm", ["LN", "LNPre"])
def test_layernorm_models_are_centred_over_d_model(norm):
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 0.0, 4.0]])
    out = to_hooked_coordinates(x, norm)
    assert torch.equal(out, torch.tensor([[-2.0, -1.0, 0.0, 3.0], [-1.0, -1.0, -1.0, 3.0]]))
    assert torch.equal(x, torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 0.0, 4.0]]))  # input untouched


def test_centring_is_over_the_last_dim_only():
    x = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)
    out = to_hooked_coordinates(x, "LN")
    assert torch.allclose(out.mean(-1), torch.zeros(2, 3, dtype=torch.float64), atol=1e-12)
    assert torch.equal(out[0, 0], torch.tensor([-1.5, -0.5, 0.5, 1.5], dtype=torch.float64))


@pytest.mark.parametrize("norm", ["RMS", "RMSPre", None, "ln"])
def test_other_norms_are_unchanged(norm):
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    assert to_hooked_coordinates(x, norm) is x
