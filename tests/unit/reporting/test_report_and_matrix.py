"""Reports and the support matrix are pure functions of result dicts."""
import json

from harness.reporting.matrix import build_matrix, write_matrix
from harness.comparison.verdict import summarize
from harness.reporting.markdown import to_markdown
from harness.reporting.report import write_report


def _result(model, status="pass", rel=1e-6, error=None, dtype="float32"):
    row = dict(model=model, reference="bridge", hook="blocks.0.hook_out", reference_hook="blocks.0.hook_out",
               layer=0, kind="hook_out", status=status, tolerance=1e-4, rel_err=rel, max_abs=rel, ref_scale=1.0,
               cos_min=1.0, worst={"prompt": 0, "index": [3, 1], "axes": ["pos", "d"]}, message="")
    return dict(model=model, architecture="LlamaForCausalLM", overlay="DecoderOnlyOverlay", source="synthetic",
                checkpoint="/x", dtype=dtype, seed=0, device="cpu", rows=[row],
                nonfiring=[{"template": "blocks.{i}.attn.hook_pattern", "hooks": ["blocks.0.attn.hook_pattern"],
                            "reason": "fused"}],
                timings={}, versions={"vllm": "0.32.0", "transformers": "5", "transformer-lens": "4.3.0"},
                prompts=[[1, 2, 3]], error=error, wall_s=1.0)


def test_summary_and_markdown():
    r = _result("m")
    s = summarize(r)
    assert s["verdict"] == "pass" and s["hooks_offered"] == 1 and s["nonfiring"] == 1
    md = to_markdown(r)
    assert "Verdict: PASS" in md and "blocks.{i}.attn.hook_pattern" in md and "fused" in md


def test_failed_and_errored_models_show_in_matrix(tmp_path):
    write_report(_result("a"), tmp_path)
    write_report(_result("b", status="fail", rel=0.3), tmp_path)
    write_report(_result("c", error="RuntimeError: boom\ntrace"), tmp_path)
    write_report(_result("a", dtype="bfloat16"), tmp_path)
    rows = {(r["model"], r["variant"]): r for r in build_matrix(tmp_path)}
    assert rows[("a", "cpu-float32")]["verdict"] == "pass"
    assert rows[("a", "cpu-bfloat16")]["verdict"] == "pass"
    assert rows[("b", "cpu-float32")]["verdict"] == "fail"
    assert rows[("c", "cpu-float32")]["verdict"] == "error" and "boom" in rows[("c", "cpu-float32")]["error"]
    md, _ = write_matrix(tmp_path)
    text = md.read_text()
    assert text.count("\n| ") == 1 + 4  # header + one row per (model, variant)
    assert json.loads((tmp_path / "support_matrix.json").read_text())


def test_depth_plot_is_written_beside_the_report(tmp_path):
    write_report(_result("a"), tmp_path)
    assert (tmp_path / "a" / "depth.png").stat().st_size > 1000
    assert "depth.png" in (tmp_path / "a" / "report.md").read_text()


def test_known_reference_bug_is_counted_apart(tmp_path):
    r = _result("k", status="fail", rel=float("inf"))
    r["rows"][0]["known_issue"] = "TL bug"
    s = summarize(r)
    # explained, but not compared: the hook is not gated, so the model is partial, never pass
    assert s["verdict"] == "partial" and s["known_issues"] == 1 and s["failed"] == 0
    assert s["ungated_hooks"] == ["blocks.0.hook_out"]
    write_report(r, tmp_path)
    md, _ = write_matrix(tmp_path)
    assert "known reference bug" in md.read_text()


def test_known_issue_lookup():
    from harness.comparison.known_issues import known_issue

    assert known_issue("OPTForCausalLM", "bridge", "blocks.2.attn.hook_attn_scores")
    assert known_issue("OPTForCausalLM", "hf", "blocks.2.attn.hook_attn_scores") is None
    assert known_issue("OPTForCausalLM", "bridge", "blocks.2.attn.hook_pattern") is None
    assert known_issue("LlamaForCausalLM", "bridge", "blocks.2.attn.hook_attn_scores") is None


