"""Captures spilled to disk (harness.spill): values, dtypes and aliases round-trip, shards hold no open
file, layer groups.  The reference forwards that write them: tests/engine/test_grouped_references.py."""
from __future__ import annotations

import pytest
import torch

from harness.spill import ReleasedError, SpilledTensors, release_all, release_spills


def test_round_trip_keeps_values_dtypes_and_aliases(tmp_path):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g, dtype=torch.float64)
    written = {"f64": base, "view": base.t(), "alias": base, "bf16": torch.randn(5, generator=g).bfloat16(),
               "i64": torch.arange(7), "bool": torch.tensor([True, False]), "empty": torch.empty(0, 3)}
    spilled = SpilledTensors(tmp_path / "spill")
    spilled.add(written)
    spilled.add({"later": base * 2})
    assert sorted(spilled) == sorted([*written, "later"]) and len(spilled) == 8 and "view" in spilled
    for key, value in written.items():
        back = spilled[key]
        assert back.dtype == value.dtype and back.shape == value.shape and torch.equal(back, value), key
    assert torch.equal(spilled["later"], base * 2)
    first = spilled["f64"]
    first.zero_()  # a fresh tensor every read: mutating one never reaches the next reader
    assert torch.equal(spilled["f64"], base)
    assert spilled.get("absent") is None
    assert spilled.nbytes() == sum(v.numel() * v.element_size() for v in [*written.values(), base])


def test_shards_hold_no_open_file_and_go_with_the_mapping(tmp_path):
    """A pytest session keeps every run: no handle may stay open, and the disk is freed with the mapping."""
    import gc
    import os

    folder, owned = tmp_path / "spill", tmp_path / "work"
    owned.mkdir()
    (owned / "engine.log").write_text("kept until the captures go")
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    spilled = SpilledTensors(folder, owns=owned)
    for i in range(50):
        spilled.add({f"t{i}": torch.full((3,), float(i))})
    assert float(spilled["t49"][0]) == 49.0
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) <= fds + 1
    other = SpilledTensors(folder)  # a second mapping writing to the same folder
    other.add({"x": torch.ones(2)})
    del spilled
    gc.collect()
    assert not owned.exists() and folder.exists() and len(list(folder.iterdir())) == 1
    assert torch.equal(other["x"], torch.ones(2))
    other.release()
    assert not folder.exists()
    with pytest.raises(ReleasedError, match="reads_captures"):  # never an empty answer: every capture "missing"
        other.get("x")


def test_release_spills_walks_a_run_and_deletes_its_shards(tmp_path):
    from dataclasses import dataclass, field

    @dataclass
    class Capture:
        raw: object
        per_prompt: dict = field(default_factory=dict)

    raw = SpilledTensors(tmp_path / "a", owns=tmp_path / "work")
    (tmp_path / "work").mkdir()
    raw.add({"x": torch.ones(2)})
    prompt = SpilledTensors(tmp_path / "b")
    prompt.add({"y": torch.zeros(3)})
    assert release_spills((Capture(raw, {0: prompt}), None, [torch.ones(1)])) == 2
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "work").exists()
    assert release_spills(Capture(raw)) == 0  # released once


def test_layer_groups_split_by_decoder_layer():
    from harness.references.reference import _layer_groups

    layers, other = _layer_groups({"embed.hook_out", "blocks.10.hook_out", "blocks.2.attn.hook_q",
                                   "blocks.2.hook_in", "ln_final.hook_normalized", "unembed.hook_out"})
    assert layers == [{"blocks.2.attn.hook_q", "blocks.2.hook_in"}, {"blocks.10.hook_out"}]
    assert other == {"embed.hook_out", "ln_final.hook_normalized", "unembed.hook_out"}


def test_release_all_deletes_every_live_mapping_for_an_exit_without_finalization(tmp_path):
    a, b = SpilledTensors(tmp_path / "a"), SpilledTensors(tmp_path / "b", owns=tmp_path / "work")
    (tmp_path / "work").mkdir()
    a.add({"x": torch.ones(1)})
    b.add({"y": torch.ones(1)})
    assert release_all() >= 2
    assert not any((tmp_path / n).exists() for n in ("a", "b", "work"))
    assert release_all() == 0  # nothing live is left
