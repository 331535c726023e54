"""Refusals by an ``"hf:<model_type>"`` probe (harness.pipeline.refusals.recheck_hf_missing): architectures vLLM's
registry and TransformerLens know but the installed transformers has no model_type for (remote code).

Engine-free: the rows' facts are read from the installed sources (transformers' auto mapping, vLLM's registry
source, TransformerLens's adapter factory), nothing builds or loads a checkpoint for them, and the re-check turns
into an error the day transformers gains the model_type or vLLM's registry changes.
"""
from __future__ import annotations

import pytest

from harness.models.families import FAMILIES, ModelSpec, Refusal
from harness.values.results import ModelResult
from harness.values.variant import Variant

HF_MISSING = {"baichuan": ("BaichuanForCausalLM", ("removed", "0.23.0")),
              "internlm2": ("InternLM2ForCausalLM", ("native", "internlm2.InternLM2ForCausalLM")),
              "ouro": ("OuroForCausalLM", ("removed", "0.26.0")),
              "exaone": ("ExaoneForCausalLM", ("native", "exaone.ExaoneForCausalLM"))}


@pytest.fixture
def no_building(monkeypatch):
    """Any attempt to build or load a checkpoint, resolve an architecture through transformers or boot vLLM fails."""
    import harness.models.checkpoints as checkpoints
    import harness.pipeline.refusals as refusals

    def boom(*a, **k):
        raise AssertionError("nothing may be built, loaded or booted for an 'hf:' refusal")
    monkeypatch.setattr(checkpoints, "checkpoint_dir", boom)
    monkeypatch.setattr(checkpoints, "build_checkpoint", boom, raising=False)
    monkeypatch.setattr(refusals, "capture_vllm", boom)
    monkeypatch.setattr(refusals, "launch_subject", boom)


def test_the_rows_declare_what_the_installed_sources_say():
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES

    from harness.engines.vllm_compat import registry_entry

    for name, (arch, registry) in HF_MISSING.items():
        spec = FAMILIES[name]
        assert spec.refused.probe == f"hf:{spec.model_type}" and spec.refused.hf_model_type == name
        assert spec.model_type not in CONFIG_MAPPING_NAMES  # transformers has no config class for it
        assert spec.architecture == spec.released_architecture == arch and not spec.config
        assert not spec.builds_checkpoint and spec.norm_weight_offset == 0.0
        assert arch in SUPPORTED_ARCHITECTURES  # TransformerLens 4.3.0 has an adapter
        assert spec.refused.vllm_registry == registry_entry(arch) == registry
        reason = spec.refused.reason
        assert f"transformers {transformers.__version__}" in reason and "remote code" in reason
        assert arch in reason and (registry[1] in reason) and "TransformerLens 4.3.0" in reason
        assert name in __import__("harness.models.families", fromlist=["x"]).DEFAULT_FAMILIES
    # EXAONE-4 is transformers' own: its row runs (overlays/exaone4.py), unlike EXAONE-3.x's
    assert "exaone4" in CONFIG_MAPPING_NAMES and FAMILIES["exaone4"].refused is None


def test_an_hf_probe_is_declared_with_its_facts():
    with pytest.raises(ValueError, match="vllm_registry"):
        Refusal("why", probe="hf:baichuan")
    with pytest.raises(ValueError, match="vllm_registry"):
        Refusal("why", probe="boot", vllm_registry=("native", "x.Y"))
    with pytest.raises(ValueError, match="hf:<model_type"):
        Refusal("why", probe="hf:", vllm_registry=("native", "x.Y"))
    refusal = Refusal("why", probe="hf:baichuan", vllm_registry=("removed", "0.23.0"))
    for bad in (dict(model_type="internlm2", released_architecture="BaichuanForCausalLM"),
                dict(model_type="baichuan"),
                dict(model_type="baichuan", released_architecture="BaichuanForCausalLM", config={"hidden_size": 8})):
        with pytest.raises(ValueError, match="released_architecture"):
            ModelSpec("x", refused=refusal, **bad)
    assert Refusal("why", probe="op:selective_scan_fwd").hf_model_type is None
    assert FAMILIES["t5"].builds_checkpoint and FAMILIES["qwen3"].builds_checkpoint


