"""Per-model parity reports on disk: a result dict to its files (the markdown is harness.reporting.markdown,
the names harness.reporting.naming).

Contract: :func:`write_report(result, report_dir)` writes
``<report_dir>/<model>/report.json`` (every field of the result: rows with
their numbers, non-firing hooks with reasons, timings, versions, dtype, seed,
prompts) and ``report.md`` beside it, and returns the JSON path.  A variant
other than CPU fp32 gets a suffix (``report-cuda-bfloat16.json``) so runs of
one family in several settings sit side by side and the matrix merges them.

Timings: ``timings["phases"]`` (seconds per phase, harness.pipeline.runner) and
``timings["peak_memory"]`` render as a table under "Timings"; :func:`write_report`
adds the ``report`` phase itself, measured around the depth plot and the summary.
Trap: the report phase cannot include writing the very files that hold it: the
markdown render and the two atomic writes (milliseconds) come after its clock stops.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from harness.comparison.verdict import summary_of
from harness.reporting.markdown import to_markdown
from harness.reporting.naming import report_stem

SCHEMA_VERSION = 1


def with_phase(result: dict, name: str, seconds: float) -> dict:
    """``result`` with one more phase in ``timings["phases"]``; ``result`` itself is left as it was."""
    timings = dict(result.get("timings") or {})
    timings["phases"] = {**(timings.get("phases") or {}), name: seconds}
    return {**result, "timings": timings}



def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename: a run killed midway leaves the
    previous file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_report(result: dict, report_dir: Path) -> Path:
    """Write ``<model>/<stem>.json``, ``.md`` and the depth plot, each atomically; the JSON last, so a
    report JSON on disk always has its markdown beside it."""
    started = time.perf_counter()
    folder = Path(report_dir) / result["model"]
    folder.mkdir(parents=True, exist_ok=True)
    stem = report_stem(result)
    summary = summary_of(result)
    path = folder / f"{stem}.json"
    from harness.reporting.depth_plot import write_depth_plot

    png = write_depth_plot(result, folder / f"{stem.replace('report', 'depth', 1)}.png")
    result = with_phase(result, "report", time.perf_counter() - started)
    payload = {"schema": SCHEMA_VERSION, **result, "summary": summary}
    md = to_markdown(result)
    if png is not None:
        md += f"\n## Depth profile\n\n![error by layer]({png.name})\n"
    _atomic_write(folder / f"{stem}.md", md)
    _atomic_write(path, json.dumps(payload, indent=1, default=_json_default, allow_nan=True))
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
