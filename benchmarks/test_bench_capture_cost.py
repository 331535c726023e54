"""Capture cost as pytest-benchmark benchmarks: ours (none / residual / tl-set / all) and
TransformerLens's ``boot_vllm`` (residual / all), each against the bare forward of the same rounds.

Run (from the repo root; a synthetic qwen3 by default, ``--bench-model smollm2`` for the real model)::

    .venv/bin/python -m pytest benchmarks/test_bench_capture_cost.py --benchmark-autosave \\
        --benchmark-json bench-capture.json [--bench-rounds 20 --bench-lengths 16,128]

One benchmark per (tool, mode, prompt length), e.g. ``test_capture_cost[qwen3-ours-all-128]``.

Protocol (benchmarks/bench_capture_overhead.py holds the engines, the modes and the hook sets):
each tool's engine runs in its own process, booted once per pytest run (fp32, eager, prefix
caching off, the same prompt token ids): two vLLM engines do not share a process well.  This
process drives them over pipes; only the engine asked computes.  Each benchmark is
``benchmark.pedantic(one capture, setup=..., rounds=--bench-rounds, iterations=1)``; the setup of
every round (untimed) first runs one **bare forward** on our engine (no capture hook: the physical
limit and the denominator), then installs the mode's hooks and makes ``--bench-warmup`` untimed
calls.  So every timed call has a bare forward next to it, and the *paired* ratio (median over
rounds of forward / that round's bare forward) cancels the drift of a shared machine.

What is timed:
- pytest-benchmark's statistics: one capture as the caller waits for it, seen from this process --
  ours: ``llm.generate`` + ``vp_dump`` to ``/dev/shm`` + ``load_file`` (the harness's path); TL:
  ``run_with_cache`` (which also rebuilds full-sequence logits host-side) -- plus one pipe round trip
  (well under a millisecond).  This is what ``pytest-benchmark compare`` compares across commits.
- ``extra_info``: the model's ``forward`` alone, timed inside the engine (a pre/post hook pair on
  the top module, wall clock and the engine's CPU time); the same for the paired bare forwards; the
  ratios ``forward_x_bare`` (p10 / p10, min / min, paired), ``forward_cpu_x_bare``, ``e2e_x_bare``;
  for ours, ``x_boot_vllm``: ours' paired forward ratio over TL's for the like-for-like TL mode
  (residual -> ``tl/residual``; tl-set and all -> ``tl/all``), both over bare forwards of their own
  rounds; the hooks, tensors and bytes one call hands back, and copying them once more alone
  (``copy_floor_ms``); the engine's kernel path, boot time, and load averages before and after.

Traps: hooks are installed after boot, so both engines run eager.  TL's engine cannot run without
its hooks (it installs one on every hook point at boot; ``names_filter`` only limits the read-back),
so TL is divided by our bare forward.  ``ours/none`` against its paired bare forward shows the noise
of the pairing itself (its ratio would be 1.000 on a quiet machine).  The TL cases run first so that
ours can be divided by them; ``--bench-tools ours`` leaves ``x_boot_vllm`` out.  The ratios in the
committed capture_overhead.md came from the old rotated-block protocol (the CLI script, still there).
"""
from __future__ import annotations

import os
import statistics

import pytest

from benchmarks.bench_capture_overhead import MODES

TL_PEER = {"residual": "tl/residual", "tl-set": "tl/all", "all": "tl/all"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    c = metafunc.config
    model = c.getoption("--bench-model")
    tools = [t for t in ("tl", "ours") if t == "ours" or t in c.getoption("--bench-tools").split(",")]
    cases = [(tool, mode, int(n)) for n in c.getoption("--bench-lengths").split(",")
             for tool in tools for mode in MODES[tool]]  # TL first: ours is divided by it
    metafunc.parametrize("case", cases, ids=[f"{model}-{t}-{m}-{n}" for t, m, n in cases])


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"min": xs[0], "p10": xs[len(xs) // 10], "median": statistics.median(xs), "n": len(xs)}


def test_capture_cost(benchmark, case, capture_engines, bench_opts, bench_results) -> None:
    tool, mode, n = case
    ours, eng = capture_engines["ours"], capture_engines[tool]
    benchmark.group = f"capture cost: {bench_opts['model']}, {n} tokens"
    fwd, bare, e2e, bare_e2e = [], [], [], []
    load = [os.getloadavg()]

    def one(engine) -> tuple[float, float]:
        got = engine.take()
        if len(got) != 1:
            raise RuntimeError(f"{engine.tool}: expected one forward per call, saw {len(got)}")
        return got[0]

    def setup() -> None:
        if e2e:  # the previous round's timed call: its forward, read outside the timed region
            fwd.append(one(eng))
        ours.prepare("none")
        bare_e2e.append(ours.call("none", n))
        bare.append(one(ours))
        eng.prepare(mode)
        for _ in range(bench_opts["warmup"]):
            eng.call(mode, n)
        eng.take()

    def capture() -> None:
        e2e.append(eng.call(mode, n))

    benchmark.pedantic(capture, setup=setup, rounds=bench_opts["rounds"], iterations=1)
    fwd.append(one(eng))
    counts = eng.counts(mode, n)
    load.append(os.getloadavg())

    ms = lambda pairs, i: [p[i] * 1e3 for p in pairs]  # noqa: E731
    f, b, fc, bc = _stats(ms(fwd, 0)), _stats(ms(bare, 0)), _stats(ms(fwd, 1)), _stats(ms(bare, 1))
    paired = statistics.median(x[0] / y[0] for x, y in zip(fwd, bare))
    key = f"{tool}/{mode}"
    info = {
        "kind": "capture", "model": bench_opts["model"], "tool": tool, "mode": key, "prompt_tokens": n,
        "rounds": len(fwd), "warmup": bench_opts["warmup"], "hooks": counts["hooks"], "tensors": counts["tensors"],
        "bytes": counts["bytes"], "reads": counts["reads"],
        "copy_floor_ms": min(counts["copy_floor_ms"]) if counts.get("copy_floor_ms") else None,
        "forward_ms": f, "bare_forward_ms": b, "forward_cpu_ms": fc,
        "forward_x_bare": {"p10": f["p10"] / b["p10"], "min": f["min"] / b["min"], "paired": paired},
        "forward_cpu_x_bare_p10": fc["p10"] / bc["p10"],
        "e2e_ms": _stats(e2e), "bare_e2e_ms": _stats(bare_e2e),
        "e2e_x_bare_p10": _stats(e2e)["p10"] / _stats(bare_e2e)["p10"],
        "kernel_path": eng.hello.get("kernel_path"), "boot_s": eng.hello.get("boot_s"),
        "checkpoint": eng.hello.get("checkpoint"), "loadavg_before_after": load,
    }
    peer = bench_results.get(("capture", bench_opts["model"], TL_PEER.get(mode), n)) if tool == "ours" else None
    if tool == "ours" and mode in TL_PEER:
        info["x_boot_vllm"] = None if peer is None else {
            "peer": TL_PEER[mode],
            "forward_paired": paired / peer["extra_info"]["forward_x_bare"]["paired"],
            "e2e_p10": info["e2e_x_bare_p10"] / peer["extra_info"]["e2e_x_bare_p10"]}
    benchmark.extra_info.update(info)
    st = benchmark.stats.stats if benchmark.stats else None
    bench_results[("capture", bench_opts["model"], key, n)] = {
        "name": f"test_capture_cost[{bench_opts['model']}-{tool}-{mode}-{n}]", "extra_info": info,
        "stats": {s: getattr(st, s) for s in ("min", "median", "mean")} if st else None}