def test_nothing_is_built_for_them(no_building):
    from harness.models.targets import TargetError, target_for_family
    from harness.pipeline.refusals import applies
    from harness.values.fingerprint import fingerprint

    for name, (arch, _) in HF_MISSING.items():
        t = target_for_family(FAMILIES[name])
        assert t.checkpoint is None and t.overlay is None and t.architecture == arch
        assert t.overlay_name == "no overlay (declared refused)"
        assert applies(t, Variant()) and applies(t, Variant(device="cuda"))
        with pytest.raises(TargetError, match="no checkpoint"):  # never AutoConfig.from_pretrained("None")
            t.hf_config
        assert fingerprint(t, Variant(), {"vllm": "0.32.0"})
        assert ModelResult.start(t, Variant()).checkpoint == ""


def test_the_recheck_skips_while_transformers_lacks_it(no_building):
    from harness.models.targets import target_for_family
    from harness.pipeline.runner import run_model

    run = run_model(target_for_family(FAMILIES["internlm2"]), Variant.make("bfloat16", "cpu"))
    r = run.result
    assert r.error is None and r.skipped and not r.rows
    assert "transformers" in r.skipped and "has no model_type 'internlm2'" in r.skipped
    assert "re-checked before anything is built" in r.skipped
    assert "maps it to its own class internlm2.InternLM2ForCausalLM" in r.skipped
    assert r.summary["verdict"] == "skipped"


@pytest.mark.parametrize("name, todo", [("internlm2", "declare internlm2 as a family that runs"),
                                        ("exaone", "declare exaone as a family that runs"),
                                        ("baichuan", "refused by a boot probe"),
                                        ("ouro", "refused by a boot probe")])
def test_the_day_transformers_has_the_model_type_the_row_is_an_error(no_building, monkeypatch, name, todo):
    import harness.pipeline.refusals as refusals
    from harness.models.targets import target_for_family

    monkeypatch.setattr(refusals, "hf_config_class", lambda mt: f"{mt.capitalize()}Config")
    t = target_for_family(FAMILIES[name])
    result = ModelResult.start(t, Variant())
    refusals.recheck_architecture(t, Variant(), result, None)
    assert result.skipped is None and "declared refusal no longer holds" in result.error
    assert f"has model_type {name!r}" in result.error and todo in result.error


def test_a_changed_vllm_registry_makes_the_row_stale(no_building):
    import harness.pipeline.refusals as refusals
    from harness.models.targets import target_for_family

    t = target_for_family(FAMILIES["internlm2"])
    source = "_TEXT_GENERATION_MODELS = {}\n_PREVIOUSLY_SUPPORTED_MODELS = {'InternLM2ForCausalLM': '0.40.0'}\n"
    result = ModelResult.start(t, Variant())
    refusals.recheck_hf_missing(t, Variant(), result, registry_source=source)
    assert result.skipped is None and "declared refusal is stale" in result.error
    assert "supported only until v0.40.0" in result.error


def test_registry_entry_reads_each_table():
    from harness.engines.vllm_compat import registry_entry

    source = ("_TEXT_GENERATION_MODELS = {'A': ('a', 'A'), 'T': ('transformers', 'TransformersForCausalLM')}\n"
              "_PREVIOUSLY_SUPPORTED_MODELS = {'R': '0.1.0'}\n")
    assert registry_entry("A", source) == ("native", "a.A")
    assert registry_entry("T", source) == ("transformers", "")
    assert registry_entry("R", source) == ("removed", "0.1.0")
    assert registry_entry("N", source) == ("absent", "")
    with pytest.raises(LookupError, match="_TEXT_GENERATION_MODELS"):
        registry_entry("A", "X = {}\n")


@pytest.mark.parametrize("version, holds", [("0.20.2", True), ("0.23.0", True), ("0.24.0", False)])
def test_a_line_older_than_the_declared_removal_still_lists_the_architecture(no_building, version, holds):
    """baichuan declares ("removed", "0.23.0"): vLLM 0.20.2 (the CUDA line) still maps BaichuanForCausalLM to its own
    class, which is the row's history, not a stale row; a line after 0.23.0 that lists it again is stale."""
    import harness.pipeline.refusals as refusals
    from harness.models.targets import target_for_family

    t = target_for_family(FAMILIES["baichuan"])
    assert tuple(t.refusal_on("cpu").vllm_registry) == ("removed", "0.23.0")
    source = "_TEXT_GENERATION_MODELS = {'BaichuanForCausalLM': ('baichuan', 'BaichuanForCausalLM')}\n"
    result = ModelResult.start(t, Variant())
    refusals.recheck_hf_missing(t, Variant(), result, registry_source=source, vllm_version=version)
    if holds:
        assert result.error is None and "re-checked before anything is built" in result.skipped
        assert f"registry ({version}) still maps it to its own class baichuan.BaichuanForCausalLM" in result.skipped
    else:
        assert result.skipped is None and "declared refusal is stale" in result.error