def test_grid_has_a_family_per_row_and_a_variant_per_column(tmp_path):
    from harness.frontends.cli import update_readme
    from harness.reporting.matrix import to_grid

    write_report(_result("a"), tmp_path)
    write_report(_result("a", dtype="bfloat16"), tmp_path)
    write_report(_result("b", status="fail", rel=0.3), tmp_path)
    grid = to_grid(build_matrix(tmp_path), grouped=False)
    lines = grid.strip().splitlines()
    assert lines[0] == "| family | `cpu-bfloat16` | `cpu-float32` |"
    assert lines[2] == "| a | ✅ 1/1 | ✅ 1/1 |" and lines[3] == "| b | — | ❌ 0/1 |"
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- gpu-grid:start -->\nold\n<!-- gpu-grid:end -->\ny\n")
    update_readme(readme, grid, "gpu-grid")
    assert "old" not in readme.read_text() and "| a | ✅ 1/1 | ✅ 1/1 |" in readme.read_text()


def test_the_grid_groups_families_by_kind(tmp_path):
    from harness.reporting.matrix import kind_of, to_grid

    assert (kind_of("LlamaForCausalLM"), kind_of("MixtralForCausalLM"), kind_of("DeepseekV3ForCausalLM"),
            kind_of("Mamba2ForCausalLM"), kind_of("BertForMaskedLM")) == ("dense", "MoE", "MLA", "SSM / hybrid", "encoder")
    # trees with state-space, short-convolution or Gated DeltaNet layers between attention layers are hybrids
    assert {kind_of(a) for a in ("GraniteMoeHybridForCausalLM", "Lfm2ForCausalLM", "Qwen3NextForCausalLM")} == \
        {"SSM / hybrid"}
    assert kind_of("HunYuanDenseV1ForCausalLM", "GenericDecoderOverlay (5 hook kinds)") == "generic overlay"
    assert kind_of("HrmTextForCausalLM") == kind_of("Gemma3nForCausalLM") == "dense"  # overlays without a tree
    write_report(_result("a"), tmp_path)
    grid = to_grid(build_matrix(tmp_path))
    assert grid.startswith("**dense** (1)") and "| a | ✅ 1/1 |" in grid


def test_families_refused_in_every_variant_are_one_line_naming_them_and_the_variants():
    from harness.reporting.matrix import to_grid

    def row(model, variant, verdict):
        return dict(model=model, variant=variant, verdict=verdict, architecture="LlamaForCausalLM", overlay="",
                    hooks_passed=0, hooks_offered=0, hooks_gated=0, hooks_compared=0)
    grid = to_grid([row("a", "cpu-float32", "skipped"), row("a", "cpu-bfloat16", "skipped"),
                    row("b", "cpu-float32", "skipped"), row("c", "cpu-float32", "skipped"),
                    row("c", "cpu-bfloat16", "error")])
    assert "**refusals** (2; ⏭ in `cpu-bfloat16`, `cpu-float32`" in grid and grid.rstrip().endswith(": a, b")
    assert "| c |" in grid  # not every run refused: a row of its kind's table


def test_routing_flips_are_listed_in_the_report():
    r = _result("m")
    r["routing_flips"] = [{"prompt": 2, "layer": 1, "token": 12, "gap": 1e-4, "noise": 2e-4, "rel_err": 1e-3,
                           "tolerance": 5e-3, "explained": True}]
    md = to_markdown(r)
    assert "Expert-routing flips" in md and "| 2 | 1 | 12 |" in md


def _two_rows(status_a="pass", status_b="pass"):
    r = _result("m", status=status_a)
    b = dict(r["rows"][0], hook="blocks.1.hook_out", layer=1, status=status_b)
    r["rows"].append(b)
    return r


def test_verdicts_never_say_pass_for_what_was_not_compared():
    assert summarize(_two_rows())["verdict"] == "pass"
    s = summarize(_two_rows(status_b="inconclusive"))
    assert s["verdict"] == "partial" and s["hooks_gated"] == 1 and s["ungated_hooks"] == ["blocks.1.hook_out"]
    assert summarize(_two_rows("inconclusive", "inconclusive"))["verdict"] == "partial"
    assert summarize(_two_rows(status_b="error"))["verdict"] == "error"
    assert summarize(_two_rows("fail", "error"))["verdict"] == "fail"
    empty = _result("m")
    empty["rows"] = []
    assert summarize(empty)["verdict"] == "error"  # an overlay with no hooks compares nothing


