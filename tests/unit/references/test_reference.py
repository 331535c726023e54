"""harness.references.reference: the engine-free parts of the reference side.

Contracts checked (no TransformerBridge boot, no HF model load): default_pos_axis (token axis 1 for
[heads, query, key] values, else 0); round_weights rounds every parameter through a dtype in place
(buffers untouched; None is a no-op); _layer_groups splits names by decoder layer in layer order;
decoder_layers finds the ModuleList of num_hidden_layers or raises LookupError naming the model;
_nonfinite is NaN / +inf but not -inf (a legitimate mask); _floors: worst row / median / signed
scale over prompts, a NaN or +inf anywhere makes that hook's floor NaN and it stays NaN (never a
silent 0), shapes that differ are skipped, chaotic tokens' set-aside tokens are left out;
_Hooked converts truth values to hooked coordinates when read.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.comparison.chaos import ChaoticToken
from harness.references.reference import (ReferenceCapture, _floors, _Hooked, _hooked, _layer_groups, _nonfinite,
                                          decoder_layers, default_pos_axis, round_weights)

H = "blocks.0.hook_out"


def test_default_pos_axis():
    assert default_pos_axis("blocks.0.attn.hook_pattern") == 1
    assert default_pos_axis("blocks.3.attn.hook_attn_scores") == 1
    assert default_pos_axis("blocks.3.attn.hook_q") == 0
    assert default_pos_axis("unembed.hook_out") == 0


def test_round_weights_through_bf16_in_place_and_buffers_untouched():
    lin = torch.nn.Linear(3, 2).double()
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1 + 2 ** -12, 1.0, 1.0], [0.1, 0.2, 0.3]], dtype=torch.float64))
    lin.register_buffer("freq", torch.tensor([1 + 2 ** -12], dtype=torch.float64))
    out = round_weights(lin, torch.bfloat16)
    assert out is lin and lin.weight.dtype == torch.float64
    assert float(lin.weight.detach()[0, 0]) == 1.0  # 1 + 2^-12 is not representable in bf16
    assert torch.equal(lin.weight, lin.weight.to(torch.bfloat16).double())
    assert float(lin.freq[0]) == 1 + 2 ** -12


def test_round_weights_none_is_a_no_op():
    lin = torch.nn.Linear(2, 2).double()
    before = lin.weight.detach().clone()
    round_weights(lin, None)
    assert torch.equal(lin.weight, before)


def test_layer_groups():
    groups, other = _layer_groups({"blocks.10.hook_out", "blocks.2.hook_in", "blocks.2.attn.hook_q",
                                   "embed.hook_out", "ln_final.hook_normalized"})
    assert groups == [{"blocks.2.hook_in", "blocks.2.attn.hook_q"}, {"blocks.10.hook_out"}]
    assert other == {"embed.hook_out", "ln_final.hook_normalized"}


def test_decoder_layers():
    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleList([torch.nn.Linear(1, 1)])
            self.layers = torch.nn.ModuleList([torch.nn.Linear(1, 1) for _ in range(3)])

    toy = Toy()
    assert decoder_layers(toy, 3) is toy.layers
    with pytest.raises(LookupError, match="^no nn.ModuleList of 4 decoder layers in Toy$"):
        decoder_layers(toy, 4)
    with pytest.raises(LookupError):
        decoder_layers(torch.nn.Sequential(torch.nn.ModuleList()), 0)  # n_layers 0 never matches


def test_nonfinite_ignores_neg_inf():
    assert not _nonfinite(torch.tensor([0.0, -math.inf]))
    assert _nonfinite(torch.tensor([0.0, math.inf]))
    assert _nonfinite(torch.tensor([0.0, math.nan]))
    assert not _nonfinite(torch.tensor([1, 2]))


def _pair(t=4, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    truth = torch.randn(t, d, generator=g, dtype=torch.float64) + 3.0
    return truth


def test_floors_worst_median_and_scale_over_prompts():
    t0, t1 = _pair(seed=0), _pair(seed=1)
    run = {0: {H: t0 * 1.001}, 1: {H: t1 * 0.99}}
    worst, median, scale = _floors(run, {0: {H: t0}, 1: {H: t1}})
    assert worst[H] == pytest.approx(0.01, rel=1e-9)
    assert median[H] == pytest.approx(0.01, rel=1e-9)
    assert scale[H] == pytest.approx(-0.01, rel=1e-9)  # the largest by size, signed


def test_floors_nan_anywhere_is_nan_and_stays_nan():
    t0, t1 = _pair(seed=0), _pair(seed=1)
    bad = t0.clone()
    bad[1, 1] = math.nan
    worst, median, scale = _floors({0: {H: bad}, 1: {H: t1.clone()}}, {0: {H: t0}, 1: {H: t1}})
    assert math.isnan(worst[H]) and math.isnan(median[H]) and math.isnan(scale[H])
    inf_truth = t1.clone()
    inf_truth[0, 0] = math.inf
    worst, _, _ = _floors({0: {H: t0.clone()}, 1: {H: t1.clone()}}, {0: {H: t0}, 1: {H: inf_truth}})
    assert math.isnan(worst[H])


def test_floors_skip_missing_or_differently_shaped_captures():
    t0 = _pair()
    worst, _, _ = _floors({0: {H: t0, "other": t0}}, {0: {H: t0[:2]}})
    assert worst == {}


def test_floors_leave_out_a_chaotic_tokens_tokens():
    truth = _pair(6)
    run = truth.clone()
    run[3:] += 10.0  # far off only at and after token 3
    chaos = [ChaoticToken(prompt=0, layer=0, token=3, floor=0.5, ceiling=0.25)]
    worst, _, _ = _floors({0: {H: run}}, {0: {H: truth}}, chaos=chaos)
    assert worst[H] == 0.0
    worst, _, _ = _floors({0: {H: run}}, {0: {H: truth}})
    assert worst[H] > 1.0


def test_floors_logprob_k_compares_the_truths_top_k_only():
    truth = torch.log_softmax(torch.tensor([[4.0, 3, 2, 1, 0, -1]], dtype=torch.float64), -1)
    run = truth.clone()
    run[0, 5] += 1.0  # the tail entry differs only
    worst, _, _ = _floors({0: {"logprobs": run}}, {0: {"logprobs": truth}}, logprob_k=3)
    assert worst["logprobs"] == 0.0
    worst, _, _ = _floors({0: {"logprobs": run}}, {0: {"logprobs": truth}})
    assert worst["logprobs"] > 0.0


def test_hooked_converts_when_read():
    x = torch.tensor([[1.0, 2.0, 6.0]])
    view = _Hooked({H: x}, "LN")
    assert len(view) == 1 and list(view) == [H]
    assert view[H].dtype == torch.float64
    assert torch.equal(view[H], torch.tensor([[-2.0, -1.0, 3.0]], dtype=torch.float64))
    assert torch.equal(_Hooked({H: x}, "RMS")[H], x.double())
    views = _hooked({0: {H: x}}, {0: {}, 1: {}}, "LN")
    assert set(views) == {0, 1} and len(views[1]) == 0


def test_reference_capture_defaults_are_empty_and_not_shared():
    a, b = ReferenceCapture({}, {}, {}), ReferenceCapture({}, {}, {})
    assert (a.hf, a.floors, a.meta, a.floor_stats, a.compat_processed, a.chaos) == ({}, {}, {}, {}, {}, [])
    a.floors["bridge"] = {}
    assert b.floors == {}


def test_token_types_reach_the_forward_only_where_given():
    """An encoder's prompts carry token types (the ones vLLM is given); a causal LM's forward is unchanged."""
    from harness.references.reference import _inputs

    ids, extra = _inputs([5, 6, 7], None, "cpu")
    assert ids.tolist() == [[5, 6, 7]] and extra == {}
    ids, extra = _inputs([5, 6, 7], [0, 1, 1], "cpu")
    assert extra["token_type_ids"].tolist() == [[0, 1, 1]] and extra["token_type_ids"].shape == ids.shape


def test_plain_mask_turns_compatibility_modes_neg_inf_scores_into_the_plain_bridges_min():
    from harness.references.reference import _plain_mask

    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        scores = torch.tensor([[0.5, -math.inf], [1.5, -2.0]], dtype=dtype)
        out = _plain_mask("blocks.0.attn.hook_attn_scores", scores)
        assert out[0, 1] == torch.finfo(dtype).min and out.dtype == dtype
        assert torch.equal(out[:, 0], scores[:, 0]) and out[1, 1] == -2.0
        # every other hook is passed through untouched, -inf included
        assert _plain_mask("blocks.0.attn.hook_pattern", scores) is scores
        assert _plain_mask("blocks.0.hook_out", scores) is scores


def test_one_pass_reads_both_name_sets_into_their_own_stores(tmp_path):
    """The canonical names and compatibility mode's come from the same forwards, each into its own
    store; the canonical attention scores in the plain bridge's convention."""
    from harness.references.reference import _run_cache
    from harness.spill import SpilledTensors

    class Bridge:  # a stand-in with run_with_cache's contract: the pure splitting logic only
        calls = 0

        def run_with_cache(self, ids, names_filter, **_):
            Bridge.calls += 1
            cache = {"blocks.0.hook_out": torch.ones(1, 3, 2), "blocks.0.hook_resid_post": torch.ones(1, 3, 2),
                     "blocks.0.attn.hook_attn_scores": torch.tensor([[[[0.0, -math.inf, -math.inf]] * 3]])}
            return None, {n: v for n, v in cache.items() if names_filter(n)}

    canonical, legacy = SpilledTensors(tmp_path, "c"), SpilledTensors(tmp_path, "l")
    _run_cache(Bridge(), [1, 2, 3], {"blocks.0.hook_out", "blocks.0.attn.hook_attn_scores"}, "cpu", canonical,
               also=({"blocks.0.hook_resid_post"}, legacy))
    assert Bridge.calls == 1
    assert set(canonical) == {"blocks.0.hook_out", "blocks.0.attn.hook_attn_scores"}
    assert set(legacy) == {"blocks.0.hook_resid_post"}
    assert torch.isfinite(canonical["blocks.0.attn.hook_attn_scores"]).all()


def test_a_capture_stopped_before_any_shard_leaves_no_folder(tmp_path):
    """The spill folder is made first; a capture that fails before writing a shard (here: no checkpoint, so the
    first boot fails) removes it instead of leaving an empty ``vp-refs-*`` behind."""
    from harness.comparison.tolerances import CALIBRATION
    from harness.references.reference import capture_references

    spill_root = tmp_path / "spill"
    spill_root.mkdir()
    with pytest.raises(OSError):  # transformers: no config.json in that folder
        capture_references(tmp_path / "no-checkpoint", dtype="float32", calibration=CALIBRATION["float32"],
                           prompts=[[1, 2]], hooks=["blocks.0.hook_out"], compat_names=[], calibrate=False,
                           spill_root=spill_root)
    assert list(spill_root.iterdir()) == []
