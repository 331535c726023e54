"""A checkpoint holding one NaN weight: both engines produce NaN from there on, and two NaN
captures must never compare as agreement.  Real engines end to end (one vLLM boot, fp32).

Before this rule the NaN hooks read rel_err 0.0 and passed, log-probs and argmax too: the
comparison ignores NaN on the reference side (it marks entries vLLM did not return)."""
from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.parity

PLANTED = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    from harness.models.checkpoints import checkpoint_dir
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_path
    from harness.pipeline.runner import run_model
    from harness.pipeline.variant import Variant

    src = checkpoint_dir(FAMILIES["llama"])
    dst = tmp_path_factory.mktemp("nan") / "llama-nan"
    shutil.copytree(src, dst)
    (weights,) = dst.glob("*.safetensors")
    tensors = load_file(weights)
    tensors[PLANTED] = tensors[PLANTED].clone()
    tensors[PLANTED][3, 7] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt"})
    run = run_model(target_for_path(str(dst)), Variant.make("float32", "cpu"),
                    hooks={"blocks.0.hook_out", "blocks.1.mlp.hook_post", "blocks.1.mlp.hook_out", "blocks.1.hook_out",
                           "blocks.2.hook_out", "ln_final.hook_normalized"})
    assert run.result.error is None, run.result.error
    return run


def test_nan_rows_are_errors_naming_the_first_non_finite_hook(nan_run):
    rows = {(r.reference, r.hook): r for r in nan_run.result.rows}
    assert rows[("bridge", "blocks.0.hook_out")].status == "pass"  # upstream of the NaN weight
    assert rows[("bridge", "blocks.1.mlp.hook_post")].status == "pass"  # down_proj's input is still finite
    for hook in ("blocks.1.mlp.hook_out", "blocks.1.hook_out", "blocks.2.hook_out", "ln_final.hook_normalized"):
        row = rows[("bridge", hook)]
        assert row.status == "error", (hook, row.status, row.message)
        assert "non-finite values" in row.message and "NaN in vLLM's" in row.message
        assert "first non-finite hook of vLLM in forward order: NaN in vLLM's blocks.1.mlp.hook_out" in row.message
    assert rows[("hf", "logprobs")].status == "error" and rows[("hf", "argmax")].status == "error"


def test_a_run_with_nan_never_reports_pass(nan_run):
    from harness.reporting.report import summarize

    s = summarize(nan_run.result.to_dict())
    assert s["verdict"] == "error" and s["errors"] > 0
