"""GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``): DeepSeek's MLA tree with GLM-4.5-MoE routing (overlays/glm4_moe_lite.py),
its two family rows and their declared vLLM bugs (no engine).  The remote-code refusals of this group are tested in
tests/unit/pipeline/test_hf_missing_refusals.py.
"""
from __future__ import annotations

import torch

from harness.comparison.conversions import apply_one
from harness.comparison.known_issues import LAYOUT_BUGS
from harness.models.families import DEFAULT_FAMILIES, FAMILIES
from overlays import OVERLAYS, get_overlay
from overlays.base import Cols, DeInterleave, Heads, SwapAxes, expand_layers

ARCH = "Glm4MoeLiteForCausalLM"


def _target(family):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[family])


def test_the_rows_keep_the_released_shape_facts_and_run_by_default():
    for name in ("glm4_moe_lite", "glm4_moe_lite_yarn"):
        spec = FAMILIES[name]
        cfg = spec.config
        assert spec.architecture == ARCH and name in DEFAULT_FAMILIES and not spec.held_out
        # vLLM's CPU MLA decode kernel takes kv_lora_rank 512 + rope 64; v differs from nope and rope (released:
        # 192 / 64 / 256), so a head split by either wrong one cannot pass
        assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]) == (512, 64)
        assert len({cfg["v_head_dim"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]}) == 3
        # HF reads mlp_layer_types, vLLM first_k_dense_replace: they must agree
        assert cfg["mlp_layer_types"] == ["dense"] * cfg["first_k_dense_replace"] + ["sparse"] * (
            cfg["num_hidden_layers"] - cfg["first_k_dense_replace"])
        assert cfg["routed_scaling_factor"] == 1.8 and cfg["n_group"] == cfg["topk_group"] == 1  # as released
    released = FAMILIES["glm4_moe_lite"].config["rope_parameters"]
    assert released == {"rope_type": "default", "rope_theta": 1000000.0}  # GLM-4.7-Flash's config
    assert FAMILIES["glm4_moe_lite_yarn"].config["rope_parameters"]["rope_type"] == "yarn"


def test_the_declared_vllm_bugs():
    rot = FAMILIES["glm4_moe_lite"].known_vllm_bug
    assert (rot.dtypes, rot.devices) == (("float32", "bfloat16", "float16"), ("cpu",))
    assert rot.first_failing == ("blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k")
    assert FAMILIES["deepseek_v3_default_rope"].known_vllm_bug.first_failing == rot.first_failing
    assert "forward_cpu" in rot.reason and "test_deepseek_rotary.py" in rot.reason
    moe = FAMILIES["glm4_moe_lite_yarn"].known_vllm_bug
    assert (moe.dtypes, moe.devices, moe.first_failing) == (("float16",), ("cpu",), ("blocks.1.mlp.hook_out",))
    assert moe.rel_err[0] < 1 - 1 / 1.8 < moe.rel_err[1]
    assert "_maybe_apply_routed_scale_to_output" in moe.reason and FAMILIES["glm4_moe"].known_vllm_bug.name == moe.name


def test_the_overlay_is_deepseeks_mla_with_glms_router_and_a_shared_expert():
    t = _target("glm4_moe_lite_yarn")
    cfg, ov = t.hf_config, get_overlay(ARCH)
    assert t.overlay is OVERLAYS[ARCH] and ov.name == "glm4_moe_lite"
    specs = ov.hook_specs(cfg)
    H, nope, rope, v = 4, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    A = "model.layers.1.self_attn"
    # rope de-interleaved (HF's rope_interleave), q heads-first, v's columns of kv_b_proj, z by v_head_dim
    assert cfg.rope_interleave and specs["blocks.1.attn.hook_rot_q"].convert == (DeInterleave(0, rope),)
    assert specs["blocks.1.attn.hook_q"].convert == (DeInterleave(nope, nope + rope), SwapAxes(0, 1))
    assert specs["blocks.1.attn.hook_v"].convert == (Heads(H, nope + v), Cols(nope, nope + v), SwapAxes(0, 1))
    assert specs["blocks.1.attn.hook_z"].module == f"{A}.o_proj" and specs["blocks.1.attn.hook_z"].convert == (
        Heads(H, v),)
    # q_a_layernorm: TL's adapter maps it as a plain component (no hook): compared with HF's module
    refs = dict(specs["blocks.1.attn.q_a_layernorm.hook_normalized"].references)
    assert refs == {"bridge": None, "compat": None, "hf": "blocks.1.attn.q_a_layernorm.hook_normalized"}
    # the router's choice against TL's MoERouterBridge (no HF-only override, unlike DeepSeek's adapters)
    assert not specs["blocks.1.mlp.gate.hook_expert_indices"].references
    routing = specs["blocks.1.mlp.gate.hook_out"].routing
    assert (routing.scoring, routing.n_group, routing.topk_group) == ("sigmoid", 1, 1)
    assert routing.bias == "model.layers.1.mlp.gate.e_score_correction_bias"
    assert specs["blocks.1.mlp.shared_experts.hook_pre"].convert == (Cols(0, 64),)
    # layer 0 is dense: no router, a gated MLP's hooks; per-expert hooks non-firing on the sparse layers only
    assert "blocks.0.mlp.gate.hook_out" not in specs and "blocks.0.mlp.hook_pre" in specs
    nonfiring = {h for nf in ov.nonfiring_for(cfg) for h in expand_layers(nf.template, cfg.num_hidden_layers)}
    assert "blocks.0.attn.hook_k" in nonfiring and not any(h.startswith("blocks.0.mlp.") for h in nonfiring)


def test_tls_hook_z_layout_bug_covers_glm_lite():
    (bug,) = [b for b in LAYOUT_BUGS if b.template == "blocks.{i}.attn.hook_z"]
    assert bug.covers(ARCH, "bridge", "blocks.2.attn.hook_z") and bug.covers(ARCH, "compat", "blocks.0.attn.hook_z")
    cfg = FAMILIES["glm4_moe_lite"].config
    assert bug.shows({"v_head_dim": cfg["v_head_dim"], "qk_rope_head_dim": cfg["qk_rope_head_dim"]})
    # TL's head_dim is Glm4MoeLiteConfig's attribute_map alias of qk_rope_head_dim
    assert _target("glm4_moe_lite").hf_config.head_dim == cfg["qk_rope_head_dim"]


def test_deinterleave_of_a_gptj_rotation_is_hf_glm_lites_interleaved_rotation():
    from transformers.models.glm4_moe_lite.modeling_glm4_moe_lite import apply_rotary_pos_emb_interleave

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
