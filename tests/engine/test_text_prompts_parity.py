"""``--prompts FILE`` end to end: the real SmolLM2 checkpoint runs a text file through the command
line (real engines, fp32), the report passes and shows the texts.  Three of its lines tokenize to
the same length and two are the same line: each is compared whole, the ragged batch included
(requests are matched to prompts by request id, never by length).  Layers 0 and 29 only (``--layers``,
a selective run: report-selection.*): the prompts' path is what is tested here, end to end, while every
layer of SmolLM2 is compared on the default prompts by the parity suite (43 s -> 23 s alone)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.parity
from harness.paths import REPO_ROOT as REPO


def test_smollm2_on_a_prompts_file_with_equal_lengths_and_a_duplicate(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nWater boils at one hundred degrees Celsius at sea level.\n"
                       "The cat sat on the mat.\nThe dog sat on the rug.\nThe cat sat on the mat.\n")
    p = subprocess.run([sys.executable, "-m", "harness", "run", "--model", "smollm2", "--dtype", "float32",
                        "--prompts", str(prompts), "--layers", "0,29", "--report-dir", str(tmp_path / "reports")],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((tmp_path / "reports" / "smollm2" / "report-selection.json").read_text())
    assert report["summary"]["verdict"] == "pass", report["summary"]
    assert report["prompt_names"] == ["p1", "p2", "p3", "p4", "p5"]
    # <|im_start|> (SmolLM2's BOS) + the words' tokens; nothing trimmed, no note
    assert [len(x) for x in report["prompts"]] == [6, 12, 8, 8, 8]
    assert report["prompts"][2] == report["prompts"][4] and not report["prompt_info"]["notes"]
    ragged = [r for r in report["rows"] if r["reference"] == "bridge-ragged"]
    assert {h.split(".")[1] for h in report["selected_hooks"] if h.startswith("blocks.")} == {"0", "29"}
    assert ragged and all(r["status"] == "pass" for r in ragged), [r["message"] for r in ragged if r["status"] != "pass"][:3]
    assert report["prompt_info"]["texts"][0] == "The capital of France is"
    md = (tmp_path / "reports" / "smollm2" / "report-selection.md").read_text()
    assert f"--prompts {prompts}" in md
    assert "| p1 | 6 | `The capital of France is` |" in md
    assert "| p2 | 12 | `Water boils at one hundred degrees Celsius at sea level.` |" in md
    assert "| p4 | 8 | `The dog sat on the rug.` |" in md and "| p5 | 8 | `The cat sat on the mat.` |" in md
    assert ", at p" in md and " token " in md  # the worst row's position, in its text
