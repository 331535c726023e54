"""Captures spilled to disk (harness.spill) and the reference forwards that write them a few layers
at a time (harness.references.reference._run_cache): the same values as holding everything, bitwise."""
from __future__ import annotations

import pytest
import torch

from harness.spill import SpilledTensors


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
    assert not folder.exists() and len(other) == 0


def test_layer_groups_split_by_decoder_layer():
    from harness.references.reference import _layer_groups

    layers, other = _layer_groups({"embed.hook_out", "blocks.10.hook_out", "blocks.2.attn.hook_q",
                                   "blocks.2.hook_in", "ln_final.hook_normalized", "unembed.hook_out"})
    assert layers == [{"blocks.2.attn.hook_q", "blocks.2.hook_in"}, {"blocks.10.hook_out"}]
    assert other == {"embed.hook_out", "ln_final.hook_normalized", "unembed.hook_out"}


@pytest.mark.parity
def test_grouped_reference_forwards_capture_what_one_forward_does(tmp_path, monkeypatch):
    """The real TransformerBridge on a synthetic checkpoint: every hook, one forward holding all of
    them vs one layer per forward (the smallest spill budget), compared bitwise; compatibility mode too."""
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.references import reference
    from harness.references.reference import _boot_bridge, _run_cache
    from harness.comparison.shapes import reference_to_canonical

    target = target_for_family(FAMILIES["qwen3"])
    bridge = _boot_bridge(target.checkpoint, torch.float32, "cpu")
    tokens = [1, 5, 9, 2, 7, 3, 11]
    names = {n for n in bridge.hook_dict if n.startswith(("blocks.", "embed.", "ln_final.", "unembed."))}
    for mode in ("canonical", "compat"):
        if mode == "compat":
            bridge.enable_compatibility_mode(no_processing=True)
            names = {n for n in bridge.hook_dict if n.startswith(("blocks.", "hook_", "ln_final."))}
        with torch.no_grad():
            _, cache = bridge.run_with_cache(torch.tensor([tokens]), names_filter=lambda n: n in names)
        whole = {n: reference_to_canonical(n, cache[n]) for n in names if n in cache}
        monkeypatch.setattr(reference, "SPILL_GROUP_BYTES", 1)  # one layer per forward
        spilled = SpilledTensors(tmp_path / mode)
        _run_cache(bridge, tokens, names, "cpu", spilled)
        assert set(spilled) == set(whole) and len(whole) > 20, mode
        differ = [n for n in whole if not torch.equal(spilled[n], whole[n].contiguous())]
        assert not differ, f"{mode}: grouped forwards changed {differ[:5]}"
