"""Compare two report folders row by row: ``python scripts/diff_reports.py BEFORE AFTER``.

For every ``<model>/report*.json`` in both folders: the rows must be the same
(reference, hook) pairs in the same order, with the same status, tolerance, floor,
metrics and message.  Floats are compared exactly; where they differ the largest
relative difference is printed, so run-to-run noise is told apart from a changed rule.
Exit status 1 if any row differs.  Used to prove a refactor changes no result.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

FIELDS = ("reference", "hook", "reference_hook", "layer", "kind", "status", "tolerance", "rel_err", "max_abs",
          "ref_scale", "cos_min", "floor", "derived", "known_issue", "message", "worst", "logit_metrics")


def _rel(a, b) -> float:
    if isinstance(a, float) and isinstance(b, float):
        if (math.isnan(a) and math.isnan(b)) or a == b:
            return 0.0
        return abs(a - b) / max(abs(a), abs(b), 1e-300)
    return 0.0 if a == b else math.inf


def diff(before: Path, after: Path) -> int:
    bad = 0
    files = sorted(p.relative_to(before) for p in before.glob("*/report*.json"))
    for rel in files:
        a, b = json.loads((before / rel).read_text()), json.loads((after / rel).read_text()) if (after / rel).exists() else None
        if b is None:
            print(f"{rel}: missing in {after}")
            bad += 1
            continue
        ra, rb = a["rows"], b["rows"]
        keys_a, keys_b = [(r["reference"], r["hook"]) for r in ra], [(r["reference"], r["hook"]) for r in rb]
        if keys_a != keys_b:
            print(f"{rel}: row sets/order differ ({len(ra)} vs {len(rb)}); first difference at "
                  f"{next((i for i, (x, y) in enumerate(zip(keys_a, keys_b)) if x != y), min(len(ra), len(rb)))}")
            bad += 1
            continue
        worst, changed = 0.0, []
        for x, y in zip(ra, rb):
            for f in FIELDS:
                d = _rel(x.get(f), y.get(f)) if not isinstance(x.get(f), dict) else (0.0 if x.get(f) == y.get(f) else math.inf)
                if d:
                    worst = max(worst, d)
                    changed.append((x["reference"], x["hook"], f, x.get(f), y.get(f)))
        status_changed = [c for c in changed if c[2] == "status"]
        print(f"{rel}: {len(ra)} rows, {'identical' if not changed else f'{len(changed)} field(s) differ, worst rel {worst:.1e}'}"
              + (f", STATUS CHANGED on {len(status_changed)}" if status_changed else ""))
        for c in changed[:5]:
            print("   ", c[:3], repr(c[3])[:120], "->", repr(c[4])[:120])
        bad += bool(changed)
    print(f"{len(files)} report(s) compared, {bad} differ")
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(diff(Path(sys.argv[1]), Path(sys.argv[2])))
