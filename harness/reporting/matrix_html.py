"""The support matrix as a self-contained HTML heatmap.

Contract: :func:`to_html(rows, reports)` is pure: ``rows`` are
:func:`harness.reporting.matrix.build_matrix` rows (one per model x variant), ``reports``
maps each row's ``report`` path to that report's JSON dict.  It returns one
HTML page -- inline CSS, no script, no external resource -- with exactly one
``<tbody>`` row per matrix row.  :func:`write_html` loads the reports and
writes ``support_matrix.html`` beside ``support_matrix.md``/``.json``.

Columns are hook *kinds* (the layer-free template: ``hook_out``,
``attn.hook_q``, ``ln_final.hook_normalized``, ``logprobs``, ``argmax``).  A
cell aggregates every report row of that kind, over all layers and all
references; its colour is the verdict and the largest *margin* its rows hold
(the gate's, ``HookResult.margin``: error / tolerance on the statistics that
gate the row, never recomputed here) on a log scale (margin <= 1e-4 deep green, 1e-3 green, 1e-2 light
green, 1e-1 amber, >= 1 red-orange; any failing row: dark red; any errored
row: black; a hook the overlay declares non-firing: grey; a kind the family
simply lacks: blank).
Every cell's ``title`` tooltip carries the numbers behind the colour.

Traps:
- A tolerance of 0 (``argmax``: top-1 must agree everywhere) makes the margin
  0 when the error is 0 and infinite otherwise; never divide by it.
- ``margin`` may be NaN or missing on an errored row (or a report written before
  the gate stored it); NaN compares false, so the worst row is chosen with NaN as +inf.
- Non-firing entries name templates (``blocks.{i}.attn.hook_pattern``), rows
  name hooks; both reduce to the kind with :func:`harness.vocab.hooks.hook_kind`.
- Reports are written concurrently by other runs: a report that cannot be
  read at render time becomes an error row, never an exception.
- The colour is the margin, not the raw error, so a later dtype with a
  looser tolerance reads on the same scale.
"""
from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.vocab.hooks import hook_kind

# Forward order of the canonical kinds (docs/DESIGN.md section 4); kinds not listed
# are slotted in after their predecessor in the first report that has them.
CANONICAL_KINDS: tuple[str, ...] = (
    "embed.hook_out", "pos_embed.hook_out", "hook_in", "ln1.hook_normalized",
    "attn.hook_in", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_rot_q", "attn.hook_rot_k",
    "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "attn.hook_out",
    "hook_resid_mid", "ln2.hook_normalized",
    "mlp.hook_in", "mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post", "mlp.hook_out",
    "hook_out", "ln_final.hook_normalized", "unembed.hook_out", "logprobs", "argmax",
)

# Margin colour scale (ColorBrewer RdYlGn stops): (log10(err / tol), colour),
# interpolated in RGB between stops and clamped at both ends.  fp32 noise sits
# around 1e-2; 1 is the tolerance itself.
MARGIN_STOPS: tuple[tuple[float, str], ...] = (
    (-4.0, "#006837"), (-3.0, "#1a9850"), (-2.0, "#91cf60"), (-1.0, "#fdae61"), (0.0, "#e34a33"),
)
COLOURS = {"fail": "#a50026", "error": "#111111", "nonfiring": "#bdbdbd", "absent": "#ffffff",
           "inconclusive": "#fdd835"}


# ----------------------------------------------------------------- cells

def _num(x: Any) -> float:
    """rel_err as a float, NaN/missing as +inf (so the worst row wins)."""
    return float(x) if isinstance(x, (int, float)) and not math.isnan(x) else math.inf


