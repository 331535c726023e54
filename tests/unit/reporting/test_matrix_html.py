"""The HTML support matrix: structure from synthetic reports, and a real render in headless Chromium.

The reports are synthetic dicts written with the real :func:`write_report`, and
the page comes from the real :func:`write_matrix`, so this also checks that md,
json and html are always written together.  The Chromium test skips, naming the
binary, where Debian's ``chromium`` is not installed.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.reporting.matrix import write_matrix
from harness.comparison.gate import margin
from harness.reporting.matrix_html import COLOURS, cell, hook_kind, kind_columns, margin_colour, to_html  # noqa: F401
from harness.reporting.report import write_report

TOL = 1e-4


def _row(model, ref, hook, rel, status="pass", tol=TOL, kind=None, message=""):
    layer = int(hook.split(".")[1]) if hook.startswith("blocks.") else None
    return {"model": model, "reference": ref, "hook": hook, "reference_hook": hook, "layer": layer,
            "kind": kind or hook_kind(hook), "status": status, "tolerance": tol, "rel_err": rel,
            "max_abs": rel, "ref_scale": 1.0, "cos_min": 1.0, "worst": {}, "message": message,
            "margin": margin(rel, tol)}  # as the gate stores it (worst row only: no median measured here)


def _result(model, rows, nonfiring=(), error=None, device="cpu", dtype="float32"):
    return {"model": model, "architecture": f"{model.title()}ForCausalLM", "overlay": "DecoderOnlyOverlay",
            "source": "synthetic", "checkpoint": f"/nowhere/{model}", "dtype": dtype, "device": device, "seed": 0,
            "rows": rows, "nonfiring": list(nonfiring), "timings": {}, "prompts": [[1, 2, 3]], "error": error,
            "wall_s": 1.0, "versions": {"vllm": "0.32.0", "transformers": "5.19.0", "transformer-lens": "4.3.0"}}


PATTERN = {"template": "blocks.{i}.attn.hook_pattern", "hooks": ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"],
           "reason": "fused attention kernel: the pattern never exists"}


def _alpha_rows(model="alpha"):
    rows = [_row(model, ref, "embed.hook_out", 0.0) for ref in ("bridge", "compat")]
    for i in range(2):
        for ref in ("bridge", "compat"):
            rows += [_row(model, ref, f"blocks.{i}.attn.hook_q", 1e-7 * (i + 1)),
                     _row(model, ref, f"blocks.{i}.hook_out", 2e-6 if (i, ref) == (1, "compat") else 1e-6)]
    rows += [_row(model, "bridge", "ln_final.hook_normalized", 3e-7),
             _row(model, "hf", "logprobs", 4e-7),
             _row(model, "hf", "argmax", 0.0, tol=0.0, kind="argmax") | {"worst": {"agree_positions": 9, "positions": 9}}]
    return rows


@pytest.fixture()
def report_dir(tmp_path: Path) -> Path:
    beta = [_row("beta", "bridge", "embed.hook_out", 1e-7),
            _row("beta", "bridge", "blocks.0.attn.hook_q", 2e-6),
            _row("beta", "bridge", "blocks.0.attn.hook_custom", 1e-6),  # a kind no canonical list knows
            _row("beta", "bridge", "blocks.0.hook_out", 2e-6),
            _row("beta", "compat", "blocks.1.hook_out", 0.5, status="fail", message="missing residual"),
            _row("beta", "bridge", "blocks.1.hook_out", 3e-6)]
    write_report(_result("alpha", _alpha_rows(), [PATTERN]), tmp_path)
    write_report(_result("alpha", _alpha_rows(), [PATTERN], device="cuda", dtype="bfloat16"), tmp_path)
    write_report(_result("beta", beta), tmp_path)
    write_report(_result("gamma", [], error="RuntimeError: engine died\ntraceback..."), tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "report.json").write_text("{not json")
    return tmp_path


class _Table(HTMLParser):
    """Collects #matrix: header kinds and, per tbody row, its attrs and cells."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[str] = []
        self.rows: list[dict] = []
        self.tags: list[str] = []
        self._section = None
        self._cell: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag in ("thead", "tbody"):
            self._section = tag
        elif tag == "th" and self._section == "thead" and "kind" in (a.get("class") or ""):
            self.kinds.append(a["title"])
        elif tag == "tr" and self._section == "tbody":
            self.rows.append({"attrs": a, "cells": []})
        elif tag in ("td", "th") and self._section == "tbody":
            self._cell = {"attrs": a, "text": ""}
            self.rows[-1]["cells"].append(self._cell)

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._cell = None
        elif tag in ("thead", "tbody"):
            self._section = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data


