"""Stored references (harness.references.stored): computed once, saved with a manifest, reused by a
later subject run; a different manifest never reuses them.  A pure round trip on small tensors, and
one real round trip through the engines (qwen3, fp32)."""
from __future__ import annotations

import pytest
import torch

from harness.comparison.chaos import ChaoticToken
from harness.references.reference import ReferenceCapture
from harness.references.stored import ReferenceStore, key


def _refs() -> ReferenceCapture:
    t = lambda *s: torch.randn(*s)  # noqa: E731
    out = ReferenceCapture(
        bridge={0: {"blocks.0.hook_out": t(3, 4)}, 1: {"blocks.0.hook_out": t(5, 4)}},
        compat={0: {"blocks.0.hook_resid_post": t(3, 4)}}, logprobs={0: t(3, 7).double(), 1: t(5, 7).double()},
        hf={0: {"model.layers.0": t(3, 4).bfloat16()}}, floors={"bridge": {"blocks.0.hook_out": 1.25e-7}},
        meta={"bridge_boot_s": 1.5, "not_json": object()},
        floor_stats={"median": {"bridge": {"blocks.0.hook_out": 3e-8}}},
        compat_processed={1: {"blocks.0.hook_resid_post": t(5, 4)}},
        chaos=[ChaoticToken(1, 0, 2, 0.5, 0.25, "floor")])
    out.bridge[0]["blocks.1.hook_in"] = out.bridge[0]["blocks.0.hook_out"]  # an alias, as the bridge holds them
    return out


def test_round_trip_is_exact_and_a_different_manifest_is_a_miss(tmp_path):
    refs, man = _refs(), {"model": "toy", "dtype": "float32", "prompts": [[1, 2, 3], [4, 5, 6, 7, 8]]}
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


@pytest.mark.parity
def test_a_second_run_reuses_the_stored_references_and_gives_the_same_rows(tmp_path):
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.pipeline.runner import run_model
    from harness.values.settings import RunSettings
    from harness.values.variant import Variant

    target, settings = target_for_family(FAMILIES["qwen3"]), RunSettings(references_dir=tmp_path / "refs")
    first = run_model(target, Variant.make(), settings=settings).result
    second = run_model(target, Variant.make(), settings=settings).result
    assert first.error is None and second.error is None, (first.error, second.error)
    assert first.references_stored["action"] == "computed and stored"
    assert second.references_stored == {"action": "loaded", "path": first.references_stored["path"]}
    assert "references.bridge_boot" in first.timings["phases"]
    assert "references.bridge_boot" not in second.timings["phases"]  # no reference engine booted
    assert [(r.reference, r.hook, r.status, r.rel_err) for r in first.rows] == \
        [(r.reference, r.hook, r.status, r.rel_err) for r in second.rows]
