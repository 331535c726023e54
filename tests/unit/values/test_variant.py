"""The run's variant as one value, the option table, and the hook vocabulary (pure)."""
from __future__ import annotations

import argparse

import pytest

from harness.frontends.options import OPTIONS, add_to_argparse
from harness.values.variant import Variant, VariantError, variants
from harness.vocab.capture_keys import RAGGED, call_key, capture_key, read_key, strip_call
from harness.vocab.hooks import at_layer, expand_layers, hook_kind, layer_of, matches, template_of


def test_precision_matters_for_cuda_fp32_only():
    assert Variant.make("bfloat16", "cpu", "tf32").precision == "ieee"
    assert Variant.make("float32", "cpu", "tf32").gate_key == "float32"
    v = Variant("float32", "cuda", "tf32")
    assert v.gate_key == "float32-tf32" and "TRITON_F32_DEFAULT" not in v.subject_env and v.name == "cuda-float32-tf32"
    assert Variant("float32", "cuda").subject_env == {"TRITON_F32_DEFAULT": "ieee", "VLLM_USE_V2_MODEL_RUNNER": "0",
                                                      "VLLM_LENS_DISABLE": "1"}  # a peer's plugin, off (variant doc)
    assert Variant("bfloat16", "cuda", compiled=True).cuda_graphs and not Variant(compiled=True).cuda_graphs


def test_a_derived_variant_reapplies_the_rules():
    v = Variant("float32", "cpu", "ieee")
    assert v.derive(dtype="bfloat16") == Variant("bfloat16", "cpu")
    assert v.derive(compiled=True).compiled and v.derive(precision="tf32").precision == "ieee"  # CPU: ieee


def test_names_match_the_report_files():
    assert Variant().report_stem == "report" and Variant().name == "cpu-float32"
    assert Variant("bfloat16").report_stem == "report-cpu-bfloat16"
    assert Variant(subject="tl-vllm").report_stem == "report-tl-vllm"
    assert Variant(subject="vllm-hidden-states").report_stem == "report-vllm-hidden-states"
    assert Variant(subject="vllm-hidden-states").name == "vllm-hidden-states-cpu-float32"
    assert Variant("float32", "cuda", "ieee", True, 2).report_stem == "report-cuda-float32-ieee-tp2-compiled"
    assert Variant("float32", "cuda", "ieee", True, 2).name == "cuda-float32-ieee-tp2-compiled"
    ray = Variant("bfloat16", "cuda", tp=2, executor="ray")
    assert ray.name == "cuda-bfloat16-tp2-ray" and ray.report_stem == "report-cuda-bfloat16-tp2-ray"
    assert ray.work_prefix != Variant("bfloat16", "cuda", tp=2).work_prefix
    for v in (Variant(), Variant("bfloat16", "cuda", compiled=True), Variant("float32", "cuda", "tf32", tp=2),
              Variant(subject="tl-vllm"), ray):
        result = {"dtype": v.dtype, "device": v.device, "compiled": v.compiled, "subject": v.subject,
                  "device_info": v.run_info}
        assert Variant.from_result(result) == v


@pytest.mark.parametrize("kw, words", [
    ({"dtype": "float8"}, ["--dtype", "float32"]),
    ({"precision": "fast"}, ["--precision", "ieee"]),
    ({"tp": 0}, ["--tp 0"]),
    ({"subject": "tl-vllm", "tp": 2}, ["tl-vllm", "--tp 2"]),
    ({"runner": "v0"}, ["--runner", "v1", "v2", "auto"]),
    ({"device": "tpu"}, ["--device", "cuda"]),
    ({"executor": "slurm"}, ["--executor", "mp", "ray"]),
    ({"executor": "ray", "device": "cpu"}, ["--executor ray on cpu", "does not support ray", "--executor mp"]),
    ({"executor": "ray", "subject": "tl-vllm"}, ["--executor ray", "--subject vllm"]),
    ({"subject": "vllm-hidden-states", "serving": "decode"}, ["vllm-hidden-states", "--serving decode"]),
    ({"subject": "vllm-hidden-states", "tp": 2}, ["vllm-hidden-states", "--tp 2", "--subject vllm"]),
    ({"subject": "hidden-states"}, ["--subject 'hidden-states'", "vllm-hidden-states"]),
])
def test_bad_variants_name_the_option_and_the_choices(kw, words):
    with pytest.raises(VariantError) as exc:
        Variant.make(**kw)
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_variants_cross_product_collapses_precision_off_cuda_fp32():
    vs = variants(["float32", "bfloat16"], "cpu", ["ieee", "tf32"], ["eager", "compiled"])
    assert [v.name for v in vs] == ["cpu-float32-compiled", "cpu-bfloat16-compiled", "cpu-float32", "cpu-bfloat16"]
    with pytest.raises(VariantError, match="--modes"):
        variants(["float32"], "cpu", ["ieee"], ["turbo"])


def test_options_are_declared_once_and_register_into_argparse():
    parser = argparse.ArgumentParser()
    add_to_argparse(parser)
    args = parser.parse_args(["--dtype", "float32,bfloat16", "--tp", "2"])
    assert args.dtype == "float32,bfloat16" and args.tp == 2 and args.device == "auto"
    flags = [o.flag for o in OPTIONS]
    assert len(flags) == len(set(flags))


def test_hook_vocabulary():
    assert layer_of("blocks.12.attn.hook_q") == 12 and layer_of("embed.hook_out") is None
    assert hook_kind("blocks.12.attn.hook_q") == "attn.hook_q" == hook_kind("blocks.{i}.attn.hook_q")
    assert template_of("blocks.3.hook_out") == "blocks.{i}.hook_out" and at_layer("blocks.{i}.hook_out", 3) == "blocks.3.hook_out"
    assert expand_layers("blocks.{i}.x", 2) == ["blocks.0.x", "blocks.1.x"] and expand_layers("ln_final.x", 5) == ["ln_final.x"]
    assert matches("blocks.{i}.mlp.hook_out", "blocks.4.mlp.hook_out")
    assert not matches("blocks.{i}.mlp.hook_out", "blocks.4.mlp.gate.hook_out") and matches("*", "anything")


def test_capture_keys_round_trip():
    rk = read_key("model.layers.0", "out[0]+out[1]")
    for prompt in (3, RAGGED):
        key = capture_key(prompt, rk, 2)
        assert key == f"{prompt}:{rk}#2" and strip_call(key) == f"{prompt}:{rk}"
    assert call_key(rk, 3) == f"{rk}#3"


def test_the_executor_reaches_vllms_arguments():
    from harness.engines.vllm_compat import llm_kwargs

    assert "distributed_executor_backend" not in llm_kwargs(device="cuda", tp=2)  # vLLM's default (mp)
    assert llm_kwargs(device="cuda", tp=2, executor="ray")["distributed_executor_backend"] == "ray"
