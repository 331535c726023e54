"""Stored references (harness.references.stored): computed once, saved with a manifest, reused by a
later subject run: one real round trip through the engines (qwen3, fp32).  The pure round trip on
small tensors is tests/unit/references/test_stored.py's."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.parity


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
