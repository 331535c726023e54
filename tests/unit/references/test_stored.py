"""harness.references.stored: the reference side stored under a manifest's key and reused
(the full round trip is in tests/test_stored_references.py; this checks the key and the refusals).

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
