"""``--shard I/N`` (harness.frontends.shard), merged matrices and the JUnit summary: what CI's
shard matrix relies on.  No engine boots here."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.frontends.shard import COST, Shard, assign, cost, parse_shard
from harness.models.families import DEFAULT_FAMILIES

from harness.paths import REPO_ROOT as REPO


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_every_family_lands_in_exactly_one_shard(n):
    names = list(DEFAULT_FAMILIES)
    shards = [Shard(i, n).select(names, name=str) for i in range(1, n + 1)]
    flat = [f for s in shards for f in s]
    assert sorted(flat) == sorted(names) and len(flat) == len(set(flat))
    for s in shards:  # each shard keeps the selection's own order
        assert s == [f for f in names if f in s]


def test_the_assignment_is_a_function_of_the_selection_not_its_order():
    names = list(DEFAULT_FAMILIES)
    assert dict(zip(names, assign(names, 3))) == dict(zip(names[::-1], assign(names[::-1], 3)))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_shards_are_cost_balanced_with_the_expensive_family_alone_enough(n):
    names = list(DEFAULT_FAMILIES)
    owners = dict(zip(names, assign(names, n)))
    loads = [sum(cost(f) for f in names if owners[f] == s) for s in range(1, n + 1)]
    # greedy longest-first: no shard carries more than the ideal share plus one target's cost
    assert max(loads) <= sum(loads) / n + max(cost(f) for f in names)
    heavy = owners[max(names, key=cost)]
    assert sum(owners[f] == heavy for f in names) < len(names) / n  # fewer families beside the costliest
    assert cost("smollm2") == COST["smollm2"] > cost("qwen3") == 1.0


def test_more_shards_than_families_leaves_some_empty():
    assert [Shard(i, 4).select(["a", "b"], name=str) for i in range(1, 5)] == [["a"], ["b"], [], []]


@pytest.mark.parametrize(("spec", "expected"), [("1/1", Shard(1, 1)), ("2/3", Shard(2, 3)), (" 3 / 3 ", Shard(3, 3))])
def test_good_shard_specs(spec, expected):
    assert parse_shard(spec) == expected and str(expected) == f"{expected.index}/{expected.count}"


@pytest.mark.parametrize("spec", ["3/2", "0/3", "x", "1/0", "1", "1/2/3", "-1/2", "a/b"])
def test_bad_shard_specs_name_the_option_and_the_fix(spec):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse_shard(spec)
    assert "--shard" in str(err.value) and "I/N" in str(err.value) and "e.g. --shard 1/3" in str(err.value)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_cli_and_pytest_refuse_a_bad_shard_at_once():
    cli = _run("-m", "harness", "run", "--shard", "3/2")
    assert cli.returncode == 2 and "--shard" in cli.stderr and "1 <= I <= N" in cli.stderr
    pt = _run("-m", "pytest", "parity_tests", "--collect-only", "-q", "--shard", "x")
    assert pt.returncode != 0 and "--shard 'x' is not of the form I/N" in pt.stderr


def test_pytest_collects_only_this_shards_families():
    collected = {}
    for i in (1, 2):
        p = _run("-m", "pytest", "parity_tests", "--collect-only", "-q", "--model", "qwen3,llama,gemma",
                 "--shard", f"{i}/2")
        assert p.returncode == 0, p.stderr
        ids = [line for line in p.stdout.splitlines() if "test_parity[" in line]
        collected[i] = {line.split("test_parity[")[1].split("-")[0] for line in ids}
    assert collected[1] | collected[2] == {"qwen3", "llama", "gemma"} and not collected[1] & collected[2]


def test_an_empty_shard_skips_saying_why():
    p = _run("-m", "pytest", "parity_tests", "--collect-only", "-q", "--model", "qwen3", "--shard", "2/2")
    assert p.returncode == 0, p.stderr
    assert "test_parity[none]" in p.stdout


def _report(folder: Path, model: str, dtype: str = "float32", status: str = "pass") -> None:
    from harness.reporting.report import write_report

    row = dict(model=model, reference="bridge", hook="blocks.0.hook_out", reference_hook="blocks.0.hook_out",
               layer=0, kind="hook_out", status=status, tolerance=1e-4, rel_err=1e-6 if status == "pass" else 0.3,
               max_abs=1e-6, ref_scale=1.0, cos_min=1.0, worst={"prompt": 0, "index": [1, 2]}, message="")
    write_report(dict(model=model, architecture="LlamaForCausalLM", overlay="DecoderOnlyOverlay", source="synthetic",
                      checkpoint="/x", dtype=dtype, seed=0, device="cpu", rows=[row], nonfiring=[], timings={},
                      versions={"vllm": "0.32.0"}, prompts=[[1, 2, 3]], error=None, wall_s=1.0), folder)


def test_matrix_merges_the_shards_folders(tmp_path):
    from harness.reporting.matrix import build_matrix

    a, b, out = tmp_path / "shard-1", tmp_path / "shard-2", tmp_path / "merged"
    _report(a, "qwen3")
    _report(a, "llama", dtype="bfloat16")
    _report(b, "gemma", status="fail")
    p = _run("-m", "harness", "matrix", "--report-dir", str(a), "--report-dir", str(b), "--out", str(out))
    assert p.returncode == 0, p.stderr
    rows = json.loads((out / "support_matrix.json").read_text())
    assert {(r["model"], r["variant"], r["verdict"]) for r in rows} == {
        ("qwen3", "cpu-float32", "pass"), ("llama", "cpu-bfloat16", "pass"), ("gemma", "cpu-float32", "fail")}
    for r in rows:  # each row's report path resolves from the merged matrix's folder
        assert (out / r["report"]).is_file()
    md = (out / "support_matrix.md").read_text()
    assert "Merged from `../shard-1`, `../shard-2`" in md and (out / "support_matrix.html").is_file()
    assert build_matrix(a) == build_matrix([a])  # one folder: what it always was


def test_a_later_folder_replaces_an_earlier_report_and_says_so(tmp_path):
    from harness.reporting.matrix import write_matrix

    first, rerun = tmp_path / "first", tmp_path / "rerun"
    _report(first, "qwen3", status="fail")
    _report(rerun, "qwen3")
    md, rows = write_matrix([first, rerun], tmp_path / "out")
    assert [(r["model"], r["verdict"]) for r in rows] == [("qwen3", "pass")]
    assert "1 report(s) replaced by a later folder's report" in md.read_text()
    assert "../first/qwen3/report.json" in md.read_text()


def test_a_merge_with_a_missing_folder_fails_naming_it(tmp_path):
    _report(tmp_path / "shard-1", "qwen3")
    p = _run("-m", "harness", "matrix", "--report-dir", str(tmp_path / "shard-1"),
             "--report-dir", str(tmp_path / "never-arrived"), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "never-arrived" in p.stderr and not (tmp_path / "out").exists()


def test_junit_summary_counts_and_lists_failures(tmp_path):
    from harness.reporting.junit import to_markdown

    xml = tmp_path / "parity-1.xml"
    xml.write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="4" time="12.5">'
        '<testcase classname="parity_tests.test_parity" name="test_parity[qwen3-bridge-blocks.0.hook_out]"/>'
        '<testcase classname="parity_tests.test_parity" name="test_parity[qwen3-hf-logprobs]">'
        '<failure message="qwen3: blocks.0 rel err 0.3 | above 1e-4">trace</failure></testcase>'
        '<testcase classname="parity_tests.test_parity" name="test_nonfiring[x]"><skipped message="s"/></testcase>'
        '<testcase classname="tests.test_cli" name="test_y"><error message="boom"/></testcase>'
        "</testsuite></testsuites>")
    md = to_markdown([xml, tmp_path / "absent.xml"])
    assert "| `parity-1.xml` | 4 | 1 | 1 | 1 | 1 | 12 |" in md
    assert "parity_tests/test_parity.py::test_parity[qwen3-hf-logprobs]" in md and "rel err 0.3 / above" in md
    assert "tests/test_cli.py::test_y" in md and "boom" in md
    assert "absent.xml" in md and "unreadable" in md
