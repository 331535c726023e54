"""Fault injection: plant mapping bugs in a real overlay and prove the suite fails them.

Runs the real engines end to end (one extra vLLM boot per dtype) with a Gemma
overlay carrying six classic mapping bugs, each on a different hook, in fp32
and bf16, and asserts: every planted hook fails on every reference with an
error well above the calibrated tolerance (MIN_MARGIN: the tolerance does not
swallow the bug in either dtype), and every hook that was not touched still
passes, so a planted bug is caught where it was planted and nowhere else.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from overlays.base import Cols, Overlay, UnfoldNorm
from overlays.gemma import GemmaOverlay

pytestmark = pytest.mark.parity

# error / tolerance a planted bug must reach, per gate (harness.comparison.tolerances).
# fp32 tolerances are ~1e-4 and the bugs give rel >= 1: margins are >= 1e4.
# bf16 tolerances are calibrated from a ~1e-2 noise floor (x4): the smallest
# planted bug (ln1 left folded, rel ~1.7) still sits ~20x above.  fp32 with
# TF32 matmuls (CUDA, --precision tf32) is calibrated from the reference's own
# TF32 floor (x4); it runs only where the session's device is CUDA.
MIN_MARGIN = {"float32": 100.0, "float32-tf32": 10.0, "bfloat16": 5.0}


def _faults(cfg) -> dict:
    d = GemmaOverlay().dims(cfg)
    q, kv = d["n_heads"] * d["head_dim"], d["n_kv"] * d["head_dim"]
    return {
        # Gemma's final norm un-folded with ÷ w instead of ÷ (1 + w)
        "ln_final.hook_normalized": lambda s: s.with_convert(UnfoldNorm("model.norm.weight", 0.0)),
        # read before vLLM's sqrt(d_model) embedding normalizer (TL 4.3.0's own vLLM overlay bug)
        "embed.hook_out": lambda s: replace(s, module="model.embed_tokens", read="out"),
        # block output without the fused residual added back
        "blocks.1.hook_out": lambda s: replace(s, read="out[0]"),
        # block input without the residual (only the previous layer's MLP delta)
        "blocks.2.hook_in": lambda s: replace(s, read="in.hidden_states"),
        # k read from v's columns of the fused qkv projection
        "blocks.2.attn.hook_k": lambda s: s.with_convert(Cols(q + kv, q + 2 * kv), *s.convert[1:]),
        # ln1 left folded (norm weight not divided out)
        "blocks.0.ln1.hook_normalized": lambda s: s.with_convert(),
    }


class PlantedOverlay(Overlay):
    """Wraps an overlay and replaces some hook specs with planted bugs."""

    def __init__(self, base: Overlay, faults) -> None:
        self.base, self.faults, self.name = base, faults, f"planted({base.name})"

    def hook_specs(self, cfg):
        specs = self.base.hook_specs(cfg)
        for hook, plant in self.faults(cfg).items():
            specs[hook] = plant(specs[hook])
        return specs

    def nonfiring(self):
        return self.base.nonfiring()


@pytest.fixture(scope="module", params=sorted(MIN_MARGIN))
def planted_run(request, parity_session, tmp_path_factory):
    from harness.pipeline.runner import run_model
    from harness.values.variant import Variant

    dtype, _, precision = request.param.partition("-")
    if precision and parity_session.device != "cuda":
        pytest.skip(f"{request.param}: TF32 matmuls exist on CUDA only (session device {parity_session.device})")
    target = replace(parity_session.target("gemma"))
    target.overlay = PlantedOverlay(target.overlay, _faults)
    variant = Variant.make(dtype, parity_session.device, precision or "ieee")
    run = run_model(target, variant, work_root=tmp_path_factory.mktemp("planted"))
    assert run.result.error is None, run.result.error
    run.gate = request.param
    return run


def test_every_planted_bug_fails_with_margin(planted_run):
    planted = set(_faults(planted_run.target.hf_config))
    for row in planted_run.result.rows:
        if row.hook in planted and "~" not in row.reference:  # reference~reference rows never see vLLM
            assert row.status == "fail", f"planted bug in {row.hook} ({row.reference}) was not caught: {row}"
            need = MIN_MARGIN[planted_run.gate]
            assert row.rel_err >= need * row.tolerance, (
                f"{row.hook}: planted bug only {row.rel_err / row.tolerance:.1f}x the tolerance (need {need}x)")
            assert row.hook in row.message and "tolerance" in row.message
            assert "conversions:" in row.message  # the message shows the mapping that produced the value


def test_untouched_hooks_still_pass(planted_run):
    planted = set(_faults(planted_run.target.hf_config))
    wrong = [r.message for r in planted_run.result.rows
             if (r.hook not in planted or "~" in r.reference) and not r.passed]
    assert not wrong, wrong


def test_planted_margins_are_reported(planted_run):
    """The margin (error / tolerance) of each planted bug, for the report and the note."""
    planted = set(_faults(planted_run.target.hf_config))
    margins = {r.hook: r.rel_err / r.tolerance for r in planted_run.result.rows
               if r.hook in planted and r.reference == "bridge"}
    assert set(margins) == planted
    print(f"planted-bug margins in {planted_run.gate} on {planted_run.result.device} (rel_err / tolerance):",
          {h: f"{m:.3g}" for h, m in sorted(margins.items())})
