"""Time per phase and peak memory: the helper (harness.phases) and the report that renders them."""
from __future__ import annotations

import json
import time

import pytest

from harness.phases import Phases, peak_memory
from harness.reporting.markdown import phases_markdown, to_markdown
from harness.reporting.report import write_report


def test_phases_keep_start_order_nest_and_accumulate():
    phases = Phases()
    with phases("plan"):
        pass
    with phases("references"):
        refs = phases.child("references")
        with refs("bridge_boot"):
            time.sleep(0.01)
        with refs("hf"):
            pass
    with phases("plan"):  # a name timed twice accumulates
        time.sleep(0.01)
    phases.child("subject").add("engine_boot", 12.5)
    phases.add("not_measured", None)  # left out, never recorded as 0
    assert list(phases.seconds) == ["plan", "references", "references.bridge_boot", "references.hf",
                                    "subject.engine_boot"]
    assert phases.seconds["plan"] >= 0.01 and phases.seconds["subject.engine_boot"] == 12.5
    assert phases.seconds["references"] >= phases.seconds["references.bridge_boot"] >= 0.01
    assert refs.own() == {"bridge_boot": phases.seconds["references.bridge_boot"],
                          "hf": phases.seconds["references.hf"]}


def test_a_phase_that_raises_still_records_its_time():
    phases = Phases()
    with pytest.raises(RuntimeError), phases("subject"):
        time.sleep(0.01)
        raise RuntimeError("engine died")
    assert phases.seconds["subject"] >= 0.01


def test_peak_memory_reads_this_process_and_its_children():
    peak = peak_memory()
    assert peak["rss_self_mib"] > 10  # a Python process with torch imported holds far more than 10 MiB
    assert peak["rss_children_mib"] >= 0
    assert set(peak) == {"rss_self_mib", "rss_children_mib", "gpu_allocated_mib", "gpu_reserved_mib"}


def _result(phases: dict) -> dict:
    row = dict(model="m", reference="bridge", hook="blocks.0.hook_out", reference_hook="blocks.0.hook_out",
               layer=0, kind="hook_out", status="pass", tolerance=1e-4, rel_err=1e-6, max_abs=1e-6, ref_scale=1.0,
               cos_min=1.0, worst={"prompt": 0, "index": [1, 2]}, message="")
    return dict(model="m", architecture="LlamaForCausalLM", overlay="DecoderOnlyOverlay", source="synthetic",
                checkpoint="/x", dtype="float32", seed=0, device="cpu", rows=[row], nonfiring=[],
                timings={"vllm": {"boot_s": 4.0, "forward_ms_median": 2.0},
                         "hf": {"forward_ms_median": 1.0, "bridge_boot_s": 1.5},
                         "phases": phases,
                         "peak_memory": {"rss_self_mib": 2048.0, "rss_children_mib": 3072.0,
                                         "gpu_allocated_mib": None, "gpu_reserved_mib": None}},
                versions={}, prompts=[[1, 2, 3]], error=None, wall_s=40.0)


PHASES = {"setup": 0.1, "plan": 0.4, "subject": 20.0, "subject.engine_boot": 12.0, "references": 15.0,
          "references.bridge_boot": 1.5, "references.truth_bridge": 6.0, "compare": 4.0}


def test_phases_render_as_a_table_with_shares_and_peak_memory():
    lines = phases_markdown(PHASES, 40.0, _result(PHASES)["timings"]["peak_memory"])
    text = "\n".join(lines)
    assert lines[0].startswith("| phase | seconds | share of the run |")
    assert "| subject | 20.00 | 50 % |" in text
    assert "└ engine_boot | 12.00 | 30 % | the engine's boot, timed in its own process |" in text
    assert "└ truth_bridge | 6.00 |" in text and "| **run (wall)** | 40.00 | 100 % |" in text
    assert "this process 2048 MiB RSS" in text and "3072 MiB" in text and "GPU: none used" in text
    assert phases_markdown({}, 40.0) == []  # an old report without phases renders as before


def test_a_written_report_holds_every_phase_and_its_own(tmp_path):
    result = _result(dict(PHASES))
    path = write_report(result, tmp_path)
    saved = json.loads(path.read_text())
    phases = saved["timings"]["phases"]
    assert list(phases)[:-1] == list(PHASES) and list(phases)[-1] == "report" and phases["report"] > 0
    assert saved["timings"]["vllm"]["boot_s"] == 4.0  # the existing keys stay
    assert "report" not in result["timings"]["phases"]  # the caller's dict is left as it was
    md = (tmp_path / "m" / "report.md").read_text()
    assert "## Timings" in md and "| phase | seconds |" in md and "| report |" in md and "after the run" in md
    assert md.index("| phase |") < md.index("| engine | forward latency")


def test_a_failed_run_renders_its_phases_without_engine_rows():
    result = _result({"setup": 0.1, "plan": 0.2, "subject": 3.0})
    result["timings"] = {"phases": result["timings"]["phases"]}
    result["error"] = "SubjectError: engine died"
    md = to_markdown(result)
    assert "| subject | 3.00 |" in md and "| engine | forward latency" not in md


def test_memory_sampler_files_samples_under_the_open_phase():
    from harness.memory import MemorySampler

    phases = Phases()
    with MemorySampler(phases, interval_s=0.01) as mem:
        with phases("outer"):
            with phases.child("outer")("inner"):
                block = bytearray(64 << 20)  # 64 MiB, touched
                mem.sample()
            del block
    summary = mem.summary()
    assert phases.open == []
    assert summary["by_phase"]["outer.inner"] >= 64 and summary["rss_peak_mib"] >= summary["by_phase"]["outer.inner"]
    assert summary["rss_self_peak_mib"] <= summary["rss_peak_mib"] and summary["samples"] >= 3


def test_sampled_memory_adds_a_column_and_a_line():
    memory = {"by_phase": {"subject": 3300.0, "references": 1900.0}, "rss_peak_mib": 3300.0,
              "rss_self_peak_mib": 2600.0, "rss_engines_peak_mib": 2850.0, "interval_s": 0.05}
    lines = phases_markdown(PHASES, 40.0, None, memory)
    assert "peak RSS, MiB" in lines[0]
    assert any(line.startswith("| subject |") and "| 3300 |" in line for line in lines)
    assert any("this process 2600 MiB, the vLLM engine processes 2850 MiB, both together 3300 MiB" in line
               for line in lines)
