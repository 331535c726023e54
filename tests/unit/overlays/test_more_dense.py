"""More dense rows (Apertus, HunYuan-Dense-V1, FlexOlmo): what each row makes of its family's config (no engine).

New kinds: q/k norm modules named otherwise (``Attention.qk_norm_modules``), per-head q/k norms on HF's heads-first
layout read with their tokens on dim 2 (``QK_PER_HEAD_HEADS_FIRST``, ``HookSpec.token_dim``), MoE reads without the
Transformers backend's batch dim (``Mlp.flat_reads``) and a router whose choice no reference names
(``Mlp.route_choice``); Apertus's float32 run is a declared known vLLM bug and its float16 a declared refusal.
"""
from __future__ import annotations

import torch

from harness.comparison.conversions import apply_one
from harness.models.families import DEFAULT_FAMILIES, FAMILIES
from overlays import OVERLAYS, get_overlay
from overlays.base import DropBatch, Heads, HookSpec, SwapAxes, UnfoldNorm, expand_layers


def _target(family):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[family])


def _specs(family, implementation=None):
    t = _target(family)
    return get_overlay(t.architecture, implementation).hook_specs(t.hf_config)


def _nonfiring(family, implementation=None):
    t = _target(family)
    ov = get_overlay(t.architecture, implementation)
    return {h for nf in ov.nonfiring_for(t.hf_config) for h in expand_layers(nf.template, t.hf_config.num_hidden_layers)}


def test_the_rows_run_by_default_and_are_registered():
    for name, arch in (("apertus", "ApertusForCausalLM"), ("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM"),
                       ("flex_olmo", "FlexOlmoForCausalLM")):
        assert name in DEFAULT_FAMILIES and not FAMILIES[name].held_out
        assert FAMILIES[name].architecture == arch and arch in OVERLAYS


# -- Apertus ---------------------------------------------------------------------------------------------------------
def test_apertus_reads_its_own_norm_names_and_a_plain_xielu_mlp():
    s = _specs("apertus")
    assert s["blocks.1.ln1.hook_normalized"].module == "model.layers.1.attention_layernorm"
    assert s["blocks.1.ln2.hook_normalized"].module == "model.layers.1.feedforward_layernorm"
    assert (s["blocks.1.mlp.hook_pre"].module, s["blocks.1.mlp.hook_pre"].read) == ("model.layers.1.mlp.up_proj", "out[0]")
    assert (s["blocks.1.mlp.hook_post"].module, s["blocks.1.mlp.hook_post"].read) == ("model.layers.1.mlp.down_proj",
                                                                                        "in[0]")
    assert "blocks.1.mlp.hook_pre_linear" not in s  # no gate
    # the normed q as both lines hand it to rotary, [T, heads * d] (vLLM 0.20's norm output is [T * heads, d]), split
    # into heads, un-folded, to TL's heads-first
    q = s["blocks.1.attn.q_norm.hook_normalized"]
    assert (q.module, q.read) == ("model.layers.1.self_attn.rotary_emb", "in[1]") and q.convert[-1] == SwapAxes(0, 1)
    assert q.convert[0] == Heads(4, 32) and s["blocks.1.attn.k_norm.hook_normalized"].read == "in[2]"


def test_apertus_declares_the_bfloat16_xielu_scalars_and_the_float16_crash():
    spec = FAMILIES["apertus"]
    bug = spec.known_vllm_bug
    assert bug.dtypes == ("float32",) and bug.first_failing == ("blocks.0.mlp.hook_post",)
    assert bug.rel_err[0] > 1e-4  # above the float32 tolerance: a bf16-rounding signature, not noise
    assert "XIELU" in bug.reason and "activation.py" in bug.reason
    assert set(spec.unsupported_dtypes) == {"float16"}
    assert spec.dtype_refusal_on("float16", "cpu").says == (  # oneDNN's words (AMX), torch linear's (elsewhere)
        "expected scalar type Float but found Half", "expected m1 and m2 to have the same dtype, but got: float != c10::Half")
    assert spec.config["attention_bias"] is True


