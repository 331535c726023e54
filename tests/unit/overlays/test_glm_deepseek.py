"""GLM / GLM-4 / GLM-4-MoE and DeepSeek-V2/V3 rows: what the new tree kinds make of their configs (no engine).

New kinds: post-sublayer norms on the Llama tree (GLM-4), dense-then-sparse layers (``Tree.dense_layers``),
shared experts (``Mlp.shared``), multi-head latent attention (``MLA``) with the ``DeInterleave`` conversion.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from harness.comparison.conversions import apply_one, convert
from harness.models.families import DEFAULT_FAMILIES, FAMILIES, HELD_OUT, resolve_families
from overlays import OVERLAYS, get_overlay
from overlays.base import Cols, DeInterleave, Heads, HookSpec, SwapAxes, UnfoldNorm, expand_layers


def _cfg(family):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[family]).hf_config


def _specs(family):
    from harness.models.targets import target_for_family

    target = target_for_family(FAMILIES[family])
    return get_overlay(target.architecture).hook_specs(target.hf_config)


def _nonfiring(ov, cfg):
    return {h for nf in ov.nonfiring_for(cfg) for h in expand_layers(nf.template, cfg.num_hidden_layers)}


# -- DeInterleave ----------------------------------------------------------------------------------------
def test_deinterleave_moves_pairs_into_halves_inside_its_range_only():
    x = torch.arange(10.0).view(1, 10)  # [nope 0..3 | rope 4..9]
    assert apply_one(DeInterleave(4, 10), x, {}).tolist() == [[0, 1, 2, 3, 4, 6, 8, 5, 7, 9]]
    assert apply_one(DeInterleave(0, 4), x, {}).tolist() == [[0, 2, 1, 3, 4, 5, 6, 7, 8, 9]]


def test_deinterleave_of_a_gptj_rotation_is_the_halves_rotation_hf_deepseek_v3_applies():
    """vLLM rotates adjacent pairs in place; HF's V3 (rope_interleave) de-interleaves, then rotates halves."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    gen = torch.Generator().manual_seed(0)
    T, H, R = 6, 2, 8
    q = torch.randn(1, H, T, R, generator=gen)
    inv = 1.0 / (10000 ** (torch.arange(0, R, 2).float() / R))
    f = torch.arange(T)[:, None].float() * inv
    cos, sin = torch.cat([f, f], -1).cos()[None], torch.cat([f, f], -1).sin()[None]
    hf_q, _ = apply_rotary_pos_emb_interleave(q, q[:, :1], cos, sin)
    x1, x2 = q[..., 0::2], q[..., 1::2]
    gptj = torch.stack([x1 * f.cos() - x2 * f.sin(), x2 * f.cos() + x1 * f.sin()], -1).flatten(-2)
    assert torch.allclose(apply_one(DeInterleave(0, R), gptj, {}), hf_q, atol=1e-6)
    assert not torch.allclose(gptj, hf_q, atol=1e-2)  # without the conversion the layouts differ


def test_deinterleave_refuses_odd_or_empty_ranges_and_short_tensors():
    with pytest.raises(ValueError, match="even"):
        DeInterleave(0, 3)
    with pytest.raises(ValueError, match="even"):
        DeInterleave(4, 4)
    with pytest.raises(ValueError, match="past the last dim"):
        convert(HookSpec("m", convert=(DeInterleave(0, 8),)), torch.zeros(2, 4), {})