def margin_colour(m: float) -> str:
    """Hex colour for margin ``m`` on MARGIN_STOPS (log scale)."""
    x = math.log10(m) if m > 0 else -math.inf
    lo, hi = MARGIN_STOPS[0], MARGIN_STOPS[-1]
    if x <= lo[0]:
        return lo[1]
    if x >= hi[0]:
        return hi[1]
    for (x0, c0), (x1, c1) in zip(MARGIN_STOPS, MARGIN_STOPS[1:]):
        if x0 <= x <= x1:
            t = (x - x0) / (x1 - x0)
            rgb = [round(int(c0[i:i + 2], 16) * (1 - t) + int(c1[i:i + 2], 16) * t) for i in (1, 3, 5)]
            return "#" + "".join(f"{v:02x}" for v in rgb)
    raise AssertionError("unreachable")


def _short(x: float) -> str:
    if math.isinf(x):
        return "inf"
    if x == 0:
        return "0"
    mant, exp = f"{x:.0e}".split("e")
    return f"{mant}e{int(exp)}"


def _where(row: dict) -> str:
    return row["hook"] if row.get("layer") is None else f"layer {row['layer']} ({row['hook']})"


def cell(kind: str, rows: list[dict], nonfiring_reason: str | None) -> dict:
    """One heatmap cell: {state, colour, text, title} for the rows of one kind."""
    if not rows:
        if nonfiring_reason is not None:
            return {"state": "nonfiring", "colour": COLOURS["nonfiring"], "text": "n/f",
                    "title": f"{kind}: non-firing in vLLM\n{nonfiring_reason}"}
        return {"state": "absent", "colour": COLOURS["absent"], "text": "",
                "title": f"{kind}: not offered for this family"}
    errors = [r for r in rows if r.get("status") == "error"]
    if errors:
        msg = "\n".join(f"{r.get('reference')} {_where(r)}: {(r.get('message') or '').strip()[:300]}" for r in errors[:3])
        return {"state": "error", "colour": COLOURS["error"], "text": "err",
                "title": f"{kind}: {len(errors)} of {len(rows)} rows errored\n{msg}"}
    worst = max(rows, key=lambda r: _num(r.get("margin")))  # the gate's margin, stored in the row
    err, tol = _num(worst.get("rel_err")), float(worst.get("tolerance") or 0)
    m = _num(worst.get("margin"))
    failed = [r for r in rows if r.get("status") == "fail" and not r.get("known_issue")]
    not_compared = [r for r in rows if r.get("status") == "inconclusive" or r.get("known_issue")]
    # a kind with an inconclusive row is not a pass: yellow, with the count, never green
    state = "fail" if failed else ("inconclusive" if not_compared else "pass")
    layers = sorted({r["layer"] for r in rows if r.get("layer") is not None})
    refs = sorted({r.get("reference", "?") for r in rows})
    lines = [
        f"{kind}: {state.upper()} ({sum(r.get('status') == 'pass' for r in rows)}/{len(rows)} rows pass"
        + (f", {len(not_compared)} not compared (inconclusive or a known reference bug)" if not_compared else "")
        + "; "
        f"{'layers ' + ','.join(map(str, layers)) if layers else 'no layer'}; vs {', '.join(refs)})",
        f"worst rel err {err:.3e} at {_where(worst)} vs {worst.get('reference')}",
        f"tolerance {tol:.0e}; margin (the gate's) = {m:.3g}",
    ]
    agree = (worst.get("worst") or {})
    if "agree_positions" in agree:
        lines.append(f"top-1 agreement {agree['agree_positions']}/{agree.get('positions')} positions")
    for ref in refs if len(refs) > 1 else ():
        rr = max((r for r in rows if r.get("reference") == ref), key=lambda r: _num(r.get("rel_err")))
        lines.append(f"  {ref}: worst {_num(rr.get('rel_err')):.2e} at {_where(rr)}")
    if failed:
        lines += [f"FAIL {r.get('reference')} {_where(r)}: {(r.get('message') or '').strip()[:300]}" for r in failed[:3]]
    colour = COLOURS["fail"] if failed else (COLOURS["inconclusive"] if not_compared else margin_colour(m))
    text = ("✗" if failed else "?" if not_compared else "") + _short(err)
    return {"state": state, "colour": colour, "text": text, "title": "\n".join(lines), "margin": m}


# ----------------------------------------------------------------- columns

