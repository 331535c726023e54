"""harness.pipeline.overlap.overlaps: a run's references go beside its engine on the CPU, for a one-token
serving shape and a small checkpoint only; the packaged real checkpoints run their two sides in turn."""
from __future__ import annotations

import pytest

from harness.pipeline.overlap import OVERLAP_MAX_WEIGHT_BYTES, overlaps, weight_bytes
from harness.values.variant import Variant


def _checkpoint(tmp_path, weights: int):
    (tmp_path / "config.json").write_text("{}" + " " * 10_000)  # not a weight file: never counted
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(weights)
    return tmp_path


def test_a_small_checkpoint_overlaps_on_the_cpu_for_one_token_shapes_only(tmp_path):
    ckpt = _checkpoint(tmp_path, 2_000_000)
    assert weight_bytes(ckpt) == 2_000_000
    assert overlaps(Variant.make("float32", "cpu"), ckpt)
    assert overlaps(Variant.make("float32", "cpu", serving="prefix-cache"), ckpt)
    assert not overlaps(Variant.make("float32", "cpu", serving="decode"), ckpt)


def test_a_checkpoint_past_the_limit_runs_its_two_sides_in_turn(tmp_path):
    ckpt = _checkpoint(tmp_path, OVERLAP_MAX_WEIGHT_BYTES + 1)
    assert not overlaps(Variant.make("float32", "cpu"), ckpt)
    gguf = tmp_path / "one.gguf"  # a single-file checkpoint counts as itself
    with open(gguf, "wb") as f:
        f.truncate(OVERLAP_MAX_WEIGHT_BYTES + 1)
    assert weight_bytes(gguf) == OVERLAP_MAX_WEIGHT_BYTES + 1 and not overlaps(Variant.make("float32", "cpu"), gguf)


@pytest.mark.parametrize("family,expected", [("llama", True), ("smollm2", False), ("gemma3_270m", False)])
def test_the_default_families_fall_on_the_side_the_measurements_chose(family, expected):
    from harness.models.families import FAMILIES
    from harness.models.targets import TargetError, target_for_family
    from pathlib import Path

    try:
        target = target_for_family(FAMILIES[family])
    except TargetError as exc:  # a packaged checkpoint whose package is not installed
        pytest.skip(f"{family}: its checkpoint is not here: {exc}")
    assert overlaps(Variant.make("bfloat16", "cpu"), Path(target.checkpoint)) is expected