def _parse(page: str) -> _Table:
    t = _Table()
    t.feed(page)
    return t


def _kind_cell(table: _Table, family: str, kind: str, variant: str = "cpu-float32") -> dict:
    row = next(r for r in table.rows if r["attrs"]["data-family"] == family and r["attrs"]["data-variant"] == variant)
    return next(c for c in row["cells"] if c["attrs"].get("data-kind") == kind)


def test_written_with_md_and_json(report_dir: Path) -> None:
    _, rows = write_matrix(report_dir)
    for name in ("support_matrix.md", "support_matrix.json", "support_matrix.html"):
        assert (report_dir / name).is_file(), name
    assert len(json.loads((report_dir / "support_matrix.json").read_text())) == len(rows) == 5


def test_structure(report_dir: Path) -> None:
    _, rows = write_matrix(report_dir)
    page = (report_dir / "support_matrix.html").read_text()
    t = _parse(page)

    # self-contained: no script, no external resource
    assert not re.search(r"<script|<link|\bsrc=|https?://|@import|url\(", page), "page must be self-contained"
    # one row per model x variant, in matrix order
    assert [(r["attrs"]["data-family"], r["attrs"]["data-variant"]) for r in t.rows] == \
        [(r["model"], r.get("variant") or "—") for r in rows]
    assert [r["attrs"]["data-family"] for r in t.rows] == ["alpha", "alpha", "beta", "broken", "gamma"]
    # columns: canonical forward order, the non-firing template reduced to its kind,
    # the unknown kind slotted after its predecessor in the report that has it
    assert t.kinds == ["embed.hook_out", "attn.hook_q", "attn.hook_custom", "attn.hook_pattern", "hook_out",
                       "ln_final.hook_normalized", "logprobs", "argmax"]

    hook_out = _kind_cell(t, "alpha", "hook_out")
    assert hook_out["attrs"]["data-state"] == "pass"
    title = hook_out["attrs"]["title"]
    assert "2.000e-06" in title and "layer 1" in title and "vs compat" in title
    assert "tolerance 1e-04" in title and "margin (the gate's) = 0.02" in title
    assert hook_out["text"] == "2e-6"

    fail = _kind_cell(t, "beta", "hook_out")
    assert fail["attrs"]["data-state"] == "fail" and COLOURS["fail"] in fail["attrs"]["style"]
    assert "5.000e-01 at layer 1" in fail["attrs"]["title"] and "missing residual" in fail["attrs"]["title"]
    assert "margin (the gate's) = 5e+03" in fail["attrs"]["title"]

    nf = _kind_cell(t, "alpha", "attn.hook_pattern")
    assert nf["attrs"]["data-state"] == "nonfiring" and "fused attention kernel" in nf["attrs"]["title"]
    assert _kind_cell(t, "beta", "logprobs")["attrs"]["data-state"] == "absent"
    assert "9/9" in _kind_cell(t, "alpha", "argmax")["attrs"]["title"]
    assert _kind_cell(t, "alpha", "attn.hook_q", "cuda-bfloat16")["attrs"]["data-state"] == "pass"

    gamma = next(r for r in t.rows if r["attrs"]["data-family"] == "gamma")
    assert gamma["attrs"]["class"] == "v-error"
    assert any("engine died" in c["text"] for c in gamma["cells"])
    broken = next(r for r in t.rows if r["attrs"]["data-family"] == "broken")
    assert broken["attrs"]["class"] == "v-error" and any("unreadable" in c["attrs"].get("title", "") for c in broken["cells"])

    # the summary columns
    beta_text = " ".join(c["text"] for c in next(r for r in t.rows if r["attrs"]["data-family"] == "beta")["cells"])
    for want in ("BetaForCausalLM", "DecoderOnlyOverlay", "0.32.0", "5.19.0", "4.3.0", "float32",
                 "4 / 5 / 0", "5.0e-01 (blocks.1.hook_out vs compat)", "fail"):
        assert want in beta_text, want


