"""Capture overhead: what the harness's vLLM hooks cost a forward and a generate.

Run: ``.venv/bin/python -m benchmarks.bench_capture_overhead`` (from the repo
root; ``--help`` for options).  Writes ``benchmarks/capture_overhead.json``
and ``.md`` (a small table) and prints the table.

One vLLM engine (eager, fp32, the synthetic ``qwen3`` by default) boots once
with :class:`BenchExtension` -- :class:`harness.engines.vllm_worker.CaptureExtension`
plus a way to remove its hooks -- and three read sets are installed in turn:

* ``none``      -- no capture hook (only the worker's forward timer, present in
  every mode);
* ``residual``  -- the residual stream: ``embed.hook_out``,
  ``blocks.{i}.hook_out``, ``ln_final.hook_normalized``;
* ``all``       -- every read of the model's overlay (all offered hooks,
  ``unembed.hook_out``'s logits processor included).

Modes are interleaved round by round (none, residual, all, none, ...), so
drift on a shared machine spreads over all of them.  Per generate it records
the model forward's wall time (the worker's timer: the model's ``forward``
only -- no scheduling, sampling or logits processor) and the end-to-end
``llm.generate`` wall time (one prompt, ``max_tokens=1``, no log-probs).  On a
shared machine the samples are bimodal: a few ms when the engine runs, ~140 ms
when the scheduler preempts it mid-forward.  The table therefore reports the
10th percentile and the minimum (the engine's own cost) and the share of
preempted samples; medians and every sample are in the JSON.  A capture hook's cost is the
read itself plus a device-to-host copy (``.cpu()``) per hook per forward; the
file dump that follows a harness capture is not timed here.

Traps: hooks must be installed after the engine boots, so this runs eager
(``enforce_eager=True``, the harness's default); compiled mode installs hooks
before tracing (harness.engines.vllm_plugin) and cannot swap read sets in one boot.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from harness.engines.vllm_worker import CaptureExtension

OUT = Path(__file__).resolve().parent / "capture_overhead"
RESIDUAL = ("embed.hook_out", "ln_final.hook_normalized")


class BenchExtension(CaptureExtension):
    """The harness's worker extension plus hook removal and timer read-out."""

    def vp_uninstall(self) -> None:
        for handle in getattr(self, "_vp_handles", []):
            handle.remove()
        self._vp_handles = []

    def vp_take(self) -> dict:
        """Forward times and record counts since the last reset; then reset."""
        out = {"forward_s": list(self._vp_forward_s),
               "records": sum(len(v) for v in self._vp_records.values())}
        self.vp_reset()
        return out


def read_sets(target) -> dict[str, list[list[str]]]:
    specs = target.overlay.hook_specs(target.hf_config)
    residual = [s for h, s in specs.items() if h in RESIDUAL or (h.startswith("blocks.") and h.endswith(".hook_out")
                                                                  and h.count(".") == 2)]
    as_reads = lambda ss: sorted({(s.module, s.read) for s in ss})  # noqa: E731
    return {"none": [], "residual": [list(r) for r in as_reads(residual)],
            "all": [list(r) for r in as_reads(specs.values())]}


