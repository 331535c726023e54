"""The suite as a pytest-benchmark benchmark: the whole ``python -m harness run`` of some families,
its time per family and per phase, and the machine it ran on.

Run (from the repo root)::

    .venv/bin/python -m pytest benchmarks/test_bench_suite.py --benchmark-autosave \\
        --benchmark-json bench-suite.json [--bench-families qwen3,gpt2 --bench-dtype float32]

``--bench-families default`` runs the 18 default families (about 5 min alone on 2 cores, much
longer on shared ones); ``--bench-families smollm2`` the real 135M model (benchmarks/bench_real_model.py
keeps its memory table).

Contract: one benchmark, ``test_suite_run[<--bench-families>-<dtype>]``, whose statistic is the wall time of a
fresh ``python -m harness run --model F --dtype D --report-dir <tmp>`` process (``benchmark.pedantic``,
``--bench-suite-rounds`` rounds, one iteration: each round a new process and an empty report folder,
so no earlier run's warm engines, memory or reports count).  Its ``extra_info`` holds, per family and
per round, what that family's report says: verdict, rows passed, kernel path, the run's wall time
(``run_model``), seconds per phase (``timings.phases``; dotted names are sub-phases, so they do not
add up to the parent twice) and sampled peak RSS; and the process's exit status and the 1-minute load
average before and after each round.  The machine (CPU model, cores, versions) is in the JSON's
``machine_info`` (benchmarks/conftest.py).

Traps: a family whose report is missing fails the benchmark (there is nothing to time per phase);
a family whose rows fail does not (a benchmark measures, it does not gate: the verdict is recorded).
On cores shared with other runs the comparison phases grow many-fold (docs/benchmarks.md): read the
load averages beside the times.
"""
from __future__ import annotations

import os
import tempfile
import time

from benchmarks.bench_real_model import family_record, harness_run, read_reports



def _families(spec: str) -> list[str]:
    from harness.models.families import resolve_families

    return [f.name for f in resolve_families(None if spec == "default" else spec)]


def pytest_generate_tests(metafunc) -> None:
    if "suite" in metafunc.fixturenames:
        spec, dtype = metafunc.config.getoption("--bench-families"), metafunc.config.getoption("--bench-dtype")
        metafunc.parametrize("suite", [(spec, dtype)], ids=[f"{spec}-{dtype}"])


def test_suite_run(benchmark, suite, bench_opts, bench_results) -> None:
    spec, dtype = suite
    families = _families(spec)
    benchmark.group = "suite: python -m harness run"
    rounds: list[dict] = []
    keep: list[tempfile.TemporaryDirectory] = []

    def setup() -> None:
        keep.append(tempfile.TemporaryDirectory(prefix="bench-suite-"))
        rounds.append({"loadavg_before": os.getloadavg()})

    def run() -> None:
        t0 = time.perf_counter()
        proc = harness_run(",".join(families), dtype, keep[-1].name)
        rounds[-1].update({"exit": proc.returncode, "process_wall_s": time.perf_counter() - t0,
                           "loadavg_after": os.getloadavg(), "stderr_tail": proc.stderr[-1500:]})

    try:
        benchmark.pedantic(run, setup=setup, rounds=bench_opts["suite_rounds"], iterations=1)
        for r, tmp in zip(rounds, keep):
            reports = read_reports(tmp.name, families)
            missing = [f for f in families if f not in reports]
            assert not missing, f"no report for {missing} (exit {r['exit']}): {r['stderr_tail']}"
            r["families"] = {f: family_record(reports[f]) for f in families}
    finally:
        for tmp in keep:
            tmp.cleanup()
    for r in rounds:
        r.pop("stderr_tail", None)
    info = {"kind": "suite", "families": families, "dtype": dtype, "rounds": rounds,
            "kernel_path": sorted({fr["kernel_path"] for r in rounds for fr in r["families"].values()})}
    benchmark.extra_info.update(info)
    st = benchmark.stats.stats if benchmark.stats else None
    bench_results[("suite", spec, dtype)] = {
        "name": f"test_suite_run[{spec}-{dtype}]", "extra_info": info,
        "stats": {s: getattr(st, s) for s in ("min", "median", "mean")} if st else None}
