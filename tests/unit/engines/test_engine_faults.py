"""harness.engines.engine_faults: a planted fault round-trips through the engine's environment, and
applying one edits the named parameter in place (rows, heads, a 0-d buffer) or refuses an unknown
name with the closest one.  Where each is caught in a real engine: tests/engine/test_planted_faults.py."""
from __future__ import annotations

import pytest

from harness.engines.engine_faults import EngineFault


def test_fault_round_trips_through_the_environment():
    f = EngineFault.scale("model.layers.1.mlp.experts.w2_weight", 1e-3, index=(2,), rows=(0, 8))
    assert EngineFault.from_json(f.env()["VLLM_PARITY_FAULT"]) == f
    with pytest.raises(ValueError, match="known kinds"):
        EngineFault("flip")


def test_apply_fault_edits_in_place_and_refuses_unknown_names():
    import torch

    from harness.engines.engine_faults import apply_fault

    m = torch.nn.Module()
    m.proj = torch.nn.Linear(4, 10)
    m.proj.num_heads, m.proj.num_kv_heads, m.proj.head_size = 1, 2, 2  # rows: q 0:2, k 2:6, v 6:10
    w0 = m.proj.weight.detach().clone()
    apply_fault(m, EngineFault.scale("proj.weight", 0.5, rows=(0, 2)))
    assert torch.equal(m.proj.weight[:2], w0[:2] * 1.5) and torch.equal(m.proj.weight[2:], w0[2:])
    apply_fault(m, EngineFault.swap_k_heads("proj", 0, 1))
    assert torch.equal(m.proj.weight[2:4], w0[4:6]) and torch.equal(m.proj.weight[4:6], w0[2:4])
    with pytest.raises(KeyError, match="closest"):
        apply_fault(m, EngineFault.zero_bias("prj.bias"))
    m.register_buffer("normalizer", torch.tensor(2.0), persistent=False)  # Gemma's, a 0-d buffer
    apply_fault(m, EngineFault.set_element("normalizer", (), 3.0))
    assert float(m.normalizer) == 3.0
