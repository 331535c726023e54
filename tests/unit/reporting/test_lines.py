"""harness.reporting.lines: the families x vLLM lines grid, on hand-made reports (no engine)."""
from __future__ import annotations

import json

import pytest

from harness.reporting import lines as L


def _row(hook, kind, status, reference="bridge", known=None):
    return {"hook": hook, "kind": kind, "status": status, "reference": reference, "known_issue": known}


def _report(verdict, passed, offered, rows=(), error=None, skipped=None):
    return {"summary": {"verdict": verdict, "hooks_passed": passed, "hooks_offered": offered},
            "rows": list(rows), "error": error, "skipped": skipped}


def test_parse_lines_sorts_by_version_and_refuses_bad_input():
    assert L.parse_lines("0.30.0, 0.27.1,0.32.0") == ["0.27.1", "0.30.0", "0.32.0"]
    assert L.parse_lines("0.9.0,0.10.1") == ["0.9.0", "0.10.1"]  # numerically, not as text
    for bad in ("", "0.30", "0.30.0,0.30.0", "latest"):
        with pytest.raises(ValueError):
            L.parse_lines(bad)


def test_cells():
    assert L.cell(_report("pass", 63, 63)) == "✅ 63/63"
    assert L.cell(_report("fail", 60, 63)) == "❌ 60/63"
    assert L.cell(_report("partial", 61, 63)) == "◐ 61/63"
    assert L.cell(None) == "—"
    err = _report("error", 0, 0, error="ValueError: Model architectures ['X'] are not supported\n  more")
    assert L.cell(err) == "⚠ error: ValueError: Model architectures ['X'] are not supported"
    assert L.cell(_report("skipped", 0, 0, skipped="vLLM refuses bf16 here")).startswith("⏭ skipped: vLLM refuses")
    wrapped = _report("error", 0, 0, error="SubjectError: NotImplementedError: \"causal_conv1d_fwd_kernel_impl\" not "
                      "implemented for 'Float' -- harness.engines.subject_vllm exited with 1 (log: /x):\ntail")
    assert L.cell(wrapped) == "⚠ error: NotImplementedError: \"causal_conv1d_fwd_kernel_impl\" not implemented for 'Float'"
    assert "\\|" in L.cell(_report("error", 0, 0, error="a | b"))  # a pipe would break the table


def test_kind_status_takes_the_worst_row_and_ignores_reference_only_rows():
    r = _report("fail", 1, 2, [_row("blocks.0.hook_out", "hook_out", "pass"),
                               _row("blocks.1.hook_out", "hook_out", "fail"),
                               _row("blocks.0.attn.hook_z", "attn.hook_z", "fail", known="declared"),
                               _row("blocks.0.hook_out", "hook_out", "error", reference="bridge~hf"),
                               _row("logits", "logits", "error", reference="hf")])
    assert L.kind_status(r) == {"hook_out": "fail", "attn.hook_z": "pass"}


def test_kind_changes_name_the_first_line_and_skip_errored_lines():
    ok = _report("pass", 1, 1, [_row("blocks.0.mlp.hook_out", "mlp.hook_out", "pass")])
    bad = _report("fail", 0, 1, [_row("blocks.0.mlp.hook_out", "mlp.hook_out", "fail")])
    crashed = _report("error", 0, 0, error="RuntimeError: boom")
    by_line = {"0.32.0": {"glm": bad}, "0.27.1": {"glm": ok}, "0.28.0": {"glm": crashed}, "0.30.0": {"glm": ok}}
    assert L.kind_changes(by_line) == [("glm", "mlp.hook_out", "pass", "fail", "0.32.0")]
    md = L.to_markdown(by_line, ["glm"])
    assert "| glm | ✅ 1/1 | ⚠ error: RuntimeError: boom | ✅ 1/1 | ❌ 0/1 |" in md
    assert "| glm | mlp.hook_out | pass | fail | 0.32.0 |" in md


def test_load_line_reads_each_models_report(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "report.json").write_text(json.dumps(_report("pass", 3, 3)))
    (tmp_path / "llama" / "report-cpu-bfloat16.json").write_text(json.dumps(_report("fail", 1, 3)))
    (tmp_path / "qwen3").mkdir()
    (tmp_path / "qwen3" / "report.json").write_text("{not json")
    assert list(L.load_line(tmp_path)) == ["llama"]
    assert L.load_line(tmp_path, "report-cpu-bfloat16")["llama"]["summary"]["verdict"] == "fail"