def _stats(xs: list[float]) -> dict[str, float]:
    """min, p10, median, and the share of samples over 5x the minimum (preempted)."""
    xs = sorted(xs)
    return {"min": xs[0], "p10": xs[len(xs) // 10], "median": statistics.median(xs),
            "slow_share": sum(x > 5 * xs[0] for x in xs) / len(xs)}


def run(model: str, lengths: list[int], rounds: int, iters: int, warmup: int) -> dict:
    from harness.engines.subject_vllm import _env_defaults

    _env_defaults()
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    from harness.models.targets import targets_from_options

    target = targets_from_options(model, None)[0]
    modes = read_sets(target)
    gen = torch.Generator().manual_seed(0)
    prompts = {n: [1] + torch.randint(4, target.vocab_size, (n - 1,), generator=gen).tolist() for n in lengths}
    t0 = time.perf_counter()
    llm = LLM(model=str(target.checkpoint), dtype="float32", enforce_eager=True, seed=0,
              worker_extension_cls="benchmarks.bench_capture_overhead.BenchExtension",
              max_model_len=target.max_model_len, enable_prefix_caching=False)
    boot_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    samples = {m: {n: {"forward_ms": [], "generate_ms": []} for n in lengths} for m in modes}
    records = {m: {} for m in modes}
    load = [os.getloadavg()[0]]
    for _ in range(rounds):
        for mode, reads in modes.items():
            llm.collective_rpc("vp_uninstall")
            missing = llm.collective_rpc("vp_install", args=(reads,))[0]
            if missing:
                raise RuntimeError(f"mode {mode}: modules not found: {missing}")
            for n, tokens in prompts.items():
                for _ in range(warmup):
                    llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)
                llm.collective_rpc("vp_take")
                for _ in range(iters):
                    t = time.perf_counter()
                    llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)
                    e2e = time.perf_counter() - t
                    took = llm.collective_rpc("vp_take")[0]
                    if len(took["forward_s"]) != 1:
                        raise RuntimeError(f"expected one forward per generate, saw {len(took['forward_s'])}")
                    samples[mode][n]["forward_ms"].append(took["forward_s"][0] * 1e3)
                    samples[mode][n]["generate_ms"].append(e2e * 1e3)
                    records[mode][n] = took["records"]
        load.append(os.getloadavg()[0])
    rows = []
    for mode, reads in modes.items():
        for n in lengths:
            row = {"mode": mode, "reads": len(reads), "tensors_per_forward": records[mode][n], "prompt_tokens": n,
                   "samples": len(samples[mode][n]["forward_ms"])}
            for k in ("forward_ms", "generate_ms"):
                st, base = _stats(samples[mode][n][k]), _stats(samples["none"][n][k])
                row.update({f"{k}_{s}": v for s, v in st.items()})
                row.update({f"{k}_p10_overhead_pct": 100 * (st["p10"] / base["p10"] - 1),
                            f"{k}_min_overhead_pct": 100 * (st["min"] / base["min"] - 1)})
            rows.append(row)
    return {
        "model": model, "checkpoint": str(target.checkpoint), "dtype": "float32", "enforce_eager": True,
        "vllm": vllm.__version__, "torch": torch.__version__, "machine": platform.machine(),
        "processor": platform.processor(), "cpus": os.cpu_count(), "loadavg_1min": load, "boot_s": boot_s,
        "rounds": rounds, "iters_per_round": iters, "warmup_per_round": warmup,
        "command": "python -m benchmarks.bench_capture_overhead " + " ".join(sys.argv[1:]),
        "samples": samples, "rows": rows,
    }


def to_markdown(res: dict) -> str:
    out = [f"# Capture overhead: {res['model']} (vLLM {res['vllm']}, {res['dtype']}, eager, "
           f"{res['cpus']} CPUs, load {min(res['loadavg_1min']):.1f}-{max(res['loadavg_1min']):.1f})", "",
           f"`{res['command']}`; {res['rounds']} rounds x {res['iters_per_round']} generates per mode and "
           "length, modes interleaved. Forward = the model's forward only; generate = `llm.generate` end to end "
           "(one prompt, max_tokens=1). p10 / min in ms, overhead vs `none` at the same length (p10 / min); "
           "preempted = share of samples over 5x the minimum (the scheduler took the CPU mid-forward; medians "
           "and all samples are in the JSON).", "",
           "| mode | reads | tensors / forward | prompt tokens | forward p10 / min | overhead "
           "| generate p10 / min | overhead | preempted |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        out.append(f"| {r['mode']} | {r['reads']} | {r['tensors_per_forward']} | {r['prompt_tokens']} "
                   f"| {r['forward_ms_p10']:.2f} / {r['forward_ms_min']:.2f} "
                   f"| {r['forward_ms_p10_overhead_pct']:+.0f}% / {r['forward_ms_min_overhead_pct']:+.0f}% "
                   f"| {r['generate_ms_p10']:.2f} / {r['generate_ms_min']:.2f} "
                   f"| {r['generate_ms_p10_overhead_pct']:+.0f}% / {r['generate_ms_min_overhead_pct']:+.0f}% "
                   f"| {r['forward_ms_slow_share']:.0%} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3", help="a synthetic family (harness/models/families.py)")
    ap.add_argument("--lengths", default="16,128", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=8, help="timed generates per mode, length and round")
    ap.add_argument("--warmup", type=int, default=2, help="untimed generates after each hook swap")
    ap.add_argument("--out", type=Path, default=OUT, help="output stem (.json and .md are written)")
    args = ap.parse_args(argv)
    res = run(args.model, [int(x) for x in args.lengths.split(",")], args.rounds, args.iters, args.warmup)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    md = to_markdown(res)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
