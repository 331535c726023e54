"""More MoE rows (Phi-3.5-MoE, MiniMax-M2, GPT-OSS): what each row makes of its family's config (no engine).

New kinds: a released architecture spelled differently from transformers' class (``ModelSpec.released_architecture``),
q/k norms vLLM applies without calling them (``Attention.qk_norm_at_rotary``), a correction bias on the MoE block
(``Mlp.routing_bias``), and a pattern the row declares not derived (attention sinks).
"""
from __future__ import annotations

from harness.comparison.known_issues import known_issue
from harness.models.families import FAMILIES
from overlays import OVERLAYS, get_overlay
from overlays.base import Heads, Routing, UnfoldNorm, expand_layers


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


# -- Phi-3.5-MoE ---------------------------------------------------------------------------------------------------
def test_phimoe_is_registered_under_the_released_spelling():
    spec = FAMILIES["phimoe"]
    assert spec.architecture == "PhiMoEForCausalLM" and "PhiMoEForCausalLM" in OVERLAYS
    assert "PhimoeForCausalLM" not in OVERLAYS  # transformers' spelling is not what the released config.json says


def test_phimoe_reads_the_whole_stream_and_unfolds_layernorm_with_bias():
    specs = _specs("phimoe")
    assert (specs["blocks.1.hook_out"].module, specs["blocks.1.hook_out"].read) == ("model.layers.1", "out[0]")
    assert specs["blocks.1.hook_in"].read == "in.hidden_states"
    ln = specs["blocks.1.ln2.hook_normalized"]
    assert ln.read == "out" and ln.convert == (UnfoldNorm("model.layers.1.post_attention_layernorm.weight",
                                                          bias="model.layers.1.post_attention_layernorm.bias"),)
    assert specs["ln_final.hook_normalized"].read == "out"
    assert specs["blocks.0.mlp.gate.hook_out"].module == "model.layers.0.block_sparse_moe.gate"
    assert specs["blocks.0.mlp.gate.hook_expert_indices"].module == "model.layers.0.block_sparse_moe.experts.vp_route"


def test_phimoe_rotated_qk_only_feed_the_derived_hooks():
    specs, derived = _specs("phimoe"), _derived("phimoe")
    assert dict(specs["blocks.0.attn.hook_rot_q"].references) == {"bridge": None, "compat": None, "hf": None}
    assert derived["blocks.0.attn.hook_pattern"].inputs == ("blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k")
    issue = known_issue("PhiMoEForCausalLM", "bridge", "blocks.2.attn.hook_attn_scores")
    assert issue is not None and issue.signature == "scores_equal_pattern"


def test_phimoe_declares_vllms_dropped_lm_head_bias():
    spec = FAMILIES["phimoe"]
    assert spec.config["lm_head_bias"] and spec.config["attention_bias"]
    assert spec.known_vllm_bug is not None and spec.known_vllm_bug.first_failing == ("unembed.hook_out",)


# -- MiniMax-M2 ----------------------------------------------------------------------------------------------------
def test_minimax_m2_reads_its_qk_norms_at_the_rotary_input():
    specs, cfg = _specs("minimax_m2"), _target("minimax_m2").hf_config
    q, k = specs["blocks.1.attn.q_norm.hook_normalized"], specs["blocks.1.attn.hook_k_normed"]
    assert (q.module, q.read) == ("model.layers.1.self_attn.rotary_emb", "in[1]")
    assert q.convert == (UnfoldNorm("model.layers.1.self_attn.q_norm.weight"),)
    assert (k.module, k.read, k.convert) == ("model.layers.1.self_attn.rotary_emb", "in[2]", ())
    assert q.width == cfg.num_attention_heads * cfg.head_dim and k.width == cfg.num_key_value_heads * cfg.head_dim


def test_minimax_m2_routes_with_the_blocks_correction_bias():
    gate = _specs("minimax_m2")["blocks.2.mlp.gate.hook_out"]
    assert gate.module == "model.layers.2.block_sparse_moe.gate"
    assert gate.routing == Routing("sigmoid", 1, 1, "model.layers.2.block_sparse_moe.e_score_correction_bias")
    assert gate.params() == ["model.layers.2.block_sparse_moe.e_score_correction_bias"]


def test_qwen3_and_olmoe_keep_their_qk_norm_reads():
    assert _specs("olmoe")["blocks.0.attn.hook_q_normed"].module == "model.layers.0.self_attn.q_norm"
    assert _specs("glm4_moe")["blocks.1.mlp.gate.hook_out"].routing.bias == "model.layers.1.mlp.gate.e_score_correction_bias"


# -- GPT-OSS -------------------------------------------------------------------------------------------------------
def test_gpt_oss_module_names_and_router_references():
    specs = _specs("gpt_oss")
    assert specs["embed.hook_out"].module == "model.embedding"
    assert specs["blocks.0.attn.hook_rot_q"].module == "model.layers.0.attn.rotary_emb"
    assert specs["blocks.0.attn.hook_z"].convert == (Heads(4, 32),)
    gate = specs["blocks.1.mlp.gate.hook_out"]
    assert gate.module == "model.layers.1.mlp.router"
    assert dict(gate.references) == {"bridge": None, "compat": "blocks.1.mlp.router.hook_out",
                                     "compat-processed": None}  # TL folds v biases, which sinks make wrong
    assert dict(specs["blocks.1.mlp.gate.hook_expert_weights"].references)["compat"] == \
        "blocks.1.mlp.router.hook_expert_weights"
    from harness.vocab.hook_rules import sorted_per_token
    assert sorted_per_token("blocks.1.mlp.router.hook_expert_indices")  # TL's name: ids compared as sets


