"""Gated hooks per family and variant from a report folder: ``python scripts/gated_table.py reports/``.

Prints a markdown table: family | variant | gated / compared hooks | inconclusive rows | verdict
(the one rule, harness.comparison.verdict.summarize, re-applied to the file's rows) | verdict the run
stored: a diagnostic for report files written by older code.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.comparison.verdict import summarize
from harness.reporting.naming import SELECTION_SUFFIX, variant_of


def main(folder: str) -> None:
    print("| family | variant | gated / compared hooks | inconclusive rows | verdict (these rules) | verdict stored |")
    print("|---|---|---|---|---|---|")
    for path in sorted(Path(folder).glob("*/report*.json")):
        if path.stem.endswith(SELECTION_SUFFIX):
            continue
        r = json.loads(path.read_text())
        s = summarize(r)  # the rule re-applied to the file's rows, to compare with what it stored
        stored = (r.get("summary") or {}).get("verdict", "?")
        print(f"| {r['model']} | {variant_of(r)} | {s['hooks_gated']} / {s['hooks_compared']} | {s['inconclusive']} "
              f"| {s['verdict']} | {stored} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "reports")