def _report_kinds(report: dict) -> list[str]:
    kinds = [r["kind"] for r in report.get("rows", [])]
    kinds += [hook_kind(n["template"]) for n in report.get("nonfiring", [])]
    return list(dict.fromkeys(kinds))


def _nonfiring_by_kind(report: dict) -> dict[str, str]:
    return {hook_kind(n["template"]): n.get("reason", "") for n in report.get("nonfiring", [])}


def kind_columns(reports: list[dict]) -> list[str]:
    """Canonical kinds present in any report, in forward order, unknown ones merged in."""
    present = {k for r in reports for k in _report_kinds(r)}
    order = [k for k in CANONICAL_KINDS if k in present]
    for rep in reports:
        prev = None
        for k in _report_kinds(rep):
            if k not in order:
                order.insert(order.index(prev) + 1 if prev in order else len(order), k)
            prev = k
    return order


# ----------------------------------------------------------------- page

_CSS = """
body{font:13px/1.35 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#222}
h1{font-size:18px;margin:0 0 4px}
p.note{margin:0 0 12px;color:#555}
table#matrix{border-collapse:collapse}
#matrix th,#matrix td{border:1px solid #ddd;padding:2px 5px;white-space:nowrap}
#matrix thead th{position:sticky;top:0;background:#fafafa;vertical-align:bottom}
#matrix tbody th{position:sticky;left:0;background:#fff;text-align:left}
#matrix th.kind{padding:4px 1px}
#matrix th.kind span{writing-mode:vertical-rl;transform:rotate(180deg);font-weight:500;font-family:ui-monospace,monospace}
#matrix td.cell{min-width:34px;text-align:center;font:11px ui-monospace,monospace;cursor:help}
#matrix td.light{color:#111}#matrix td.dark{color:#fff}
#matrix td.absent{background:#fff}
#matrix td.wide{background:#111;color:#fff;white-space:normal;font:11px ui-monospace,monospace}
#matrix tr.v-pass td.verdict{color:#1b5e20;font-weight:600}
#matrix tr.v-fail td.verdict{color:#c62828;font-weight:600}
#matrix tr.v-partial td.verdict{color:#8d6e00;font-weight:600}
#matrix tr.v-error td.verdict{color:#111;font-weight:600}
#matrix td.num{text-align:right;font-family:ui-monospace,monospace}
.legend{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0;align-items:center}
.legend span.sw{display:inline-block;width:28px;height:16px;border:1px solid #aaa;vertical-align:middle;margin-right:4px}
"""


def _text_class(colour: str) -> str:
    """White text on dark backgrounds (relative luminance below 0.35)."""
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "dark" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.35 else "light"


def _e(s: Any) -> str:
    return html.escape("—" if s is None else str(s), quote=True)


def _legend() -> str:
    items = [(margin_colour(10.0 ** e), f"{10.0 ** e:g}") for e in (-4, -3, -2, -1, 0)]
    items += [(COLOURS["fail"], "fail"), (COLOURS["error"], "error"),
              (COLOURS["nonfiring"], "non-firing in vLLM"), (COLOURS["absent"], "not offered")]
    sw = "".join(f'<span class="item"><span class="sw" style="background:{c}"></span>{_e(t)}</span>' for c, t in items)
    return (f'<div class="legend"><b>cell colour</b> = worst rel err / tolerance over layers and references '
            f'(log scale, 1 = at tolerance): {sw}</div>')


SUMMARY_HEAD = ("HF architecture", "overlay", "device", "dtype", "vLLM", "transformers", "TL",
                "hooks passed / offered / non-firing", "worst rel err (where)")


def _summary_cells(row: dict) -> str:
    worst = row.get("worst_rel_err")
    worst_s = "—" if worst is None else f"{_num(worst):.1e} ({row.get('worst_where')})"
    vals = [f"<code>{_e(row.get('architecture'))}</code>", _e(row.get("overlay")), _e(row.get("device")),
            _e(row.get("dtype")), _e(row.get("vllm")), _e(row.get("transformers")), _e(row.get("transformer_lens")),
            f"{_e(row.get('hooks_passed'))} / {_e(row.get('hooks_offered'))} / {_e(row.get('nonfiring'))}",
            _e(worst_s)]
    return "".join(f'<td class="num">{v}</td>' if i == 7 else f"<td>{v}</td>" for i, v in enumerate(vals))


