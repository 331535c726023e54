"""Mamba-2's gated-norm reference bug (transformers 5.19's MambaRMSNormGated normalizes the whole width,
ignoring n_groups): the reference-side correction (harness.references.reference.group_wise_gated_norm) and
the signature that explains the norm's own row (harness.comparison.known_issues.GATED_NORM_BUGS), engine-free.
"""
from __future__ import annotations

import pytest
import torch

from harness.comparison.known_issues import (GATED_NORM_BUGS, explain_gated_norm, gated_norm_bug,
                                             gated_norm_signature, layout_config)
from harness.references.reference import (GROUP_WISE_GATED_NORM, _hf_run, group_wise_gated_norm,
                                          group_wise_gated_norm_)
from harness.values.results import HookResult

ARCH, HOOK, EPS = "Mamba2ForCausalLM", "blocks.1.mixer.inner_norm.hook_out", 1e-5
TWO = {"n_groups": 2, "layer_norm_epsilon": EPS}


def _tiny(n_groups: int):
    from transformers import AutoConfig, Mamba2ForCausalLM

    cfg = AutoConfig.for_model("mamba2", hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32, expand=2,
                               n_groups=n_groups, state_size=16, conv_kernel=4, chunk_size=8, vocab_size=64,
                               use_bias=True, layer_norm_epsilon=EPS)
    torch.manual_seed(0)
    model = Mamba2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # every parameter random: the norm weight too
            p.copy_(torch.randn_like(p) * 0.5)
    return model


