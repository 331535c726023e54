"""harness.comparison.processing: which hooks get a ``compat-processed`` row, and the transform
that puts vLLM's value in HookedTransformer coordinates.

Contracts checked (which hooks get the row: tests/unit/vocab/test_hook_rules.py): to_hooked_coordinates
centres over the last dim for LayerNorm ("LN", "LNPre") and returns the value itself for RMSNorm
or an unknown / missing normalization type.
"""
from __future__ import annotations

import pytest
import torch

from harness.comparison.processing import CENTRED_NORMS, to_hooked_coordinates


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