def test_a_selective_run_never_replaces_the_full_report_and_stays_out_of_the_matrix(tmp_path):
    full = _result("m")
    sel = _result("m", status="fail", rel=0.3)
    sel["selected_hooks"] = ["blocks.0.hook_out"]
    assert write_report(full, tmp_path).name == "report.json"
    assert write_report(sel, tmp_path).name == "report-selection.json"
    rows = build_matrix(tmp_path)
    assert [(r["model"], r["verdict"]) for r in rows] == [("m", "pass")]
    md, _ = write_matrix(tmp_path)
    assert "m/report-selection.json" in md.read_text() and "left out" in md.read_text()


def test_partial_shows_gated_counts_in_the_matrix(tmp_path):
    write_report(_two_rows(status_b="inconclusive"), tmp_path)
    md, rows = write_matrix(tmp_path)
    assert rows[0]["verdict"] == "partial" and "🟡 partial" in md.read_text() and "| 1 / 2 |" in md.read_text()


def test_reports_are_written_atomically(tmp_path, monkeypatch):
    """A write that dies midway leaves the previous report whole (temporary file, then rename)."""
    import harness.reporting.report as report

    path = write_report(_result("m"), tmp_path)
    before = path.read_text()

    def boom(*a, **k):
        raise KeyboardInterrupt("killed midway")

    monkeypatch.setattr(report.json, "dumps", boom)
    import pytest

    with pytest.raises(KeyboardInterrupt):
        write_report(_result("m", status="fail", rel=0.5), tmp_path)
    assert path.read_text() == before and json.loads(before)["rows"][0]["status"] == "pass"


def test_the_peer_grid_has_a_column_per_peer_on_its_own_line(tmp_path):
    from harness.reporting.matrix import to_peer_grid

    def with_subject(result, subject, vllm):
        return {**result, "subject": subject, "versions": {**result["versions"], "vllm": vllm}}
    write_report(_result("a"), tmp_path)  # the default subject: never a peer's cell
    write_report(with_subject(_result("a"), "vllm-lens", "0.30.0"), tmp_path)
    write_report(with_subject(_result("a", status="fail", rel=0.3), "tl-vllm", "0.32.0"), tmp_path)
    write_report(with_subject({**_result("a"), "rows": [], "skipped": "--subject nnsight not run: nnsight 0.8.1 runs "
                               "its vLLM integration in its own worker"}, "nnsight", "0.30.0"), tmp_path)
    write_report(with_subject({**_result("b", error="SubjectError: vllm_lens._worker_ext.LayerDiscoveryError: Could "
                                        "not resolve decoder layer '0'. -- harness.engines.subject_vllm_lens exited"),
                               "rows": []}, "vllm-lens", "0.30.0"), tmp_path)
    rows = build_matrix(tmp_path)
    assert {r["subject"] for r in rows} == {"vllm", "vllm-lens", "tl-vllm", "nnsight"}
    peers = ["tl-vllm", "vllm-lens", "nnsight"]  # the command line's: tl-vllm and the registry's PEERS
    lines = to_peer_grid(rows, peers).strip().splitlines()
    assert lines[0] == "| family | `tl-vllm` | `vllm-lens` | `nnsight` |"
    assert lines[2] == ("| a | ❌ 0/1 on 0.32.0 | ✅ 1/1 on 0.30.0 | ⏭ refused on 0.30.0: nnsight 0.8.1 runs its vLLM "
                        "integration in its own worker |")
    assert lines[3] == "| b | — | 💥 0/0 on 0.30.0: LayerDiscoveryError: Could not resolve decoder layer '0'. | — |"
    assert len(lines) == 4 and to_peer_grid(rows, ["vllm-lens"]).splitlines()[0] == "| family | `vllm-lens` |"
    assert to_peer_grid(rows, peers, compact=True).strip().splitlines() == [
        "| peer | vLLM | a | b |", "|---|---|---|---|", "| `tl-vllm` | 0.32.0 | ❌ 0/1 | — |",
        "| `vllm-lens` | 0.30.0 | ✅ 1/1 | 💥 |", "| `nnsight` | 0.30.0 | ⏭ | — |"]


def test_error_words_are_the_innermost_exception():
    from harness.reporting.matrix import error_words

    assert error_words("SubjectError: a.b.XError: it broke. -- harness exited 1\nmore") == "XError: it broke."
    assert error_words("no exception named") == "no exception named" and error_words("") == ""
