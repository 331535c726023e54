"""Never lose a result when an engine is lost: a vLLM process killed by a signal, or one still running
at ``--engine-timeout``, is that model's error naming why -- in its report and the matrix -- the run
goes on with the next model, and nothing the engine started is left running.  Real engines through
the command line (tiny families, fp32), and the process-group mechanics on a stand-in engine."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.parity
from harness.paths import REPO_ROOT as REPO


# --- processes, from /proc -----------------------------------------------------------
def _procs() -> dict[int, dict]:
    """Every process: parent, session, state and command line."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session ...
        out[int(d.name)] = {"state": fields[0], "ppid": int(fields[1]), "sid": int(fields[3]), "cmd": cmd}
    return out


def _descends(pid: int, root: int, procs: dict[int, dict]) -> bool:
    while pid in procs and pid > 1:
        pid = procs[pid]["ppid"]
        if pid == root:
            return True
    return False


def _live(procs: dict[int, dict]) -> dict[int, dict]:
    return {p: i for p, i in procs.items() if i["state"] not in ("Z", "X")}


def _engines(harness_pid: int, family: str) -> dict[int, str]:
    """The live vLLM engine processes ``harness_pid`` started for ``family``: pid -> request path.  An
    engine is found by its log (its stdout, ``<work>/subject.log``): a warm engine is forked from the
    server (harness.engines.warm), so its command line is the server's, not ``-m harness.engines.subject_vllm``."""
    procs = _live(_procs())
    out = {}
    for pid, info in procs.items():
        if not _descends(pid, harness_pid, procs):
            continue
        try:
            log = os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            continue
        if log.endswith("/subject.log") and f"/{family}-" in log and info["sid"] == pid:
            out[pid] = str(Path(log).with_name("subject_request.json"))
    return out


def _left_running(sessions: set[int], request_dir: str) -> list[str]:
    """Live processes of the engines' sessions (vLLM's workers too) or naming their work folder."""
    return [f"{p}: {i['cmd'][:200]}" for p, i in _live(_procs()).items()
            if i["sid"] in sessions or request_dir in i["cmd"]]


def _harness(report_dir: Path, models: str, *extra: str, env: dict[str, str] | None = None
             ) -> tuple[subprocess.Popen, Path]:
    log = report_dir.parent / f"{report_dir.name}.out"
    cmd = [sys.executable, "-m", "harness", "run", "--model", models, "--dtype", "float32", "--device", "cpu",
           "--report-dir", str(report_dir), *extra]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
    return proc, log


def _finish(proc: subprocess.Popen, timeout: float = 600) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our own harness run, started in its own session
        raise


def _report(report_dir: Path, family: str) -> dict:
    return json.loads((report_dir / family / "report.json").read_text())