# -- HunYuan-Dense-V1 --------------------------------------------------------------------------------------------------
def test_hunyuan_reads_its_qk_norms_heads_first_with_tokens_on_dim_2():
    s = _specs("hunyuan_v1_dense", "transformers")
    for x, module in (("q", "query_layernorm"), ("k", "key_layernorm")):
        spec = s[f"blocks.2.attn.{x}_norm.hook_normalized"]
        assert spec.module == f"model.layers.2.self_attn.{module}" and spec.read == "out"
        assert isinstance(spec.convert[0], DropBatch) and isinstance(spec.convert[1], UnfoldNorm)
        assert not any(isinstance(c, SwapAxes) for c in spec.convert)  # HF's layout is already TL's
        assert spec.token_dim == 2 and spec.raw_token_dim == 2
    assert s["blocks.2.hook_out"].raw_token_dim == 1  # the other reads: [1, T, ...]
    assert {"blocks.0.attn.hook_rot_q", "blocks.2.attn.hook_rot_k"} <= _nonfiring("hunyuan_v1_dense", "transformers")


def test_hunyuan_native_row_reads_rotary_before_the_norms_and_derives_no_scores():
    # vLLM 0.20.2's own class: rotary_emb, then query_layernorm / key_layernorm on [T, heads, d_head]
    s = _specs("hunyuan_v1_dense", "native")
    assert s["blocks.0.attn.hook_rot_q"].module == "model.layers.0.self_attn.rotary_emb"
    spec = s["blocks.2.attn.k_norm.hook_normalized"]
    assert isinstance(spec.convert[0], UnfoldNorm) and spec.convert[-1] == SwapAxes(0, 1)
    assert s["blocks.0.attn.hook_out"].read == "out[0]"  # (output, (k, v))
    assert {"blocks.0.attn.hook_attn_scores", "blocks.2.attn.hook_pattern"} <= _nonfiring("hunyuan_v1_dense", "native")


def test_a_heads_first_qk_norm_read_becomes_tls_layout():
    spec = _specs("hunyuan_v1_dense", "transformers")["blocks.0.attn.q_norm.hook_normalized"]
    raw = torch.randn(1, 4, 7, 32)  # [1, heads, T, d_head]
    out = apply_one(spec.convert[0], raw, {})
    assert out.shape == (4, 7, 32)


def test_raw_token_dim_defaults():
    assert HookSpec("m").raw_token_dim == 0
    assert HookSpec("m", convert=(DropBatch(),)).raw_token_dim == 1
    assert HookSpec("m", convert=(DropBatch(),), token_dim=2).raw_token_dim == 2


# -- FlexOlmo --------------------------------------------------------------------------------------------------------
def test_flex_olmo_router_reads_are_flat_and_its_choice_is_declared_unoffered():
    s, nf = _specs("flex_olmo"), _nonfiring("flex_olmo")
    gate = s["blocks.1.mlp.gate.hook_out"]
    assert (gate.module, gate.read, gate.width) == ("model.layers.1.mlp.gate", "out[0]", 4)
    assert not any(isinstance(c, DropBatch) for c in gate.convert)  # HF's router flattens to [T, d]
    assert isinstance(s["blocks.1.mlp.hook_in"].convert[0], DropBatch)
    assert "blocks.1.mlp.gate.hook_expert_indices" not in s and "blocks.1.mlp.gate.hook_expert_weights" not in s
    assert {"blocks.1.mlp.gate.hook_expert_indices", "blocks.1.mlp.gate.hook_expert_weights",
            "blocks.1.mlp.hook_pre", "blocks.1.attn.hook_rot_q"} <= nf
    # OLMo-2's post-norms carry the legacy hook_attn_out / hook_mlp_out
    assert s["blocks.1.ln2_post.hook_out"].module == "model.layers.1.post_feedforward_layernorm"
    assert "blocks.1.ln1.hook_normalized" not in s
