"""harness.engines.mla_backends: MLA backends as kernel paths (pure rules; the engines run in tests/engine)."""
from __future__ import annotations

import pytest

from harness.engines import mla_backends as mb
from harness.models.families import FAMILIES
from harness.models.targets import targets_from_options
from harness.values.plan import build_plan
from harness.values.variant import Variant, VariantError


def test_a_cpu_run_always_names_its_mla_backend():
    assert mb.resolve("auto", "cpu") == "CPU_MLA" and mb.resolve("auto", "cuda") == "auto"
    assert mb.engine_kwargs("CPU_MLA") == {"attention_config": {"backend": "CPU_MLA"}}
    assert mb.engine_kwargs("auto") == {}  # vLLM's own pick on CUDA
    with pytest.raises(mb.MlaBackendError, match="runs on cpu, not on cuda"):
        mb.resolve("AMX_MLA", "cuda")
    with pytest.raises(mb.MlaBackendError, match="choose one of"):
        mb.resolve("FLASHMLA", "cpu")


def test_amx_mla_is_refused_before_a_boot_without_amx(monkeypatch):
    monkeypatch.setattr(mb, "amx_available", lambda: False)
    with pytest.raises(VariantError, match="no AMX tiles.*silently run CPU_MLA"):
        Variant.make("bfloat16", "cpu", mla_backend="AMX_MLA")
    monkeypatch.setattr(mb, "amx_available", lambda: True)
    v = Variant.make("bfloat16", "cpu", mla_backend="AMX_MLA")
    assert v.name == "cpu-bfloat16-amx-mla" and v.report_stem == "report-cpu-bfloat16-amx-mla"
    assert v.run_info["mla_backend"] == "AMX_MLA" and Variant.from_result(
        {"dtype": "bfloat16", "device": "cpu", "device_info": v.run_info}) == v


def test_the_default_backend_leaves_names_as_they_were():
    v = Variant.make("float32", "cpu")
    assert v.mla_backend == "CPU_MLA" and v.name == "cpu-float32" and "mla_backend" not in v.run_info
    assert Variant.from_result({"dtype": "float32", "device": "cpu", "device_info": v.run_info}) == v


def test_declared_refusals_and_uncalled_modules_by_backend():
    assert mb.declared_refusal("AMX_MLA", "float32") and mb.declared_refusal("auto", "float32")
    assert mb.declared_refusal("CPU_MLA", "float32") is None and mb.declared_refusal("AMX_MLA", "bfloat16") is None
    assert mb.uncalled_modules("CPU_MLA") == () and mb.uncalled_modules("AMX_MLA") == ("kv_b_proj",)


def test_only_mla_models_get_the_backend():
    mla = type("C", (), {"kv_lora_rank": 512})()
    plain = type("C", (), {"kv_lora_rank": None})()
    assert mb.uses_mla(mla) and not mb.uses_mla(plain)
    assert mb.llm_overrides(plain, "CPU_MLA") == {} and mb.llm_overrides(mla, "CPU_MLA")


def test_hook_v_is_non_firing_where_the_backend_never_calls_kv_b_proj(monkeypatch):
    monkeypatch.setattr(mb, "amx_available", lambda: True)
    target, = targets_from_options("kimi_k2", None)
    cpu = build_plan(target, Variant.make("bfloat16", "cpu"))
    amx = build_plan(target, Variant.make("bfloat16", "cpu", mla_backend="AMX_MLA"))
    assert "blocks.1.attn.hook_v" in cpu.specs and "blocks.1.attn.hook_v" not in amx.specs
    reasons = dict(amx.nonfiring_hooks())
    assert "absorbs kv_b_proj" in reasons["blocks.1.attn.hook_v"]
    assert set(cpu.specs) - set(amx.specs) == {f"blocks.{i}.attn.hook_v" for i in range(3)}


def test_the_mla_families_ship_yarn_and_a_v_head_dim_unlike_the_rope_dim():
    for name in ("kimi_k2", "deepseek_v3", "deepseek_v2", "deepseek_v2_lite"):
        cfg = FAMILIES[name].config
        assert cfg["rope_parameters"]["rope_type"] == "yarn" and cfg["v_head_dim"] != cfg["qk_rope_head_dim"]
        assert not FAMILIES[name].held_out