def test_cell_and_colour_rules() -> None:
    assert margin(0.0, 0.0) == 0 and margin(1.0, 0.0) == math.inf and margin(1e-6, 1e-4) == pytest.approx(1e-2)
    # NaN counts as the worst, never as a pass
    nan = cell("hook_out", [_row("m", "bridge", "blocks.0.hook_out", math.nan, status="fail")], None)
    assert nan["state"] == "fail" and "inf" in nan["title"]
    err = cell("hook_out", [_row("m", "bridge", "blocks.0.hook_out", math.nan, status="error", message="boom")], None)
    assert err["state"] == "error" and err["colour"] == COLOURS["error"] and "boom" in err["title"]
    # the scale runs green -> amber -> red and clamps at both ends
    greens = [int(margin_colour(10.0 ** e)[3:5], 16) - int(margin_colour(10.0 ** e)[1:3], 16) for e in (-3, -2, -1, 0)]
    assert greens == sorted(greens, reverse=True)
    assert margin_colour(0.0) == margin_colour(1e-9) and margin_colour(1.0) == margin_colour(1e9)
    assert kind_columns([]) == [] and "<tbody></tbody>" in to_html([], {}).replace("\n", "")


BROWSERS = ("chromium", "chromium-browser", "google-chrome")  # Debian's name first; the others take the same flags
CHROMIUM = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)

# Injected into a copy of the page: what the browser made of it, written into the DOM before --dump-dom.
PROBE = """<script>
const rows = [...document.querySelectorAll('#matrix > tbody > tr')];
const fail = document.querySelector('#matrix td[data-state="fail"]');
const t = document.getElementById('matrix').getBoundingClientRect();
const pre = document.createElement('pre'); pre.id = 'probe';
pre.textContent = JSON.stringify({
  rows: rows.length, families: rows.map(r => r.dataset.family),
  width: t.width, height: t.height,
  failBg: fail && getComputedStyle(fail).backgroundColor,
  unstyled: [...document.querySelectorAll('#matrix td.cell')]
    .filter(c => getComputedStyle(c).backgroundColor === 'rgba(0, 0, 0, 0)').length,
});
document.body.appendChild(pre);
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium binary not found on PATH (nor chromium-browser, google-chrome); "
                                             "Debian: apt-get install -y chromium")
def test_renders_in_headless_chromium(report_dir: Path, tmp_path: Path) -> None:
    _, rows = write_matrix(report_dir)
    page = (report_dir / "support_matrix.html").read_text()
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1600,900",
           "--dump-dom", probe_page.as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert m, f"probe missing from the dumped DOM: {out.stdout[-1000:]} {out.stderr[-1000:]}"
    probe = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert probe["rows"] == len(rows) == 5
    assert probe["families"] == [r["model"] for r in rows]
    assert probe["width"] > 300 and probe["height"] > 50
    assert probe["failBg"] == "rgb(165, 0, 38)"  # COLOURS["fail"] applied by the browser
    assert probe["unstyled"] == 0
    # and the dumped DOM (Chromium's parse of the page) has exactly one row per family too
    assert len(_parse(out.stdout).rows) == 5
