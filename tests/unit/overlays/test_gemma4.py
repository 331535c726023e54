"""Gemma-4 text row: what the row makes of its family's config (no engine).

New kinds: per-layer head dims from HF's heterogeneous ``per_layer_config`` (``Tree.per_layer_dims``), norms
offered at their ``hook_out`` where the reference has no ``hook_normalized`` (``Tree.norm_hook``), a weightless v
norm (``Attention.v_norm``), a fixed softmax scale (``Attention.scale``), and a learned buffer randomized around 1
(``layer_scalar``, harness.models.checkpoints.LEARNED_SCALES).
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from harness.comparison.known_issues import known_issue
from harness.models.checkpoints import randomize_
from harness.models.families import FAMILIES
from overlays import OVERLAYS, get_overlay
from overlays.base import Cols, Heads
from overlays.decoder_only import DECODER
from overlays.tree import Tree, TreeOverlay


def _target():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["gemma4_text"])


def _specs():
    t = _target()
    return get_overlay(t.architecture).hook_specs(t.hf_config)


def test_gemma4_is_registered_natively():
    assert FAMILIES["gemma4_text"].architecture == "Gemma4ForCausalLM" and "Gemma4ForCausalLM" in OVERLAYS


def test_the_row_keeps_what_every_released_model_has_and_drops_the_optional_extras():
    cfg = FAMILIES["gemma4_text"].config
    assert cfg["hidden_size_per_layer_input"] == 0 and cfg["final_logit_softcapping"]
    assert "sliding_attention" in cfg["layer_types"] and cfg["layer_types"][-1] == "full_attention"
    assert cfg["global_head_dim"] != cfg["head_dim"]
    for key in ("num_kv_shared_layers", "attention_k_eq_v", "enable_moe_block", "num_experts"):
        assert not cfg.get(key)


def test_the_full_attention_layer_has_its_own_head_dim():
    specs = _specs()
    assert specs["blocks.0.attn.hook_q"].convert == (Cols(0, 128), Heads(4, 32))
    assert specs["blocks.2.attn.hook_q"].convert == (Cols(0, 256), Heads(4, 64))
    assert specs["blocks.2.attn.hook_v"].convert == (Cols(384, 512), Heads(2, 64))
    assert specs["blocks.2.attn.hook_z"].convert == (Heads(4, 64),) and specs["blocks.2.attn.hook_z"].width == 256
    assert specs["blocks.2.attn.hook_rot_k"].convert == (Heads(2, 64),)


def test_per_layer_dims_read_the_config_object_and_its_json_alike():
    t = _target()
    ov = get_overlay(t.architecture)
    as_json = json.loads(t.hf_config.to_json_string())
    for cfg in (t.hf_config, as_json):
        d = ov.dims(cfg)
        assert (d["head_dim"], d["n_kv"]) == (32, 2)
        assert ov.layer_dims(cfg, 2, d)["head_dim"] == 64 and ov.layer_dims(cfg, 1, d)["head_dim"] == 32


def test_a_row_without_per_layer_dims_ignores_per_layer_config():
    ov = TreeOverlay(Tree("plain"))
    cfg = {"hidden_size": 128, "num_attention_heads": 4, "head_dim": 32, "num_hidden_layers": 3,
           "per_layer_config": {"2": {"head_dim": 64}}}
    assert ov.layer_dims(cfg, 2, ov.dims(cfg))["head_dim"] == 32


def test_norms_are_offered_at_their_output_as_the_bridge_names_them():
    specs = _specs()
    for hook, module in (("blocks.1.ln1.hook_out", "input_layernorm"), ("blocks.1.ln2.hook_out", "pre_feedforward_layernorm"),
                         ("blocks.1.ln1_post.hook_out", "post_attention_layernorm"),
                         ("blocks.1.ln2_post.hook_out", "post_feedforward_layernorm")):
        assert (specs[hook].module, specs[hook].read, specs[hook].convert) == (f"model.layers.1.{module}", "out", ())
    assert (specs["ln_final.hook_out"].module, specs["ln_final.hook_out"].convert) == ("model.norm", ())
    assert not [h for h in specs if h.endswith("hook_normalized")]
    assert dict(specs["blocks.1.ln1_post.hook_out"].references)["compat"] == "blocks.1.hook_attn_out"
    for x in ("q", "k", "v"):  # [T, heads, d_head] in vLLM and in TL: as is
        s = specs[f"blocks.2.attn.{x}_norm.hook_out"]
        assert (s.module, s.read, s.convert) == (f"model.layers.2.self_attn.{x}_norm", "out", ())


def test_the_stream_is_the_layers_whole_output():
    specs = _specs()
    assert specs["embed.hook_out"].module == "model.layers.0" and specs["embed.hook_out"].read == "in.hidden_states"
    assert specs["blocks.1.hook_out"].read == "out[0]" and specs["blocks.1.hook_in"].read == "in.hidden_states"
    assert specs["blocks.1.hook_resid_mid"].module == "model.layers.1.pre_feedforward_layernorm"


def test_scores_use_scale_one_and_the_window_and_the_bridge_scores_bug_is_declared():
    t = _target()
    ov = get_overlay(t.architecture)
    derived = ov.derived_specs(t.hf_config)
    assert derived["blocks.0.attn.hook_pattern"].scale == 1.0
    assert derived["blocks.0.attn.hook_pattern"].window == 8 and derived["blocks.2.attn.hook_pattern"].window is None
    assert dict(_specs()["blocks.0.attn.hook_rot_q"].references)["bridge"] is None
    issue = known_issue("Gemma4ForCausalLM", "compat", "blocks.1.attn.hook_attn_scores")
    assert issue is not None and issue.signature == "scores_equal_pattern"
    assert [nf.template for nf in ov.nonfiring_for(t.hf_config)] == ["unembed.hook_out"]  # final soft-cap


def test_default_rows_keep_hook_normalized():
    specs = TreeOverlay(DECODER).hook_specs({"hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
                                             "intermediate_size": 256, "vocab_size": 512})
    assert "ln_final.hook_normalized" in specs and "blocks.0.ln1.hook_normalized" in specs


def test_norm_hook_is_checked():
    with pytest.raises(ValueError):
        replace(DECODER, norm_hook="hook_in")


def test_layer_scalar_is_randomized_around_one():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("layer_scalar", torch.ones(1))
            self.register_buffer("other", torch.ones(1))

    m = torch.nn.Sequential(Layer(), Layer())
    randomize_(m, FAMILIES["gemma4_text"])
    for layer in m:
        assert 0.5 <= abs(float(layer.layer_scalar)) <= 1.5 and float(layer.layer_scalar) != 1.0
        assert float(layer.other) == 1.0  # other buffers are left alone
