"""harness.references.stored: the reference side stored under a manifest's key and reused
(the engines' round trip is tests/engine/test_stored_references.py; this checks the key, the refusals
and an exact round trip on small tensors).

Contracts checked: key() is a 20-hex sha256 of the manifest, independent of dict order and
changed by any value; ReferenceStore.path is root/<model>/<key>; load returns None where nothing
is stored and raises (naming the folder) where a stored manifest differs from the run's; save
replaces an existing entry atomically (no temporary folder left); NaN floors round-trip as NaN.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from harness.comparison.chaos import ChaoticToken, OwnFlip
from harness.references.reference import ReferenceCapture
from harness.references.stored import FORMAT, ReferenceStore, key

MAN = {"format": FORMAT, "model": "toy", "dtype": "float32", "prompts": [[1, 2, 3]]}


def _refs(value=1.0, floor=1e-7):
    return ReferenceCapture(bridge={0: {"blocks.0.hook_out": torch.full((3, 2), value)}}, compat={},
                            logprobs={0: torch.zeros(3, 5, dtype=torch.float64)},
                            floors={"bridge": {"blocks.0.hook_out": floor}})


def test_key_is_order_free_and_value_sensitive():
    k = key(MAN)
    assert len(k) == 20 and int(k, 16) >= 0
    assert key(dict(reversed(list(MAN.items())))) == k
    assert key({**MAN, "dtype": "bfloat16"}) != k
    assert key({**MAN, "prompts": [[1, 2, 4]]}) != k


def test_path(tmp_path):
    assert ReferenceStore(tmp_path).path(MAN) == tmp_path / "toy" / key(MAN)


def test_load_nothing_stored_is_none(tmp_path):
    assert ReferenceStore(tmp_path).load(MAN) is None


def test_a_stored_manifest_that_differs_is_refused(tmp_path):
    store = ReferenceStore(tmp_path)
    folder = store.save(_refs(), MAN)
    entry = json.loads((folder / "entry.json").read_text())
    entry["manifest"]["dtype"] = "bfloat16"  # a hand-edited entry under the old key
    (folder / "entry.json").write_text(json.dumps(entry))
    with pytest.raises(ValueError, match=r"stored manifest differs from this run's; delete the folder"):
        store.load(MAN)


def test_save_replaces_an_entry_and_leaves_no_temporary(tmp_path):
    store = ReferenceStore(tmp_path)
    store.save(_refs(1.0), MAN)
    folder = store.save(_refs(2.0), MAN)
    back = store.load(MAN)
    assert torch.equal(back.bridge[0]["blocks.0.hook_out"], torch.full((3, 2), 2.0))
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_nan_floor_round_trips_as_nan(tmp_path):
    store = ReferenceStore(tmp_path)
    store.save(_refs(floor=math.nan), MAN)
    assert math.isnan(store.load(MAN).floors["bridge"]["blocks.0.hook_out"])


def _full_refs() -> ReferenceCapture:
    """Every field filled, aliases and all, as a real reference side holds them."""
    t = lambda *s: torch.randn(*s)  # noqa: E731
    out = ReferenceCapture(
        bridge={0: {"blocks.0.hook_out": t(3, 4)}, 1: {"blocks.0.hook_out": t(5, 4)}},
        compat={0: {"blocks.0.hook_resid_post": t(3, 4)}}, logprobs={0: t(3, 7).double(), 1: t(5, 7).double()},
        hf={0: {"model.layers.0": t(3, 4).bfloat16()}}, floors={"bridge": {"blocks.0.hook_out": 1.25e-7}},
        meta={"bridge_boot_s": 1.5, "not_json": object()},
        floor_stats={"median": {"bridge": {"blocks.0.hook_out": 3e-8}}},
        compat_processed={1: {"blocks.0.hook_resid_post": t(5, 4)}},
        chaos=[ChaoticToken(1, 0, 2, 0.5, 0.25, "floor"), OwnFlip(0, 1, 2, "blocks.1.mlp.gate.hook_expert_indices", (0, 3), (0, 2))])
    out.bridge[0]["blocks.1.hook_in"] = out.bridge[0]["blocks.0.hook_out"]  # an alias, as the bridge holds them
    return out


def test_round_trip_is_exact_and_a_different_manifest_is_a_miss(tmp_path):
    refs, man = _full_refs(), {"model": "toy", "dtype": "float32", "prompts": [[1, 2, 3], [4, 5, 6, 7, 8]]}
    store = ReferenceStore(tmp_path)
    assert store.load(man) is None
    folder = store.save(refs, man)
    assert folder.name == key(man) and not list(folder.parent.glob(".tmp-*"))
    back = store.load(man)
    for name in ("bridge", "compat", "hf", "compat_processed"):
        mine, theirs = getattr(refs, name), getattr(back, name)
        assert mine.keys() == theirs.keys()
        for p in mine:
            assert all(torch.equal(mine[p][h], theirs[p][h]) and mine[p][h].dtype == theirs[p][h].dtype for h in mine[p])
    assert all(torch.equal(refs.logprobs[p], back.logprobs[p]) for p in refs.logprobs)
    assert back.floors == refs.floors and back.floor_stats == refs.floor_stats and back.chaos == refs.chaos
    assert back.meta["bridge_boot_s"] == 1.5 and "not_json" not in back.meta and back.meta["stored"] == str(folder)
    assert store.load({**man, "dtype": "bfloat16"}) is None  # another manifest, another key
