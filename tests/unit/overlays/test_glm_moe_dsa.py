"""GLM-5's overlay (overlays/glm_moe_dsa.py), engine-free: vLLM 0.20.2 runs it on CUDA only (sparse MLA), so its specs
are checked against the family's config, vLLM 0.20.2's source (unpacked at /tmp/vllm020), and HF's model and
TransformerLens's bridge built on CPU from the family's synthetic checkpoint, whose config carries the two rope flags
GLM-5's released config.json has (``rope_interleave``, ``indexer_rope_interleave``)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from harness.models.families import FAMILIES
from overlays.base import Cols, DeInterleave, Heads, SwapAxes, expand_layers, hook_kind
from overlays.glm_moe_dsa import GLM_MOE_DSA, INDEXER_READS, GlmMoeDsaOverlay

VLLM020 = Path("/tmp/vllm020/vllm")
SOURCES = ("model_executor/models/deepseek_v2.py", "model_executor/layers/mla.py")
RELEASED_ROPE = {"rope_interleave": True, "indexer_rope_interleave": True}  # GLM-5's config.json
TOKENS = list(range(5, 141))  # 136 tokens > index_topk 128: the selection matters


@pytest.fixture(scope="module")
def checkpoint():
    from harness.models.checkpoints import checkpoint_dir

    return checkpoint_dir(FAMILIES["glm_moe_dsa"])


@pytest.fixture(scope="module")
def cfg(checkpoint):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def specs(cfg):
    return GlmMoeDsaOverlay().hook_specs(cfg)


@pytest.fixture(scope="module")
def hf_modules(checkpoint):
    from harness.references.reference import _load_hf

    return {n for n, _ in _load_hf(checkpoint, torch.float32, "cpu").named_modules()}


@pytest.fixture(scope="module")
def bridge_cache(checkpoint):
    from harness.references.reference import _boot_bridge

    bridge = _boot_bridge(checkpoint, torch.float32, "cpu")
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.tensor([TOKENS]))
    return cache


def _source(rel: str) -> str:
    path = VLLM020 / rel
    if not path.exists():
        pytest.skip(f"vLLM 0.20.2's source is not unpacked at {VLLM020} (needed: {path})")
    return path.read_text()


def test_family_config_is_dsa_on_every_layer(cfg):
    assert cfg.architectures == ["GlmMoeDsaForCausalLM"]
    assert cfg.index_topk < len(TOKENS) and cfg.index_head_dim == 128  # one fp8 quant group per index head
    assert cfg.index_topk % 128 == 0  # vLLM 0.20.2's sparse MLA kernel: "NUM_TOPK_TOKENS must be divisible by BLOCK_N"
    assert {k: getattr(cfg, k, None) for k in RELEASED_ROPE} == RELEASED_ROPE
    # vLLM 0.20.2 ignores indexer_types (every layer runs its own indexer): the family must keep them all "full"
    assert list(cfg.indexer_types) == ["full"] * cfg.num_hidden_layers
    assert cfg.mlp_layer_types == ["dense"] * cfg.first_k_dense_replace + ["sparse"] * (
        cfg.num_hidden_layers - cfg.first_k_dense_replace)


def test_mla_reads_are_deepseek_v3s_with_rope_deinterleaved(cfg, specs):
    H, nope, rope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    A = "model.layers.1.self_attn"
    # read at the MLA core's inputs, not at rotary_emb, which the indexer shares (the overlay's rotary-sharing trap)
    assert (specs["blocks.1.attn.hook_rot_q"].module, specs["blocks.1.attn.hook_rot_q"].read,
            specs["blocks.1.attn.hook_rot_q"].convert) == (f"{A}.mla_attn.mla_attn", "in[0]",
                                                           (Cols(nope, nope + rope), DeInterleave(0, rope)))
    assert (specs["blocks.1.attn.hook_rot_k"].module, specs["blocks.1.attn.hook_rot_k"].read,
            specs["blocks.1.attn.hook_rot_k"].convert) == (f"{A}.mla_attn.mla_attn", "in[2]", (DeInterleave(0, rope),))
    assert not any(s.module.endswith("rotary_emb") for s in specs.values())
    assert (specs["blocks.1.attn.hook_q"].module, specs["blocks.1.attn.hook_q"].convert) == (
        f"{A}.mla_attn.mla_attn", (DeInterleave(nope, nope + rope), SwapAxes(0, 1)))
    assert specs["blocks.1.attn.hook_z"].convert == (Heads(H, v),)
    assert specs["blocks.1.attn.hook_q_latent"].module == f"{A}.q_a_layernorm"


def test_without_the_released_rope_flag_nothing_is_deinterleaved(cfg):
    """GlmMoeDsaConfig has no rope_interleave (HF always interleaves): the family row must carry it."""
    import copy

    bare = copy.deepcopy(cfg)
    del bare.rope_interleave
    assert GlmMoeDsaOverlay().hook_specs(bare)["blocks.1.attn.hook_rot_q"].convert == (Cols(32, 96),)


def test_references_router_from_hf_latent_norm_from_tl(specs):
    for h in ("hook_expert_weights", "hook_expert_indices"):
        assert dict(specs[f"blocks.1.mlp.gate.{h}"].references) == {
            "bridge": None, "compat": None, "hf": f"blocks.1.mlp.gate.{h}"}
    assert not specs["blocks.1.attn.q_a_layernorm.hook_normalized"].references
    routing = specs["blocks.2.mlp.gate.hook_out"].routing
    assert (routing.scoring, routing.bias) == ("sigmoid", "model.layers.2.mlp.gate.e_score_correction_bias")
    assert "blocks.0.mlp.gate.hook_out" not in specs and "blocks.0.mlp.hook_pre" in specs


def test_nonfiring_hooks_and_reasons(cfg, specs):
    ov = GlmMoeDsaOverlay()
    nf = {n.template: n.reason for n in ov.nonfiring_for(cfg)}
    n = cfg.num_hidden_layers
    assert {"blocks.{i}.attn.hook_topk_indices", "blocks.{i}.attn.hook_dsa_mask", "blocks.{i}.attn.hook_k",
            "blocks.{i}.attn.hook_attn_scores", "blocks.{i}.attn.hook_pattern"} <= set(nf)
    assert "fp8" in nf["blocks.{i}.attn.hook_topk_indices"] and "attn.hook_z" in nf["blocks.{i}.attn.hook_topk_indices"]
    assert not {h for t in nf for h in expand_layers(t, n)} & set(specs), "offered and non-firing"
    assert not any(h.startswith("blocks.0.mlp.") for t in nf for h in expand_layers(t, n))  # layer 0 is dense
    assert not ov.derived_specs(cfg) and all(nf.values())
    assert GLM_MOE_DSA.attention.rope_deinterleave_key == "rope_interleave"


def test_every_module_the_overlay_reads_is_vllm_020s(specs):
    src = "\n".join(_source(rel) for rel in SOURCES)
    assert "class GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM)" in src
    attrs = {part for s in specs.values() for part in s.module.split(".")[2:] if not part.isdigit()}
    attrs |= {part for _, module, *_ in INDEXER_READS for part in module.split(".")}
    attrs -= {"vp_route"}  # harness.engines.route_tap's child, installed by the worker
    for attr in sorted(attrs):
        assert re.search(rf"self\.{attr}\s*=", src), f"vLLM 0.20.2 assigns no self.{attr}"
    assert "logits_processor" in _source("model_executor/models/deepseek_v2.py")
    # the indexer: called with the attention's input and q_a_layernorm's output; wk and weights_proj fused
    assert "self.indexer(\n                hidden_states, q_c, positions, self.indexer_rope_emb" in src
    assert "[self.head_dim, self.n_head]" in src
    # the rotary-sharing trap: same get_rope key as rotary_emb (neox False) once indexer_rope_interleave is true
    assert 'is_neox_style=not getattr(config, "indexer_rope_interleave", False)' in src
    assert "if key in _ROPE_DICT:" in _source("model_executor/layers/rotary_embedding/__init__.py")
    # the fp8 indexer: q per 128-group, ue8m0 scales; no bf16 path on CUDA
    assert "per_token_group_quant_fp8" in src and 'self.scale_fmt = "ue8m0"' in src
    indexer_op = _source("model_executor/layers/sparse_attn_indexer.py")
    assert "fp8_fp4_mqa_logits" in indexer_op and "requires DeepGEMM" in indexer_op


def test_hf_and_tl_names_exist(cfg, specs, hf_modules, bridge_cache):
    n = cfg.num_hidden_layers
    for hook, spec in specs.items():
        name = spec.reference_name("bridge", hook)
        if name is not None and hook != "unembed.hook_out":
            assert name in bridge_cache, f"{hook}: TransformerBridge has no {name}"
        hf = spec.reference_name("hf", None)
        if hf is not None and "mlp.gate.hook_expert" in hf:  # harness.references.reference._router_choice_hooks
            assert f"model.layers.{hf.split('.')[1]}.mlp.gate" in hf_modules
    nf = GlmMoeDsaOverlay().nonfiring_for(cfg)
    for t in ("blocks.{i}.attn.hook_topk_indices", "blocks.{i}.attn.hook_dsa_mask", "blocks.{i}.attn.hook_k"):
        assert t in {x.template for x in nf} and all(h in bridge_cache for h in expand_layers(t, n))
    assert bridge_cache["blocks.1.attn.hook_topk_indices"].shape[-1] == cfg.index_topk
    for i in range(n):
        for _, _, _, _, hf_module in INDEXER_READS:
            assert f"model.layers.{i}.self_attn.{hf_module}" in hf_modules
    # TL's hook_z by head_dim (= qk_rope_head_dim): the DeepSeek layout bug
    assert bridge_cache["blocks.1.attn.hook_z"].shape[-1] == cfg.head_dim == cfg.qk_rope_head_dim != cfg.v_head_dim
    assert {hook_kind(h) for h in specs} >= {"attn.hook_v", "mlp.shared_experts.hook_pre", "attn.hook_kv_latent"}


def test_preempt_is_declared_not_applicable_with_the_backends_block():
    from harness.models.targets import target_for_family
    from harness.pipeline.runner import not_applicable
    from harness.values.variant import Variant

    target = target_for_family(FAMILIES["glm_moe_dsa"])
    assert "64 tokens" in not_applicable(target, Variant(device="cuda", dtype="bfloat16", serving="preempt"))
    for scheme in ("chunked", "prefix-cache", "decode"):  # run on the H100 (docs/gpu/evidence/breadth-2026-12-05)
        assert not_applicable(target, Variant(device="cuda", dtype="bfloat16", serving=scheme)) is None
