"""The pure logic of vLLM's hidden-state export as a subject (harness.engines.subject_hidden_states):
which layer ids are asked for, which TransformerLens hook each id is, the plan built from them, and
the KV cache sized for the extra layer.  The engine-backed run is tests/engine/test_hidden_states_subject.py."""
from __future__ import annotations

import pytest

from harness.engines.subject_hidden_states import (CPU_CONNECTOR, NOT_EXPORTED, hidden_states_plan,
                                                   hook_for_layer_id, kv_bytes, layer_ids, raw_module)
from overlays.base import HookSpec, NonFiring


class _Cfg:
    num_hidden_layers = 3
    hidden_size = 128


def test_every_boundary_is_asked_for_by_default():
    assert layer_ids(3) == [0, 1, 2, 3]
    assert layer_ids(3, [0, 3]) == [0, 3]


@pytest.mark.parametrize("ids, words", [
    ([3, 0], ["ascending", "sorts"]),  # vLLM would put id 0's state in the first slot (measured)
    ([1, 1], ["each once"]),
    ([0, 4], ["[4] out of range", "0..3"]),
    ([-1], ["[-1] out of range"]),
    ([True], ["out of range"]),
    ([], ["ascending"]),
])
def test_ids_vllm_would_mislabel_are_refused(ids, words):
    with pytest.raises(ValueError) as exc:
        layer_ids(3, ids)
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_layer_id_k_is_the_stream_entering_block_k_and_id_L_the_last_output_before_the_final_norm():
    assert hook_for_layer_id(0, 3) == ["blocks.0.hook_in"]
    assert hook_for_layer_id(1, 3) == ["blocks.0.hook_out", "blocks.1.hook_in"]
    assert hook_for_layer_id(3, 3) == ["blocks.2.hook_out"]  # never ln_final
    with pytest.raises(ValueError, match="out of range"):
        hook_for_layer_id(4, 3)


def test_the_plan_offers_the_residual_stream_and_declares_everything_else_not_exported():
    ours = {"embed.hook_out": HookSpec("model.embed_tokens"),
            "blocks.0.hook_in": HookSpec("model.layers.0", references=(("hf", None),)),
            **{f"blocks.{i}.{k}": HookSpec(f"model.layers.{i}") for i in range(3)
               for k in ("hook_out", "attn.hook_q", "mlp.hook_out")},
            "ln_final.hook_normalized": HookSpec("model.norm")}
    specs, derived, nonfiring = hidden_states_plan(_Cfg(), ours, {"blocks.{i}.attn.hook_pattern": object()},
                                                   [NonFiring("unembed.hook_out", "the overlay's reason")])
    assert set(specs) == {f"blocks.{i}.hook_{s}" for i in range(3) for s in ("in", "out")} and derived == {}
    assert specs["blocks.0.hook_in"].module == raw_module(0) == "hidden_states.layer_id_0"
    assert specs["blocks.1.hook_in"].raw_key == specs["blocks.0.hook_out"].raw_key == "hidden_states.layer_id_1|out"
    assert specs["blocks.2.hook_out"].module == raw_module(3)
    assert all(s.read == "out" and not s.convert and s.width == 128 for s in specs.values())
    # what a reference calls a hook is the overlay's fact, kept
    assert specs["blocks.0.hook_in"].references == (("hf", None),) and specs["blocks.1.hook_in"].references == ()
    assert [nf.template for nf in nonfiring] == ["embed.hook_out", "blocks.{i}.attn.hook_q", "blocks.{i}.mlp.hook_out",
                                                 "ln_final.hook_normalized", "blocks.{i}.attn.hook_pattern",
                                                 "unembed.hook_out"]
    assert {nf.reason for nf in nonfiring} == {NOT_EXPORTED}


def test_a_subset_of_ids_offers_only_their_hooks():
    specs, _, nonfiring = hidden_states_plan(_Cfg(), {}, ids=[0, 3])
    assert set(specs) == {"blocks.0.hook_in", "blocks.2.hook_out"}
    assert {nf.template: nf.reason for nf in nonfiring} == {  # the others named, not dropped
        h: "layer id not asked of vLLM (ids [0, 3])" for h in ("blocks.0.hook_out", "blocks.1.hook_in",
                                                              "blocks.1.hook_out", "blocks.2.hook_in")}


def test_the_kv_cache_holds_the_hidden_state_layer_too():
    assert kv_bytes(1000, 4, 128, 4, 10) == 1000 + 2 * 4 * 128 * 4 * 10


def test_the_build_plan_of_llama_gives_rows_on_every_reference():
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.values.plan import build_plan
    from harness.values.variant import Variant

    target = target_for_family(FAMILIES["llama"])
    plan = build_plan(target, Variant(subject="vllm-hidden-states"))
    n = target.hf_config.num_hidden_layers
    hooks = {f"blocks.{i}.hook_{s}" for i in range(n) for s in ("in", "out")}
    assert set(plan.specs) == hooks and plan.derived == {}
    for ref in ("bridge", "compat", "compat-processed", "hf", "bridge~hf", "bridge-ragged"):
        assert {c.hook for c in plan.cases if c.reference == ref} - {"logprobs", "argmax"} == hooks, ref
    assert {c.hook for c in plan.cases if c.reference == "hf"} >= {"logprobs", "argmax"}
    nonfiring = dict(plan.nonfiring_hooks())
    assert nonfiring["ln_final.hook_normalized"] == NOT_EXPORTED and not hooks & set(nonfiring)
    assert "extract_hidden_states" in plan.overlay_name


def test_the_cpu_connector_is_vllms_with_its_write_replaced():
    import harness.engines.subject_hidden_states as module
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector)

    cls = getattr(module, CPU_CONNECTOR)  # what vLLM's connector factory does with kv_connector_module_path
    assert issubclass(cls, ExampleHiddenStatesConnector) and cls.__name__ == CPU_CONNECTOR
    assert "_submit_async_write" in vars(cls) and "get_finished" not in vars(cls)
    with pytest.raises(AttributeError):
        module.NoSuchConnector  # noqa: B018
