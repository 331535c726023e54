"""JUnit XML (pytest ``--junitxml``) as one markdown summary: CI's job summary.

Contract: :func:`to_markdown(paths)` reads each file and returns a table (one row per
file: tests, passed, failed, errors, skipped, seconds) and then every failing or
erroring test case with the first line of its message, so a reader of the summary sees
what failed without opening a log.  Pure but for reading the files; standard library only.

Traps: pytest writes xfailed tests as ``<skipped>`` (they count as skipped here, as in
pytest's own totals); a file that is missing or not XML is a row saying so, never
dropped, so a shard whose XML never arrived is visible.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

MAX_LISTED = 60  # failures listed; the rest are counted (the XML artifacts hold them all)


def _cases(root: ET.Element) -> list[ET.Element]:
    return list(root.iter("testcase"))


def _outcome(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def _first_line(case: ET.Element) -> str:
    node = case.find("failure")
    node = node if node is not None else case.find("error")
    text = (node.get("message") or node.text or "").strip() if node is not None else ""
    line = text.splitlines()[0] if text else ""
    return line[:300] + (" ..." if len(line) > 300 else "")


def _case_id(case: ET.Element) -> str:
    cls = case.get("classname", "")
    return f"{cls.replace('.', '/')}.py::{case.get('name')}" if cls else str(case.get("name"))


def summarize(path: Path) -> tuple[dict, list[tuple[str, str]]]:
    """Counts of one file and its failing cases ``(id, message)``; ``counts["error"]`` says why a
    file could not be read."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        return {"file": str(path), "error": f"unreadable: {exc}"}, []
    counts = {"file": str(path), "tests": 0, "passed": 0, "failure": 0, "error": 0, "skipped": 0,
              "seconds": sum(float(s.get("time", 0) or 0) for s in root.iter("testsuite"))}
    failing = []
    for case in _cases(root):
        outcome = _outcome(case)
        counts["tests"] += 1
        counts[outcome] += 1
        if outcome in ("failure", "error"):
            failing.append((_case_id(case), _first_line(case)))
    return counts, failing


def to_markdown(paths: Iterable[Path]) -> str:
    out = ["## Tests (JUnit XML)", "", "| file | tests | passed | failed | errors | skipped | seconds |",
           "|---|---|---|---|---|---|---|"]
    failing: list[tuple[str, str, str]] = []
    for path in paths:
        c, bad = summarize(Path(path))
        if "tests" not in c:
            out.append(f"| `{path}` | — | — | — | — | — | {c['error']} |")
            continue
        out.append(f"| `{Path(path).name}` | {c['tests']} | {c['passed']} | {c['failure']} | {c['error']} "
                   f"| {c['skipped']} | {c['seconds']:.0f} |")
        failing += [(Path(path).name, i, m) for i, m in bad]
    if failing:
        out += ["", f"### Failed or errored ({len(failing)})", ""]
        out += [f"- `{i}` ({f}): {m.replace('|', '/')}" for f, i, m in failing[:MAX_LISTED]]
        if len(failing) > MAX_LISTED:
            out.append(f"- ... and {len(failing) - MAX_LISTED} more: see the JUnit XML artifacts")
    return "\n".join(out) + "\n"
