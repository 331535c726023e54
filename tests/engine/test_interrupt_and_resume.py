"""Never lose a result: an interrupted run keeps every finished model's report and marks the
unfinished one ``error`` with the reason; ``--resume`` then reruns only what is not current.
Real engines through the command line (two tiny families, fp32)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.parity
from harness.paths import REPO_ROOT as REPO


def _second_models_engine_started(before: set[Path], timeout_s: float = 300) -> bool:
    """Whether qwen3's engine work folder (harness.paths.RUNS_ROOT, made as its subject starts) appeared:
    the interrupt then lands inside its run, however fast the machine (a fixed sleep once let the whole
    second run finish first, on a fast enough machine)."""
    from harness.paths import RUNS_ROOT

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if set(RUNS_ROOT.glob("qwen3-*")) - before:
            return True
        time.sleep(0.05)
    return False


def _run(report_dir: Path, *extra: str, interrupt_after_first: bool = False) -> tuple[int, str]:
    from harness.paths import RUNS_ROOT

    cmd = [sys.executable, "-m", "harness", "run", "--model", "llama,qwen3", "--dtype", "float32",
           "--report-dir", str(report_dir), *extra]
    before = set(RUNS_ROOT.glob("qwen3-*"))
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out = []
    for line in proc.stdout:
        out.append(line)
        if interrupt_after_first and line.startswith("   ") and "rows pass" in line:
            assert _second_models_engine_started(before), "qwen3's engine never started"
            os.killpg(proc.pid, signal.SIGINT)
            interrupt_after_first = False
    return proc.wait(timeout=900), "".join(out)


def test_an_interrupted_run_keeps_finished_results_and_resume_reruns_the_rest(tmp_path):
    rc, out = _run(tmp_path, interrupt_after_first=True)
    assert rc == 130, (rc, out[-1500:])
    first = json.loads((tmp_path / "llama" / "report.json").read_text())
    assert first["error"] is None and first["summary"]["verdict"] == "pass" and first["fingerprint"]
    second = json.loads((tmp_path / "qwen3" / "report.json").read_text())
    assert second["summary"]["verdict"] == "error" and "interrupted (SIGINT)" in second["error"]
    assert "interrupted" in (tmp_path / "support_matrix.md").read_text()

    rc, out = _run(tmp_path, "--resume")
    assert rc == 0, out
    assert "llama (subject vllm, cpu, float32, eager): current, resumed" in out
    assert "== qwen3" in out and json.loads((tmp_path / "qwen3" / "report.json").read_text())["error"] is None