def test_gpt_oss_derives_scores_but_not_the_sink_pattern():
    derived, nonfiring = _derived("gpt_oss"), _nonfiring("gpt_oss")
    assert {"blocks.0.attn.hook_attn_scores", "blocks.2.attn.hook_attn_scores"} <= set(derived)
    assert not any(h.endswith("hook_pattern") for h in derived)
    assert "blocks.1.attn.hook_pattern" in nonfiring
    # sliding window on even layers, as vLLM applies it
    assert [derived[f"blocks.{i}.attn.hook_attn_scores"].window for i in range(3)] == [8, None, 8]


def test_a_row_without_a_nonfiring_pattern_still_derives_it():
    assert "blocks.0.attn.hook_pattern" in _derived("llama")


def test_minimax_m2_is_a_cpu_refusal_in_vllms_words():
    refused = FAMILIES["minimax_m2"].refused
    assert refused is not None and refused.devices == ("cpu",) and refused.probe == "boot"
    assert 'assert self.scoring_func == "softmax"' in refused.reason


def test_a_bare_assertion_is_the_engines_reason():
    from harness.engines.subject import engine_reason

    log = ['  File "/x/site-packages/vllm/model_executor/layers/fused_moe/router/cpu_router.py", line 239, in '
           '_compute_routing', '    assert self.scoring_func == "softmax"', "           ^^^^^^", "AssertionError"]
    assert engine_reason(log) == ('AssertionError: assert self.scoring_func == "softmax" '
                                  "(vllm/model_executor/layers/fused_moe/router/cpu_router.py:239, in _compute_routing)")
    assert engine_reason(["ValueError: nope", "AssertionError"]) == "ValueError: nope"  # a message wins
    assert engine_reason(["nothing here"]) is None


# -- AFMoE ---------------------------------------------------------------------------------------------------------
def test_afmoe_sandwich_norms_dense_layer_and_shared_expert():
    specs, nonfiring = _specs("afmoe"), _nonfiring("afmoe")
    assert specs["blocks.0.ln2.hook_normalized"].module == "model.layers.0.pre_mlp_layernorm"
    assert specs["blocks.0.ln1_post.hook_out"].module == "model.layers.0.post_attention_layernorm"
    assert specs["blocks.0.mlp.hook_pre"].module == "model.layers.0.mlp.gate_up_proj"  # layer 0 dense
    assert "blocks.0.mlp.gate.hook_out" not in specs and "blocks.0.mlp.hook_pre" not in nonfiring
    assert specs["blocks.1.mlp.shared_experts.hook_post"].width == 64
    assert "blocks.1.mlp.hook_pre" in nonfiring
    assert specs["embed.hook_out"].module == "model.embed_tokens"  # muP scale is after the module


def test_afmoe_router_rows_and_expert_bias():
    specs = _specs("afmoe")
    gate = specs["blocks.2.mlp.gate.hook_out"]
    assert gate.routing == Routing("sigmoid", 1, 1, "model.layers.2.mlp.expert_bias")
    assert dict(gate.references) == {"bridge": None, "compat": "blocks.2.mlp.router_gate.hook_out"}
    assert dict(specs["blocks.2.mlp.gate.hook_expert_indices"].references)["hf"] == \
        "blocks.2.mlp.gate.hook_expert_indices"


def test_a_post_mlp_norm_lies_downstream_of_its_layers_routing():
    from harness.comparison.routing import after_routing

    assert after_routing("blocks.1.ln2_post.hook_normalized", 1) and after_routing("blocks.1.ln2_post.hook_out", 1)
    assert after_routing("blocks.1.hook_mlp_out", 1)
    assert not after_routing("blocks.1.ln1_post.hook_out", 1) and not after_routing("blocks.1.ln2.hook_normalized", 1)


def test_phimoe_declares_the_sparsemixer_rule():
    gate = _specs("phimoe")["blocks.0.mlp.gate.hook_out"]
    assert gate.routing == Routing("sparsemixer", jitter_eps=0.01)


def test_the_sparsemixer_choice_is_hfs_and_its_threshold_is_a_near_tie():
    import torch
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    from harness.comparison.routing import chosen, find_flips

    rule = Routing("sparsemixer", jitter_eps=0.01)
    x = torch.randn(500, 4, generator=torch.Generator().manual_seed(0))
    mask, _ = chosen(x, 2, rule)
    _, ids = sparsemixer(x.clone(), 0.01, False)
    assert torch.equal(mask[:, :4], torch.zeros(500, 4, dtype=torch.bool).scatter_(1, ids, True))
    # expert 2 = 1.0, another at relative distance just inside 2 * eps of it: a nudge moves it out of the softmax
    # without changing either id -- a flip under the sparsemixer's rule, none under the plain top-k's
    ref = torch.tensor([[3.0, 1.0, 0.9801, -2.0]], dtype=torch.float64)
    sub = ref + torch.tensor([[0.0, 0.0, -0.0002, 0.0]], dtype=torch.float64)
    assert len(find_flips(sub, ref, 2, 0, 0, 0.1, routing=rule)) == 1
    assert find_flips(sub, ref, 2, 0, 0, 0.1) == []
