"""harness.engines.vllm_compat.cache_model_info: the entry it writes is the one vLLM's own
inspection subprocess writes (same file, same hash, same answer), so a warm server's pre-write
changes nothing but the boot time."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")


def _entry(arch: str):
    from vllm.model_executor.models.registry import ModelRegistry

    return ModelRegistry.models[arch]


def test_the_written_entry_is_the_one_vllms_subprocess_writes(tmp_path, monkeypatch):
    import vllm.model_executor.models.llama  # noqa: F401 -- the module must be imported to be cached

    from harness.engines.vllm_compat import cache_model_info

    entry = _entry("LlamaForCausalLM")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(ours))
    written = cache_model_info({"vllm.model_executor.models.llama"})
    assert "vllm.model_executor.models.llama.LlamaForCausalLM" in written
    path = ours / "modelinfos" / entry._get_cache_filename()
    assert path.is_file(), sorted(p.name for p in (ours / "modelinfos").iterdir())
    assert cache_model_info({"vllm.model_executor.models.llama"}) == []  # current entries are left alone

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(theirs))
    entry.inspect_model_cls()  # vLLM's own way: a subprocess, then its cache writer
    assert json.loads(path.read_text()) == json.loads((theirs / "modelinfos" / path.name).read_text())


def test_a_module_not_imported_or_not_named_is_not_cached(tmp_path, monkeypatch):
    from harness.engines.vllm_compat import cache_model_info

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    assert cache_model_info(set()) == []
    assert cache_model_info({"vllm.model_executor.models.no_such_model"}) == []
    assert not (tmp_path / "modelinfos").exists()
