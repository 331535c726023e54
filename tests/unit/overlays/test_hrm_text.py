"""HRM-Text's unrolled blocks (overlays.hrm_text) and the one-call-of-several reads they need."""
from types import SimpleNamespace

import pytest

from harness.vocab.hook_names import at_firing, firing_of
from overlays.base import HookSpec
from overlays.hrm_text import HrmTextOverlay, unrolled_blocks


def _cfg(per_stack=2, h=2, l=2, **kw):
    return SimpleNamespace(num_layers_per_stack=per_stack, H_cycles=h, L_cycles=l,
                           num_hidden_layers=per_stack * h * (l + 1), hidden_size=128, vocab_size=512,
                           num_attention_heads=4, head_dim=32, intermediate_size=256, **kw)


def test_blocks_follow_the_kv_slots_of_each_recurrence_step():
    blocks = unrolled_blocks(_cfg())
    # step s = h * (L + 1) + l owns slots s * per_stack + layer: L, L, H, L, L, H
    assert [(b.stack, b.layer, b.call) for b in blocks] == [
        ("L", 0, 0), ("L", 1, 0), ("L", 0, 1), ("L", 1, 1), ("H", 0, 0), ("H", 1, 0),
        ("L", 0, 2), ("L", 1, 2), ("L", 0, 3), ("L", 1, 3), ("H", 0, 1), ("H", 1, 1)]
    assert {b.per_forward for b in blocks if b.stack == "L"} == {4}
    assert {b.per_forward for b in blocks if b.stack == "H"} == {2}
    assert blocks[10].module == "model.H_module.layers.0"
    assert blocks[10].tl("hook_out") == "H_blocks.0.hook_out@1"


def test_a_config_without_looped_stacks_has_no_unrolled_blocks():
    assert unrolled_blocks(SimpleNamespace(num_hidden_layers=3)) is None


def test_a_layer_count_that_is_not_the_unrolling_is_refused_by_name():
    cfg = _cfg()
    cfg.num_hidden_layers = 5
    with pytest.raises(ValueError, match="num_hidden_layers 5"):
        unrolled_blocks(cfg)


def test_every_block_reads_its_own_call_and_names_the_bridge_firing():
    specs = HrmTextOverlay().hook_specs(_cfg())
    s = specs["blocks.8.hook_out"]
    assert (s.module, s.call, s.per_forward) == ("model.L_module.layers.0", 3, 4)
    assert s.reference_name("bridge", None) == "L_blocks.0.hook_out@3"
    assert s.reference_name("compat-processed", "x") is None
    final = specs["ln_final.hook_normalized"]
    assert (final.module, final.call, final.reference_name("bridge", None)) == (
        "model.H_module.final_norm", 1, "H_ln_final.hook_normalized@1")


def test_firing_names_round_trip_and_reject_a_non_number():
    assert firing_of(at_firing("L_blocks.0.hook_out", 3)) == ("L_blocks.0.hook_out", 3)
    assert firing_of("blocks.0.hook_out") == ("blocks.0.hook_out", None)
    with pytest.raises(ValueError, match="must be a number"):
        firing_of("x@y")


def test_a_call_outside_the_calls_per_forward_is_refused():
    with pytest.raises(ValueError, match="not a call"):
        HookSpec("m", call=2, per_forward=2)
    with pytest.raises(ValueError, match="cannot also pick one"):
        HookSpec("m", calls="all", per_forward=2)
