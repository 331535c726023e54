"""pytest-benchmark benchmarks of the harness: their command-line options, fixtures and artifact.

Contract:
- Collected only from an explicit path: ``pytest benchmarks/`` or a file in it.  CI's ``pytest``
  (``testpaths = ["tests", "parity_tests"]``) never enters this folder; a run that enters it without
  naming it (``pytest .``) skips every benchmark, with a reason (``pytest_collection_modifyitems``).
- Options (all ``--bench-*``, so they never clash with the parity plugin's ``--model``/``--dtype``):
  the capture-cost benchmark's model, prompt lengths, rounds, warm-up and tools; the suite
  benchmark's families, dtype and rounds.  pytest-benchmark's own options (``--benchmark-json``,
  ``--benchmark-autosave``, ``--benchmark-compare``, ``--benchmark-disable``) work as documented.
- Fixtures: ``bench_opts`` (the options), ``capture_engines`` (one engine process per tool, booted
  once per pytest run, closed at its end), ``bench_results`` (each benchmark's extra_info and stats,
  for the ratios between benchmarks and the summary).
- Artifact: the JSON's ``machine_info`` gains the CPU model, core count, host kernel path, package
  versions and the load averages when the JSON is written (``pytest_benchmark_update_machine_info``);
  the terminal summary prints the ratio and phase tables (benchmarks/bench_tables.py), the same ones
  ``python -m benchmarks.bench_tables FILE.json`` renders from a saved run.

Traps: the ratios between benchmarks (``x boot_vllm``) need the TransformerLens benchmarks to run
first in the same pytest run: the capture-cost module orders its cases so, and a ``-k`` that drops
them leaves that ratio out (``None``), never computed against another run.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("vllm-parity benchmarks", "benchmarks/ (pytest-benchmark)")
    g.addoption("--bench-model", default="qwen3",
                help="capture cost: the family (harness/models/families.py; smollm2 = the real 135M model)")
    g.addoption("--bench-lengths", default="128", help="capture cost: prompt lengths in tokens, comma-separated")
    g.addoption("--bench-max-len", type=int, default=256, help="capture cost: max_model_len = max_num_batched_tokens")
    g.addoption("--bench-rounds", type=int, default=20,
                help="capture cost: timed calls per mode, each paired with a bare forward in its round")
    g.addoption("--bench-warmup", type=int, default=1, help="capture cost: untimed calls after each hook swap")
    g.addoption("--bench-tools", default="ours,tl", help="capture cost: ours, or ours,tl (TransformerLens boot_vllm)")
    g.addoption("--bench-families", default="qwen3,gpt2",
                help="suite: families of one `python -m harness run` (comma-separated; 'default' = the default set)")
    g.addoption("--bench-dtype", default="float32", help="suite: dtype of the run")
    g.addoption("--bench-suite-rounds", type=int, default=1, help="suite: fresh runs timed")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    named = any(_inside(a) for a in config.args)
    if named:
        return
    skip = pytest.mark.skip(reason="benchmarks run only when benchmarks/ or one of its files is named on the "
                                   "command line (docs/benchmarks.md)")
    for item in items:
        if _inside(str(item.path)):
            item.add_marker(skip)


def _inside(arg: str) -> bool:
    path = Path(arg.split("::")[0]).resolve()
    return path == HERE or HERE in path.parents


@pytest.fixture(scope="session")
def bench_opts(request: pytest.FixtureRequest) -> dict:
    c = request.config
    return {"model": c.getoption("--bench-model"),
            "lengths": [int(x) for x in c.getoption("--bench-lengths").split(",")],
            "max_len": c.getoption("--bench-max-len"), "rounds": c.getoption("--bench-rounds"),
            "warmup": c.getoption("--bench-warmup"), "tools": c.getoption("--bench-tools").split(","),
            "families": c.getoption("--bench-families"), "dtype": c.getoption("--bench-dtype"),
            "suite_rounds": c.getoption("--bench-suite-rounds")}


@pytest.fixture(scope="session")
def capture_engines(bench_opts: dict):
    """``{tool: Remote}``: each tool's engine in its own process, booted once per pytest run."""
    from benchmarks.bench_capture_overhead import Remote

    engines: dict = {}
    try:
        for tool in ["ours"] + [t for t in bench_opts["tools"] if t == "tl"]:
            engines[tool] = Remote(tool, bench_opts["model"], bench_opts["max_len"], bench_opts["lengths"])
        yield engines
    finally:
        for e in engines.values():
            e.close()


@pytest.fixture(scope="session")
def bench_results(request: pytest.FixtureRequest) -> dict:
    return request.config._vp_bench_results  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    config._vp_bench_results = {}  # type: ignore[attr-defined]


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    from benchmarks.bench_capture_overhead import _cpu_model, _versions
    from harness.kernel_path import cpu_kernel_path, label

    machine_info.update({"cpu_model": _cpu_model(), "cores": os.cpu_count(), "loadavg_1_5_15_at_save": os.getloadavg(),
                         "kernel_path_host": label(cpu_kernel_path()), "versions": _versions()})


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    results = getattr(config, "_vp_bench_results", None)
    if results:
        from benchmarks.bench_tables import render

        terminalreporter.section("vllm-parity benchmarks: ratios and phases (extra_info)")
        terminalreporter.write(render(list(results.values())) + "\n")