# --- real engines through the command line ----------------------------------------------
def test_an_engine_killed_by_a_signal_is_that_models_error_and_the_run_goes_on(tmp_path):
    reports = tmp_path / "reports"
    proc, log = _harness(reports, "llama,qwen3")
    try:
        deadline = time.monotonic() + 300
        while not (engines := _engines(proc.pid, "llama")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        (pid, request), = engines.items()
        # a warm engine, forked from the server that imported vLLM once (harness.engines.warm): its crash
        # must cost that model only, as a cold engine's does
        assert "harness.engines.warm" in _procs()[pid]["cmd"], _procs()[pid]["cmd"]
        engine_log = Path(request).with_name("subject.log")
        booting = time.monotonic() + 15  # alive and booting: its log has begun (vLLM's first lines)
        while not (engine_log.exists() and engine_log.stat().st_size) and time.monotonic() < booting:
            time.sleep(0.2)
        assert pid in _engines(proc.pid, "llama"), "the engine ended before it could be killed"
        os.kill(pid, signal.SIGKILL)  # that process only
        rc = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert rc == 1, out  # a model error fails the run (harness.frontends.cli)
    killed = _report(reports, "llama")
    assert killed["summary"]["verdict"] == "error", out
    first = killed["error"].splitlines()[0]
    assert "vLLM engine process killed by SIGKILL (signal 9)" in first and str(engine_log) in first, first
    assert "killed by SIGKILL" in out  # said as it happens
    after = _report(reports, "qwen3")
    assert after["error"] is None and after["summary"]["verdict"] == "pass", out
    matrix = (reports / "support_matrix.md").read_text()
    assert "killed by SIGKILL (signal 9)" in matrix, matrix
    assert not _left_running({pid}, str(Path(request).parent)), "engine processes left running"
    shutil.rmtree(Path(request).parent)  # the failed engine's work folder, kept by the runner for its log


def test_an_engine_past_engine_timeout_is_killed_with_its_whole_process_group(tmp_path):
    reports = tmp_path / "reports"
    # the engine waits before its boot (harness.engines.subject_vllm.STALL_ENV): past the timeout on any machine
    # (a real llama engine's whole run took under 3 s once vLLM's rank counter was no longer compiled)
    proc, log = _harness(reports, "llama", "--engine-timeout", "3", env={"VLLM_PARITY_TEST_STALL_S": "60"})
    seen: dict[int, str] = {}
    try:
        while proc.poll() is None:  # every engine process of this run, for the check below
            seen.update(_engines(proc.pid, "llama"))
            time.sleep(0.1)
        rc = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert rc == 1, out
    assert seen, f"no engine process seen\n{out}"
    result = _report(reports, "llama")
    assert result["summary"]["verdict"] == "error" and not result["rows"], out
    assert "vLLM engine timed out after 3 s (--engine-timeout)" in result["error"].splitlines()[0], result["error"]
    assert "timed out after 3 s" in (reports / "support_matrix.md").read_text()
    request_dir = str(Path(next(iter(seen.values()))).parent)
    assert not _left_running(set(seen), request_dir), "engine processes left running"
    shutil.rmtree(request_dir)  # the failed engine's work folder, kept by the runner for its log


# --- the mechanics, on a stand-in engine (no vLLM) ---------------------------------------
STAND_IN = textwrap.dedent('''
    import json, os, signal, subprocess, sys, time
    req = json.load(open(sys.argv[1]))
    # a worker that ignores SIGTERM, as a stuck one would: only the group's SIGKILL ends it
    worker = subprocess.Popen([sys.executable, "-c",
                               "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
    open(req["pids"], "w").write(f"{os.getpid()} {worker.pid}")
    print("booting", flush=True)
    if req["die"]:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
''')


def _gone(pid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        info = _procs().get(pid)
        if info is None or info["state"] in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("die", [True, False], ids=["killed", "timeout"])
def test_the_engine_and_every_process_it_started_are_stopped(tmp_path, die):
    from harness.engines.subject import SubjectKilled, launch_subject

    (tmp_path / "stand_in_engine.py").write_text(STAND_IN)
    t0 = time.monotonic()
    with pytest.raises(SubjectKilled) as err:
        launch_subject("stand_in_engine", {"pids": str(tmp_path / "pids"), "die": die}, tmp_path, "subject",
                       {"PYTHONPATH": str(tmp_path)}, timeout_s=60 if die else 2)
    first = str(err.value).splitlines()[0]
    if die:
        assert first.startswith("vLLM engine process killed by SIGKILL (signal 9) -- stand_in_engine"), first
    else:
        assert first.startswith("vLLM engine timed out after 2 s (--engine-timeout)"), first
        assert time.monotonic() - t0 < 30
    assert "booting" in str(err.value)  # the log's tail, as for any engine failure
    engine, worker = map(int, (tmp_path / "pids").read_text().split())
    assert _gone(engine) and _gone(worker), "left running"


def test_engine_timeout_is_a_positive_number_of_seconds():
    from harness.frontends.options import add_to_argparse

    parser = argparse.ArgumentParser()
    add_to_argparse(parser)
    assert parser.parse_args([]).engine_timeout == 900
    assert parser.parse_args(["--engine-timeout", "2.5"]).engine_timeout == 2.5
    for bad in ("0", "-1", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--engine-timeout", bad])
