"""The subjects' registry (harness.engines.subjects): every row resolves, and what the harness derives from it."""
from __future__ import annotations

import pytest

from harness.engines.subjects import DEFAULT, PEERS, SUBJECTS, Subject, kill_switches


@pytest.mark.parametrize("name", sorted(SUBJECTS))
def test_every_row_names_functions_that_exist(name):
    row = SUBJECTS[name]
    assert row.name == name and row.doc and "\n" not in row.doc
    assert callable(row.capture_fn())
    assert (row.plan is None) == (row.plan_fn() is None) and (row.request is None) == (row.request_fn() is None)
    assert (row.plan is None) == (row.overlay_name is None)  # the overlay's plan, the overlay's name
    assert not row.peer or row.kill_switch or row.refusal_probe  # a refused peer loads no plugin to switch off
    assert (row.refusal_probe is None) == (row.refusal_probe_fn() is None)


def test_the_default_and_the_peers():
    assert DEFAULT in SUBJECTS and SUBJECTS[DEFAULT].plan is None and SUBJECTS[DEFAULT].any_executor
    assert PEERS == ("vllm-lens", "nnsight")
    assert kill_switches("vllm-lens") == {} and kill_switches("vllm") == {"VLLM_LENS_DISABLE": "1"}


def test_refusals_sharing_a_reason_are_one_error_naming_their_options():
    row = Subject("x", "a subject", "m.f", no_serving="one prompt", no_tp="one device", no_v2="one prompt")
    assert row.refusals("single", 1, True, "auto") == []
    assert row.refusals("decode", 2, False, "v1") == ["--subject x with --serving decode / --runner v1: one prompt",
                                                      "--subject x --tp 2: one device"]
    assert row.refusals("single", 1, False, "v2") == ["--subject x with --serving single / --runner v2: one prompt"]
