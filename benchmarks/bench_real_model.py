"""The whole suite on a real trained model: wall time and peak memory per phase, against the targets.

Run (from the repo root)::

    .venv/bin/python -m benchmarks.bench_real_model                      # smollm2, fp32
    .venv/bin/python -m benchmarks.bench_real_model --dtype float32,bfloat16 --repeat 2

Each run is ``python -m harness run --model M --dtype D`` in a fresh process (so no earlier run's
memory is in its peaks), with its report in a temporary folder.  From each report it takes the
wall time, the rows, ``timings.phases`` (seconds per phase) and ``timings.memory`` (harness.memory:
RSS sampled every 0.05 s, this process and the vLLM engine process separately and together, per
phase), and from the OS the process's lifetime ``ru_maxrss``.  Writes
``benchmarks/real_model.json`` (every run) and prints a markdown table; ``--render`` re-prints it.

Targets (SmolLM2-135M on the 2 CPU cores CI has): a full fp32 run in at most
:data:`TARGET_WALL_S` seconds and at most :data:`TARGET_RSS_MIB` MiB peak RSS.  The table says met
or missed for the harness process, and shows the engine process and the two together beside it,
since they are separate processes that overlap only while vLLM runs.

A benchmark, not a test: the numbers depend on the machine and what else runs on it; the table
records the host's cores.  Nothing here asserts a time.  The same run in pytest-benchmark's form
(whole-run time per invocation, per-family per-phase seconds and the machine in its JSON, comparable
across commits with ``pytest-benchmark compare``) is ``benchmarks/test_bench_suite.py``, which uses
:func:`harness_run` and :func:`family_record` from here; this script stays for the memory table.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "real_model.json"
TARGET_WALL_S = 90.0
TARGET_RSS_MIB = 2048.0
PHASES_SHOWN = ("subject", "references.bridge_forward", "references.processed", "references.truth_bridge",
                "references.truth_hf", "compare")


def harness_run(models: str, dtype: str, report_dir: str) -> subprocess.CompletedProcess:
    """``python -m harness run --model MODELS --dtype DTYPE --report-dir DIR`` in a fresh process:
    what the pytest suite benchmark times (benchmarks/test_bench_suite.py)."""
    return subprocess.run([sys.executable, "-m", "harness", "run", "--model", models, "--dtype", dtype,
                           "--report-dir", report_dir], cwd=REPO, capture_output=True, text=True)


def family_record(report: dict) -> dict:
    """What one family's report says about its run: verdict, rows, kernel path, run wall, per-phase
    seconds (``timings.phases``, sub-phases dotted) and sampled peak RSS (``timings.memory``)."""
    t, s = report.get("timings") or {}, report.get("summary") or {}
    return {"model": report.get("model"), "dtype": report.get("dtype"), "kernel_path": report.get("kernel_path"),
            "run_wall_s": report.get("wall_s"), "verdict": s.get("verdict"), "rows": s.get("rows"),
            "passed": s.get("passed"), "phases": t.get("phases"), "memory": t.get("memory")}


def read_reports(report_dir: str | Path, models: list[str]) -> dict[str, dict]:
    """Each model's first report under ``report_dir`` (a missing one is absent from the result)."""
    out = {}
    for model in models:
        reports = sorted(Path(report_dir).glob(f"{model}/report*.json"))
        if reports:
            out[model] = json.loads(reports[0].read_text())
    return out


def run_once(model: str, dtype: str) -> dict:
    """One fresh ``python -m harness run``; what its report and the OS say about it."""
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t0 = time.perf_counter()
        proc = harness_run(model, dtype, tmp)
        wall = time.perf_counter() - t0
        maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        r = read_reports(tmp, [model]).get(model)
        if r is None:
            raise RuntimeError(f"{model} {dtype}: no report (exit {proc.returncode}): {proc.stderr[-2000:]}")
    rec = family_record(r)
    return {"model": model, "dtype": dtype, "exit": proc.returncode, "process_wall_s": wall,
            "run_wall_s": rec["run_wall_s"], "verdict": rec["verdict"], "rows": rec["rows"],
            "passed": rec["passed"], "phases": rec["phases"], "memory": rec["memory"],
            # the largest finished descendant's lifetime peak (the harness process, or the engine if larger)
            "ru_maxrss_children_mib": (maxrss if maxrss > before else before) / 1024}


def render(runs: list[dict], host: dict) -> str:
    out = [f"Host: {host['cores']} cores, {host['platform']}; targets: a full run ≤ {TARGET_WALL_S:.0f} s "
           f"and ≤ {TARGET_RSS_MIB / 1024:.0f} GB peak RSS.", "",
           "| model | dtype | rows passed | wall (process) | harness peak RSS | engine peak RSS | both at once | "
           "wall ≤ 90 s | harness ≤ 2 GB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        m = r["memory"] or {}
        out.append(f"| {r['model']} | {r['dtype']} | {r['passed']}/{r['rows']} ({r['verdict']}) | "
                   f"{r['process_wall_s']:.0f} s | {m.get('rss_self_peak_mib', 0):.0f} MiB | "
                   f"{m.get('rss_engines_peak_mib', 0):.0f} MiB | {m.get('rss_peak_mib', 0):.0f} MiB | "
                   f"{'met' if r['process_wall_s'] <= TARGET_WALL_S else 'missed'} | "
                   f"{'met' if m.get('rss_self_peak_mib', 1e9) <= TARGET_RSS_MIB else 'missed'} |")
    first = runs[0]
    out += ["", f"Per phase, {first['model']} {first['dtype']} (seconds; peak RSS of the harness and the "
                f"engine together while the phase ran, MiB):", "",
            "| phase | seconds | peak RSS |", "|---|---|---|"]
    for name in PHASES_SHOWN:
        sec = (first["phases"] or {}).get(name)
        mem = ((first["memory"] or {}).get("by_phase") or {})
        peak = max((v for k, v in mem.items() if k == name or k.startswith(name + ".")), default=None)
        if sec is not None:
            out.append(f"| {name} | {sec:.1f} | {peak:.0f} |" if peak is not None else f"| {name} | {sec:.1f} | — |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="float32", help="comma-separated")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--render", action="store_true", help=f"re-print the table from {OUT.name}")
    args = ap.parse_args(argv)
    if args.render:
        data = json.loads(OUT.read_text())
        print(render(data["runs"], data["host"]))
        return 0
    import platform

    host = {"cores": os.cpu_count(), "platform": platform.platform()}
    runs = [run_once(args.model, d) for d in args.dtype.split(",") for _ in range(args.repeat)]
    OUT.write_text(json.dumps({"host": host, "runs": runs}, indent=1))
    print(render(runs, host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