# -- GLM ---------------------------------------------------------------------------------------------------
def test_glm4_is_the_decoder_row_plus_post_sublayer_norms():
    cfg = _cfg("glm4")
    specs = get_overlay("Glm4ForCausalLM").hook_specs(cfg)
    llama_like = OVERLAYS["LlamaForCausalLM"].hook_specs(cfg)
    post = {f"blocks.{i}.{k}" for i in range(3) for k in ("ln1_post.hook_normalized", "ln1_post.hook_out",
                                                          "ln2_post.hook_normalized", "ln2_post.hook_out")}
    assert set(specs) - set(llama_like) == post and set(llama_like) <= set(specs)
    n = specs["blocks.1.ln1_post.hook_normalized"]
    assert n.module == "model.layers.1.post_self_attn_layernorm" and n.read == "out"
    assert n.convert == (UnfoldNorm("model.layers.1.post_self_attn_layernorm.weight"),)
    # the legacy hook_mlp_out is what joins the stream: the post-MLP norm's output, not mlp.hook_out
    assert specs["blocks.1.ln2_post.hook_out"].reference_name("compat", None) == "blocks.1.hook_mlp_out"
    assert specs["blocks.1.mlp.hook_out"].reference_name("compat", "x") is None


def test_glm_has_a_native_and_a_transformers_backend_overlay():
    from overlays import VARIANTS
    from overlays.base import DropBatch

    cfg = _cfg("glm")
    native, hf = VARIANTS["GlmForCausalLM"]["native"], VARIANTS["GlmForCausalLM"]["transformers"]
    assert list(native.hook_specs(cfg)) == list(OVERLAYS["LlamaForCausalLM"].hook_specs(cfg))
    hs = hf.hook_specs(cfg)
    assert all(isinstance(s.convert[0], DropBatch) for h, s in hs.items() if h != "unembed.hook_out")
    assert hs["blocks.1.hook_out"].read == "out" and hs["blocks.1.ln1.hook_normalized"].read == "out"
    assert {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_pattern"} <= _nonfiring(hf, cfg)


def test_glm4_moe_runs_a_dense_mlp_below_first_k_dense_replace_and_moe_above():
    cfg = _cfg("glm4_moe")
    assert cfg.first_k_dense_replace == 1
    ov = get_overlay("Glm4MoeForCausalLM")
    specs, nonfiring = ov.hook_specs(cfg), _nonfiring(ov, cfg)
    assert specs["blocks.0.mlp.hook_pre"] == HookSpec("model.layers.0.mlp.gate_up_proj", "out[0]", (Cols(0, 256),), 256)
    assert "blocks.0.mlp.gate.hook_out" not in specs
    for i in (1, 2):
        assert specs[f"blocks.{i}.mlp.gate.hook_out"].module == f"model.layers.{i}.mlp.gate"
        assert specs[f"blocks.{i}.mlp.gate.hook_out"].width == 8  # n_routed_experts
        assert f"blocks.{i}.mlp.hook_pre" not in specs and f"blocks.{i}.mlp.hook_pre" in nonfiring
    # the MoE kind's non-firing hooks are the sparse layers' only: layer 0 offers its dense hooks
    assert not {h for h in nonfiring if h.startswith("blocks.0.mlp.")}
    assert not set(specs) & nonfiring
    # TransformerLens's glm4_moe adapter names no shared-expert hook: none is offered
    assert not any("shared_experts" in h for h in specs)
    assert specs["blocks.1.attn.q_norm.hook_normalized"].convert[-1] == SwapAxes(0, 1)


def test_dense_layers_is_only_for_a_moe_row():
    from overlays.decoder_only import DECODER

    with pytest.raises(ValueError, match="dense_layers"):
        replace(DECODER, name="x", dense_layers="first_k_dense_replace")


def test_existing_moe_rows_stay_sparse_on_every_layer():
    cfg = _cfg("qwen3_moe")
    ov = OVERLAYS["Qwen3MoeForCausalLM"]
    assert ov.tree.dense_layers is None
    assert all(f"blocks.{i}.mlp.gate.hook_out" in ov.hook_specs(cfg) for i in range(3))
    # the MoE kind's non-firing hooks are listed per sparse layer (Tree.dense_listed / sparse_step pick per layer)
    assert all(f"blocks.{i}.mlp.hook_pre" in {nf.template for nf in ov.nonfiring_for(cfg)} for i in range(3))


@pytest.mark.parametrize("arch, family", [("Qwen3MoeForCausalLM", "qwen3_moe"), ("Qwen2MoeForCausalLM", "qwen2_moe"),
                                          ("Qwen3NextForCausalLM", "qwen3_next")])
def test_qwen_moe_dense_layers_follow_mlp_only_layers_and_the_sparse_step(arch, family):
    """HF's and vLLM's rule: layer i runs the MoE block unless mlp_only_layers lists it or (i + 1) is not a multiple of
    decoder_sparse_step; a dense layer offers the gated MLP's hooks and lists no MoE hook non-firing."""
    ov = OVERLAYS[arch]
    cfg = copy.deepcopy(_cfg(family))  # the target's config may be shared
    cfg.num_hidden_layers, cfg.mlp_only_layers, cfg.decoder_sparse_step = 4, [1], 2
    if hasattr(cfg, "layer_types"):
        cfg.layer_types = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    specs = ov.hook_specs(cfg)
    nonfiring = {nf.template for nf in ov.nonfiring_for(cfg)}
    for i in (0, 1, 2):
        assert f"blocks.{i}.mlp.gate.hook_out" not in specs and f"blocks.{i}.mlp.hook_pre" in specs
        assert f"blocks.{i}.mlp.hook_pre" not in nonfiring and specs[f"blocks.{i}.mlp.hook_pre"].module.endswith(
            f"layers.{i}.mlp.gate_up_proj")
    assert "blocks.3.mlp.gate.hook_out" in specs and "blocks.3.mlp.hook_pre" in nonfiring


# -- DeepSeek ------------------------------------------------------------------------------------------------
def test_deepseek_v3_mla_reads_and_conversions():
    cfg = _cfg("deepseek_v3")
    assert (cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (512, 64)  # vLLM's CPU MLA decode kernel: 576 only
    ov = get_overlay("DeepseekV3ForCausalLM")
    specs, nonfiring = ov.hook_specs(cfg), _nonfiring(ov, cfg)
    A = "model.layers.1.self_attn"
    assert specs["blocks.1.attn.hook_q_latent"] == HookSpec(f"{A}.q_a_layernorm", "out", (), 64)
    assert specs["blocks.1.attn.hook_kv_latent"] == HookSpec(f"{A}.kv_a_layernorm", "out", (), 512)
    assert specs["blocks.1.attn.kv_a_layernorm.hook_normalized"].convert == (
        UnfoldNorm(f"{A}.kv_a_layernorm.weight"),)
    assert specs["blocks.1.attn.hook_rot_q"] == HookSpec(f"{A}.rotary_emb", "out[0]", (DeInterleave(0, 64),), 256)
    assert specs["blocks.1.attn.hook_rot_k"] == HookSpec(f"{A}.rotary_emb", "out[1]", (DeInterleave(0, 64),), 64)
    assert specs["blocks.1.attn.hook_q"] == HookSpec(f"{A}.mla_attn.mla_attn", "in[0]",
                                                     (DeInterleave(64, 128), SwapAxes(0, 1)), 512)
    # kv_b_proj's per-head [k_nope 64 | v 32]; v_head_dim 32 != qk_rope_head_dim 64, as in the released models
    assert specs["blocks.1.attn.hook_v"] == HookSpec(f"{A}.kv_b_proj", "out[0]",
                                                     (Heads(4, 96), Cols(64, 96), SwapAxes(0, 1)), 128)
    assert specs["blocks.1.attn.hook_z"].convert == (Heads(4, 32),)
    assert {"blocks.1.attn.hook_k", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_attn_scores"} <= nonfiring
    assert not ov.derived_specs(cfg)
    # dense layer 0, then MoE with shared experts (TL's shared_experts bridge names them)
    assert "blocks.0.mlp.hook_pre" in specs and "blocks.0.mlp.shared_experts.hook_out" not in specs
    assert specs["blocks.1.mlp.shared_experts.hook_out"] == HookSpec("model.layers.1.mlp.shared_experts", "out", (), 128)
    assert specs["blocks.1.mlp.shared_experts.hook_pre"].convert == (Cols(0, 64),)
    assert not set(specs) & nonfiring
    # a converted q / v value is heads-first, so its token axis is 1
    raw = torch.randn(5, 4, 128)
    assert convert(specs["blocks.1.attn.hook_q"], raw, {}).shape == (4, 5, 128)


def test_deepseek_v2_keeps_vllms_pair_order_and_v2_lite_has_no_q_latent():
    v2, lite = _cfg("deepseek_v2"), _cfg("deepseek_v2_lite")
    ov = get_overlay("DeepseekV2ForCausalLM")
    s2, sl = ov.hook_specs(v2), ov.hook_specs(lite)
    assert s2["blocks.1.attn.hook_rot_q"].convert == () and s2["blocks.1.attn.hook_q"].convert == (SwapAxes(0, 1),)
    assert "blocks.1.attn.hook_q_latent" in s2 and lite.q_lora_rank is None
    assert "blocks.1.attn.hook_q_latent" not in sl and "blocks.1.attn.q_a_layernorm.hook_normalized" not in sl
    assert "blocks.1.attn.hook_kv_latent" in sl


def test_every_deepseek_row_runs_by_default():
    """No DeepSeek row is held out: the one vLLM's CPU rotary bug touches (deepseek_v3_default_rope) runs by
    default as a declared known vLLM bug, a named ❌ whose signature each run re-checks."""
    deepseek = {n for n, s in FAMILIES.items() if s.model_type.startswith("deepseek")}
    # deepseek_v4: a declared refusal on every device (harness/models/families.py), no DeepSeek-V2/V3 row
    assert deepseek == {"kimi_k2", "deepseek_v3", "deepseek_v2", "deepseek_v2_lite", "deepseek_v3_default_rope",
                        "deepseek_v4"}
    assert not deepseek & set(HELD_OUT) and deepseek | {"glm", "glm4", "glm4_moe"} <= set(DEFAULT_FAMILIES)
    assert not set(HELD_OUT) & set(DEFAULT_FAMILIES)
    assert [s.name for s in resolve_families("deepseek_v3,glm4_moe")] == ["deepseek_v3", "glm4_moe"]
    for name, why in HELD_OUT.items():
        assert len(why) > 40, name  # a reason, with the measurement behind it
    assert FAMILIES["deepseek_v3_default_rope"].known_vllm_bug is not None
    for name in deepseek:
        # vLLM accepts float16 for DeepSeek (it rescales the residual instead): not a refusal to declare
        assert "float16" not in FAMILIES[name].unsupported_dtypes


def test_the_score_correction_bias_buffer_is_randomized(tmp_path):
    from harness.models.checkpoints import build_checkpoint
    from safetensors.torch import load_file

    out = build_checkpoint(FAMILIES["glm4_moe"], tmp_path / "ck")
    weights = {}
    for f in out.glob("*.safetensors"):
        weights.update(load_file(f))
    biases = {k: v for k, v in weights.items() if k.endswith("e_score_correction_bias")}
    assert sorted(biases) == [f"model.layers.{i}.mlp.gate.e_score_correction_bias" for i in (1, 2)]
    assert all(float(b.abs().min()) > 0 for b in biases.values())  # HF initializes it to zeros


def test_grouped_routers_declare_their_rule_and_plain_ones_do_not():
    """GLM-4-MoE's router hook carries sigmoid + bias over 4 groups (its config does not say so: the tree
    does); DeepSeek-V3 reads scoring_func / topk_method; DeepSeek-V2's softmax over one group, and
    Mixtral's top-k, need no rule."""
    from overlays.base import Routing

    def rule(name, layer=1):
        return _specs(name)[f"blocks.{layer}.mlp.gate.hook_out"].routing

    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert rule("glm4_moe") == Routing("sigmoid", 4, 2, bias)
    assert rule("deepseek_v3") == Routing("sigmoid", 4, 2, bias)
    assert rule("deepseek_v2") is None and rule("mixtral") is None
    assert bias in _specs("glm4_moe")["blocks.1.mlp.gate.hook_out"].params()  # the engine dumps it
