"""Declared refusals (harness.pipeline.refusals): the rows are data, and the re-check is strict.

Engine-free: the declarations' shape, which devices a refusal covers, and how the parity suite
turns a refused family into one test (the re-checks themselves boot vLLM or probe its ops, and
run in the parity suite: ``pytest parity_tests --model t5,mamba,jamba``).
"""
from __future__ import annotations

import pytest

from harness.models.families import FAMILIES, Refusal
from harness.values.variant import Variant


def test_a_refusal_names_its_probe():
    with pytest.raises(ValueError, match="op:<name"):
        Refusal("why", probe="crash")
    with pytest.raises(ValueError, match="op:<name"):
        Refusal("why", probe="op:")
    assert Refusal("why", probe="op:selective_scan_fwd").devices == ("cpu", "cuda")


def test_the_refused_rows_say_why_and_are_checked_before_a_crash():
    refused = {n: s.refused for n, s in FAMILIES.items() if s.refused is not None}
    assert {"t5", "mamba", "jamba"} <= set(refused)
    assert all(r.reason for r in refused.values())
    # Mamba-1 mixers load and then crash on CPU: an op probe, never a boot; on CUDA they run
    assert refused["mamba"].probe == refused["jamba"].probe == "op:selective_scan_fwd"
    assert refused["mamba"].devices == refused["jamba"].devices == ("cpu",)
    assert refused["t5"].probe == "boot" and set(refused["t5"].devices) == {"cpu", "cuda"}
    assert FAMILIES["t5"].auto_class == "AutoModelForSeq2SeqLM"


def test_a_refusal_applies_on_its_devices_only_and_the_plan_says_there_is_no_overlay():
    from harness.models.targets import target_for_family
    from harness.values.plan import build_plan
    from harness.pipeline.refusals import applies
    from overlays import NoOverlayError

    dsa = target_for_family(FAMILIES["glm_moe_dsa"])  # GLM-5: refused on CPU, no CUDA overlay yet
    assert dsa.overlay is None and dsa.architecture == "GlmMoeDsaForCausalLM"
    assert applies(dsa, Variant()) and not applies(dsa, Variant(device="cuda"))
    with pytest.raises(NoOverlayError, match="declared refused on cpu only, and runs on cuda"):
        build_plan(dsa, Variant(device="cuda"))
    # Mamba-1 and Jamba have their overlays (overlays/mamba.py, overlays/jamba.py): refused on CPU, planned on CUDA
    for name in ("mamba", "jamba"):
        t = target_for_family(FAMILIES[name])
        assert t.overlay is not None and applies(t, Variant()) and not applies(t, Variant(device="cuda"))
        assert build_plan(t, Variant(device="cuda")).cases
    assert not applies(target_for_family(FAMILIES["qwen3"]), Variant())


def test_an_import_probe_names_a_module():
    from harness.models.families import FAMILIES, Refusal

    assert Refusal("x", probe="import:vllm.model_executor.models.qwen3_5").probe.endswith("qwen3_5")
    with pytest.raises(ValueError, match="import:<vLLM model module"):
        Refusal("x", probe="import:")
    # Qwen3.5's vLLM module imports torchvision, which the CPU venv lacks: checked by importing, not by a boot
    assert FAMILIES["qwen3_5"].refused.probe == FAMILIES["qwen3_5_moe"].refused.probe == \
        "import:vllm.model_executor.models.qwen3_5"
