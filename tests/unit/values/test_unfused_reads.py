"""Reads of a fused projection that a vLLM line's Transformers backend keeps apart (overlays.base.HookSpec.unfused):
a Transformers-backend row declares HF's own q/k/v and gate/up projections beside its fused reads, the engine is
asked for both, and the plan keeps the one the loaded tree has (harness.values.plan.Plan.reads_found).  No engine."""
from __future__ import annotations

import pytest

from harness.models.families import FAMILIES
from harness.models.targets import target_for_family
from harness.values.engine_request import run_request
from harness.values.plan import build_plan
from harness.values.variant import Variant
from overlays import get_overlay
from overlays.base import Cols, DropBatch, HookSpec

PROMPTS = [[1, 5, 17, 42], [7, 8, 9]]


def _plan(family):
    target, variant = target_for_family(FAMILIES[family]), Variant.make("float32", "cpu")
    return target, variant, build_plan(target, variant)


def test_a_transformers_backend_row_declares_hfs_own_projections_for_its_fused_reads():
    target = target_for_family(FAMILIES["smollm3"])
    specs = get_overlay(target.architecture, "transformers").hook_specs(target.hf_config)
    q, k, v = (specs[f"blocks.1.attn.hook_{x}"] for x in "qkv")
    assert {s.module for s in (q, k, v)} == {"model.layers.1.self_attn.qkv_proj"}
    assert [s.unfused.module for s in (q, k, v)] == [f"model.layers.1.self_attn.{x}_proj" for x in "qkv"]
    for fused in (q, k, v):  # the same tensor: the fused read's column cut dropped, nothing else
        assert isinstance(fused.convert[1], Cols)
        assert fused.unfused.convert == (DropBatch(), *fused.convert[2:]) and fused.unfused.read == fused.read
    pre, pre_linear = specs["blocks.1.mlp.hook_pre"], specs["blocks.1.mlp.hook_pre_linear"]
    assert (pre.unfused.module, pre_linear.unfused.module) == ("model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj")
    assert pre.unfused.convert == pre_linear.unfused.convert == (DropBatch(),)
    # reads of no fused module have none
    assert specs["blocks.1.attn.hook_z"].unfused is None and specs["blocks.1.mlp.hook_post"].unfused is None


@pytest.mark.parametrize("family", ["llama", "qwen3", "olmo2"])
def test_a_native_row_declares_none(family):
    target = target_for_family(FAMILIES[family])
    specs = get_overlay(target.architecture, "native").hook_specs(target.hf_config)
    assert not [h for h, s in specs.items() if s.unfused is not None]


def test_the_engine_is_asked_for_both_reads():
    target, variant, plan = _plan("smollm3")
    request = run_request(target, variant, plan, PROMPTS)
    assert ("model.layers.0.self_attn.qkv_proj", "out[0]") in request.reads
    assert {(f"model.layers.0.self_attn.{x}_proj", "out[0]") for x in "qkv"} <= set(request.reads)
    assert {("model.layers.2.mlp.gate_proj", "out[0]"), ("model.layers.2.mlp.up_proj", "out[0]")} <= set(request.reads)


def test_the_plan_keeps_the_fused_read_where_the_tree_has_it():
    _, _, plan = _plan("smollm3")
    unfused = sorted(s.unfused.module for s in plan.specs.values() if s.unfused is not None)
    kept, swapped = plan.reads_found(unfused)  # the 0.32 tree: fused modules, HF's projections gone
    assert kept is plan and swapped == []


def test_the_plan_takes_the_unfused_read_where_the_tree_lacks_the_fused_one():
    _, _, plan = _plan("smollm3")
    n = plan.n_layers
    missing = [f"model.layers.{i}.self_attn.qkv_proj" for i in range(n)]  # 0.27.1-0.30.0: q/k/v apart, gate/up fused
    resolved, swapped = plan.reads_found(missing)
    assert swapped == [f"blocks.{i}.attn.hook_{x}" for i in range(n) for x in "qkv"]
    assert resolved.specs["blocks.0.attn.hook_k"] == plan.specs["blocks.0.attn.hook_k"].unfused
    assert resolved.specs["blocks.0.mlp.hook_pre"] == plan.specs["blocks.0.mlp.hook_pre"]
    assert resolved.cases == plan.cases and plan.specs["blocks.0.attn.hook_k"].module == missing[0]


def test_a_read_with_neither_module_stays_and_never_fires():
    _, _, plan = _plan("smollm3")
    gone = ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.q_proj"]
    resolved, swapped = plan.reads_found(gone)
    assert "blocks.0.attn.hook_q" not in swapped and resolved.specs["blocks.0.attn.hook_q"] == plan.specs["blocks.0.attn.hook_q"]
    assert {"blocks.0.attn.hook_k", "blocks.0.attn.hook_v"} <= set(swapped)


def test_an_alternative_is_one_read_not_a_chain():
    inner = HookSpec("a.q_proj", "out[0]", unfused=HookSpec("a.q", "out"))
    with pytest.raises(ValueError, match="not a chain"):
        HookSpec("a.qkv_proj", "out[0]", unfused=inner)