def _norm_io(width=64, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, gate, w = (torch.randn(t, width, generator=g), torch.randn(t, width, generator=g),
                  torch.randn(width, generator=g))
    x[:, : width // 2] *= torch.rand(t, 1, generator=g) * 4  # the groups' scales differ token by token
    return x, gate, w


def test_the_correction_is_hfs_own_group_wise_norm():
    from transformers.models.mamba2.modeling_mamba2 import MambaRMSNormGated
    from transformers.models.zamba2.modeling_zamba2 import Zamba2RMSNormGated

    x, gate, w = _norm_io()
    for groups in (2, 4):
        hf = Zamba2RMSNormGated(64, group_size=64 // groups, eps=EPS)  # what HF's NemotronH uses
        hf.weight.data.copy_(w)
        assert torch.equal(group_wise_gated_norm_(x, gate, w, EPS, groups), hf(x, gate))
    whole = MambaRMSNormGated(64, eps=EPS)
    whole.weight.data.copy_(w)
    assert torch.allclose(group_wise_gated_norm_(x, gate, w, EPS, 1), whole(x, gate), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(group_wise_gated_norm_(x, gate, w, EPS, 2), whole(x, gate), rtol=1e-2)


def test_downstream_of_the_norm_the_reference_runs_group_wise_and_the_norm_row_keeps_hfs_value():
    model = _tiny(2)
    tokens = [1, 5, 9, 3, 7, 2, 11, 4, 8, 6]
    before, _ = _hf_run(model, tokens, "cpu", 2)
    assert group_wise_gated_norm(model) == GROUP_WISE_GATED_NORM
    assert group_wise_gated_norm(model) == GROUP_WISE_GATED_NORM  # idempotent: no second set of hooks
    after, _ = _hf_run(model, tokens, "cpu", 2)
    mixer = model.backbone.layers[0].mixer
    b = "blocks.0.mixer"
    # upstream of the norm and the norm's own output (HF's whole-width value): unchanged
    for name in (f"{b}.in_proj.hook_out", f"{b}.inner_norm.hook_in", f"{b}.inner_norm.hook_gate",
                 f"{b}.inner_norm.hook_out"):
        assert torch.equal(before[name], after[name]), name
    # the mixer's output: out_proj of the group-wise norm of the norm's own inputs
    fixed = group_wise_gated_norm_(after[f"{b}.inner_norm.hook_in"], after[f"{b}.inner_norm.hook_gate"],
                                   mixer.norm.weight, EPS, 2)
    assert torch.allclose(after[f"{b}.hook_out"], mixer.out_proj(fixed), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(before[f"{b}.hook_out"], after[f"{b}.hook_out"], rtol=1e-2)
    assert not torch.allclose(before["blocks.1.hook_out"], after["blocks.1.hook_out"], rtol=1e-2)


def test_one_group_is_not_corrected():
    model = _tiny(1)
    tokens = [1, 5, 9, 3, 7]
    before, _ = _hf_run(model, tokens, "cpu", 2)
    assert group_wise_gated_norm(model) is None
    after, _ = _hf_run(model, tokens, "cpu", 2)
    assert all(torch.equal(before[k], after[k]) for k in before)


def _captures(reference_groups: int, subject_groups: int = 2, prompts=2):
    """(input, gate, output) per prompt for a reference and a subject normalizing over those group counts."""
    ref, subj = ([], [], []), ([], [], [])
    for p in range(prompts):
        x, gate, w = _norm_io(seed=p)
        w = _norm_io(seed=99)[2]  # one weight for every prompt, as a model's
        for side, groups in ((ref, reference_groups), (subj, subject_groups)):
            y = group_wise_gated_norm_(x, gate, w, EPS, groups)
            for store, value in zip(side, (x, gate, y)):
                store.append(value)
    return subj, ref


def _row(status="fail"):
    return HookResult("mamba2_groups", "hf", HOOK, HOOK, 1, "mixer.inner_norm.hook_out", status, 1e-4,
                      message=f"{HOOK} vs hf: rel_err 1.2e+00 > tolerance 1.0e-04")


def test_the_signature_holds_for_hfs_whole_width_norm_against_vllms_per_group_one():
    subject, reference = _captures(reference_groups=1)
    sig = gated_norm_signature(subject, reference, 2, EPS)
    assert sig.holds and sig.reference_whole < 1e-5 and sig.subject_grouped < 1e-5
    assert sig.reference_grouped > 0.05 and sig.subject_whole > 0.05
    row = _row()
    explain_gated_norm(GATED_NORM_BUGS[0], row, sig)
    assert row.status == "fail" and "MambaRMSNormGated" in row.known_issue and "signature holds" in row.known_issue
    assert "reference corrected: group-wise gated norm" in row.known_issue


def test_the_signature_holds_in_bf16():
    subject, reference = _captures(reference_groups=1)
    bf = tuple([t.bfloat16() for t in side] for side in subject), tuple([t.bfloat16() for t in side]
                                                                         for side in reference)
    assert gated_norm_signature(*bf, 2, EPS).holds


def test_a_fixed_transformers_makes_the_entry_stale():
    subject, reference = _captures(reference_groups=2)  # HF now normalizes per group, as vLLM
    sig = gated_norm_signature(subject, reference, 2, EPS)
    assert not sig.reference_is_whole
    for status in ("pass", "fail"):
        row = _row(status)
        explain_gated_norm(GATED_NORM_BUGS[0], row, sig)
        assert row.status == "error" and "retire" in row.message and "GATED_NORM_BUGS" in row.message
        assert not row.known_issue


def test_a_vllm_that_does_not_normalize_per_group_is_not_explained():
    subject, reference = _captures(reference_groups=1, subject_groups=4)
    sig = gated_norm_signature(subject, reference, 2, EPS)
    assert sig.reference_is_whole and not sig.subject_is_grouped and not sig.holds
    row = _row()
    explain_gated_norm(GATED_NORM_BUGS[0], row, sig)
    assert row.status == "fail" and not row.known_issue and "signature does not hold" in row.message


def test_an_error_row_is_never_explained():
    row = _row("error")
    explain_gated_norm(GATED_NORM_BUGS[0], row, gated_norm_signature(*_captures(1), 2, EPS))
    assert row.status == "error" and not row.known_issue


@pytest.mark.parametrize("config, covered", [(TWO, True), ({"n_groups": 1}, False), ({}, False), (None, False)])
def test_the_bug_covers_the_norm_output_of_models_with_several_groups(config, covered):
    assert (gated_norm_bug(ARCH, "hf", HOOK, config) is not None) is covered
    for reference in ("bridge", "bridge-ragged"):
        assert (gated_norm_bug(ARCH, reference, HOOK, config) is not None) is covered
    assert gated_norm_bug(ARCH, "bridge~hf", HOOK, TWO) is None  # the references agree with each other
    assert gated_norm_bug(ARCH, "hf", HOOK.replace("hook_out", "hook_in"), TWO) is None
    assert gated_norm_bug("NemotronHForCausalLM", "hf", HOOK, TWO) is None  # HF's NemotronH groups correctly


def test_the_reference_side_records_the_group_count_and_eps():
    from transformers import AutoConfig

    assert layout_config(AutoConfig.for_model("mamba2", n_groups=8, layer_norm_epsilon=EPS)) == {
        "layer_norm_epsilon": EPS, "n_groups": 8}


def test_the_report_names_the_correction():
    from harness.reporting.markdown import to_markdown
    from harness.values.results import ModelResult

    assert ModelResult("m", ARCH, "Mamba2Overlay", "synthetic", "/x", "float32", 0).reference_corrected is None
    row = dict(model="m", reference="hf", hook=HOOK, reference_hook=HOOK, layer=1, kind="mixer.inner_norm.hook_out",
               status="fail", tolerance=1e-4, rel_err=1.2, max_abs=1.0, ref_scale=1.0, cos_min=0.6, worst={},
               message="m", known_issue=GATED_NORM_BUGS[0].reason)
    result = dict(model="m", architecture=ARCH, overlay="Mamba2Overlay", source="synthetic", checkpoint="/x",
                  dtype="float32", seed=0, device="cpu", rows=[row], nonfiring=[], timings={}, versions={},
                  prompts=[[1, 2, 3]], error=None, wall_s=1.0)
    assert "| reference corrected |" not in to_markdown(result)
    md = to_markdown({**result, "reference_corrected": GROUP_WISE_GATED_NORM})
    assert "| reference corrected | group-wise gated norm:" in md and "**known reference bug**" in md