def _verdict_title(row: dict, verdict: str) -> str:
    bug = row.get("known_vllm_bug")
    return (row.get("error") or row.get("skipped") or (bug and f"known vLLM bug: {bug}")
            or row.get("stale_vllm_bug") or verdict)


def to_html(rows: list[dict], reports: Mapping[str, dict]) -> str:
    """The whole page for matrix ``rows``; ``reports`` keyed by each row's ``report`` path."""
    reps = [reports.get(r.get("report") or "", {}) for r in rows]
    kinds = kind_columns(reps)
    head = ['<tr><th>family</th><th>variant</th><th>verdict</th>']
    head += [f'<th class="kind" title="{_e(k)}"><span>{_e(k)}</span></th>' for k in kinds]
    head += [f"<th>{_e(h)}</th>" for h in SUMMARY_HEAD] + ["</tr>"]
    body = []
    for row, rep in zip(rows, reps):
        verdict = row.get("verdict", "error")
        tr = [f'<tr class="v-{_e(verdict)}" data-family="{_e(row.get("model"))}" data-variant="{_e(row.get("variant"))}">',
              f"<th scope=\"row\">{_e(row.get('model'))}</th><td>{_e(row.get('variant'))}</td>",
              f'<td class="verdict" title="{_e(_verdict_title(row, verdict))}">{_e(verdict)}'
              + (" (known vLLM bug)" if row.get("known_vllm_bug") else "") + "</td>"]
        by_kind: dict[str, list[dict]] = {}
        for r in rep.get("rows", []):
            by_kind.setdefault(r["kind"], []).append(r)
        if not by_kind and (row.get("error") or rep.get("error") or verdict == "error"):
            err = (rep.get("error") or row.get("error") or "report unreadable").strip()
            tr.append(f'<td class="wide" colspan="{max(len(kinds), 1)}" title="{_e(err)}">'
                      f"{_e(err.splitlines()[0][:120] if err else 'error')}</td>")
        else:
            nf = _nonfiring_by_kind(rep)
            for k in kinds:
                c = cell(k, by_kind.get(k, []), nf.get(k))
                tr.append(f'<td class="cell {c["state"]} {_text_class(c["colour"])}" data-kind="{_e(k)}" '
                          f'data-state="{c["state"]}" style="background:{c["colour"]}" '
                          f'title="{_e(c["title"])}">{_e(c["text"])}</td>')
        tr.append(_summary_cells(row) if "architecture" in row else f'<td colspan="{len(SUMMARY_HEAD)}">—</td>')
        tr.append("</tr>")
        body.append("".join(tr))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        "<title>vllm-parity: model-support matrix</title>", f"<style>{_CSS}</style></head><body>",
        "<h1>Model-support matrix</h1>",
        '<p class="note">Generated by <code>python -m harness matrix</code> from '
        "<code>reports/*/report*.json</code>; do not edit. One row per family and variant; one column per "
        "hook kind (all layers and references folded into one cell). Hover a cell for the numbers.</p>",
        _legend(),
        '<table id="matrix"><thead>', "".join(head), "</thead><tbody>", *body, "</tbody></table>",
        "</body></html>", ""])


def load_reports(report_dir: Path, rows: list[dict]) -> dict[str, dict]:
    out = {}
    for r in rows:
        rel = r.get("report")
        if not rel:
            continue
        try:
            out[rel] = json.loads((Path(report_dir) / rel).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            out[rel] = {"error": f"unreadable {rel}: {exc}"}
    return out


def write_html(report_dir: Path, rows: list[dict]) -> Path:
    path = Path(report_dir) / "support_matrix.html"
    path.write_text(to_html(rows, load_reports(report_dir, rows)), encoding="utf-8")
    return path
