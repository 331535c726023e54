"""MLA (DeepSeek, Kimi) on each CPU kernel path: ``CPU_MLA`` is every CPU run's (the parity suite and the bf16
gate), ``AMX_MLA`` is checked here where the CPU has AMX tiles -- bf16 gated like any family, fp32 the backend's
declared refusal re-checked by booting (harness.engines.mla_backends).  Real engines."""
from __future__ import annotations

import pytest

from harness.engines.mla_backends import amx_available
from harness.models.families import DEFAULT_FAMILIES, FAMILIES, known_bug_on

pytestmark = pytest.mark.parity

MLA = [f for f in DEFAULT_FAMILIES if FAMILIES[f].config.get("kv_lora_rank")
       and not known_bug_on(FAMILIES[f].known_vllm_bug, "bfloat16", "cpu")
       and FAMILIES[f].refusal_on("cpu") is None]  # GLM-5: sparse MLA, refused on CPU
NO_AMX = "this CPU has no AMX tiles (torch.cpu._is_amx_tile_supported() is False): vLLM's AMX_MLA path does not exist here"


def test_the_mla_families_are_in_the_default_run():
    assert {"kimi_k2", "deepseek_v3", "deepseek_v2", "deepseek_v2_lite"} <= set(MLA)


@pytest.mark.parametrize("family", MLA)
def test_amx_mla_bf16_passes_with_v_non_firing(parity_session, family):
    if not amx_available():
        pytest.skip(NO_AMX)
    run = parity_session.run(family, dtype="bfloat16", compiled=False, mla_backend="AMX_MLA")
    assert run.result.error is None, run.result.error
    bad = [r.message for r in run.result.rows if r.status in ("fail", "error") and not r.known_issue]
    assert not bad, bad[:3]
    assert run.result.summary["verdict"] == "pass"
    assert "amx_mla" in run.result.kernel_path
    assert any(nf["template"] == "blocks.{i}.attn.hook_v" for nf in run.result.nonfiring)


def test_amx_mla_fp32_is_the_declared_refusal_rechecked(parity_session):
    if not amx_available():
        pytest.skip(NO_AMX)
    run = parity_session.run("kimi_k2", dtype="float32", compiled=False, mla_backend="AMX_MLA")
    assert run.result.error is None, run.result.error
    assert "AMX_MLA" in run.result.skipped and "re-checked: vLLM still refuses" in run.result.skipped
    assert "expect weight to be bfloat16" in run.result.skipped  # vLLM's own words
