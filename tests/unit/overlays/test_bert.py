"""The BERT overlay (overlays/bert.py), engine-free: its module paths are vLLM's BertForMaskedLM tree
(read from the installed vllm source), the post-LN reads (LayerNorm inputs and outputs, un-folded with
weight and bias), the embedding hooks, the MLM head, the derived attention unmasked, the references
that hold no equal tensor (compatibility mode's hook_embed, processed mode's LayerNorm-output stream),
the non-firing reasons, and the Encoder declaration (pooling task, token types, serving shapes that do
not apply, each with vLLM's reason)."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.base import Encoder, UnfoldNorm
from overlays.bert import ENCODER, BertOverlay


@pytest.fixture(scope="module")
def cfg():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["bert"]).hf_config


def test_registered_and_declared_an_encoder():
    ov = get_overlay("BertForMaskedLM")
    assert isinstance(ov, BertOverlay) and ov.encoder is ENCODER and ov.norm_weight_offset == 0.0
    assert ENCODER.pooling_task == "token_classify" and ENCODER.hf_class == "AutoModelForMaskedLM"
    assert FAMILIES["bert"].architecture == "BertForMaskedLM"


def test_module_paths_are_vllms_bert_tree(cfg):
    import vllm

    src = (Path(vllm.__file__).parent / "model_executor/models/bert.py").read_text()
    specs = BertOverlay().hook_specs(cfg)
    # every attribute the paths walk is one vLLM's modules assign
    attrs = {a for s in specs.values() for a in s.module.split(".") if not a.isdigit()}
    missing = [a for a in attrs if f"self.{a} =" not in src]
    assert not missing, missing
    assert specs["blocks.1.hook_in"].module == "bert.encoder.layer.1"
    assert specs["unembed.hook_out"].module == "mlm_head.decoder"


def test_post_ln_reads_and_unfolds(cfg):
    specs = BertOverlay().hook_specs(cfg)
    ln1 = "bert.encoder.layer.0.attention.output.LayerNorm"
    assert (specs["blocks.0.ln1.hook_in"].module, specs["blocks.0.ln1.hook_in"].read) == (ln1, "in[0]")
    assert specs["blocks.0.ln1.hook_normalized"].convert == (UnfoldNorm(f"{ln1}.weight", bias=f"{ln1}.bias"),)
    assert specs["blocks.0.attn.hook_out"].read == "out"  # the attention module's output is ln1's
    ln2 = "bert.encoder.layer.0.output.LayerNorm"
    assert (specs["blocks.0.hook_resid_mid"].module, specs["blocks.0.hook_resid_mid"].read) == (ln2, "in[0]")
    assert (specs["blocks.0.mlp.hook_out"].module, specs["blocks.0.mlp.hook_out"].read) == (
        "bert.encoder.layer.0.output.dense", "out[0]")  # before the add, where TL's hook_mlp_out is
    assert specs["blocks.2.hook_out"].read == "out" and "ln_final.hook_normalized" in specs
    order = list(specs)
    assert order.index("blocks.0.ln1.hook_in") < order.index("blocks.0.attn.hook_out") < order.index(
        "blocks.0.mlp.hook_in") < order.index("blocks.0.hook_resid_mid") < order.index("blocks.0.hook_out")
    assert order[:5] == ["embed.hook_out", "pos_embed.hook_out", "token_type_embed.hook_out", "embed_ln.hook_in",
                         "embed_ln.hook_normalized"]
    assert order[-3:] == ["mlm_head.hook_out", "ln_final.hook_normalized", "unembed.hook_out"]


def test_qkv_columns_and_heads(cfg):
    specs = BertOverlay().hook_specs(cfg)
    q, k, v = (specs[f"blocks.1.attn.hook_{x}"].convert for x in "qkv")
    assert (q[0].start, q[0].stop, k[0].start, k[0].stop, v[0].start, v[0].stop) == (0, 128, 128, 256, 256, 384)
    assert (q[1].n_heads, q[1].head_dim) == (4, 32) and specs["blocks.1.attn.hook_z"].read == "in[0]"


def test_references_that_hold_no_equal_tensor(cfg):
    specs = BertOverlay().hook_specs(cfg)
    assert specs["embed.hook_out"].reference_name("compat", "hook_embed") is None
    for h in ("blocks.0.hook_in", "blocks.0.attn.hook_out", "blocks.0.hook_resid_mid", "blocks.0.hook_out"):
        assert specs[h].reference_name("compat-processed", "x") is None, h
    assert specs["blocks.0.mlp.hook_out"].reference_name("compat-processed", "x") == "x"


def test_derived_attention_is_bidirectional(cfg):
    derived = BertOverlay().derived_specs(cfg)
    assert set(derived) == {f"blocks.{i}.attn.hook_{k}" for i in range(3) for k in ("attn_scores", "pattern")}
    d = derived["blocks.1.attn.hook_pattern"]
    assert d.causal is False and d.window is None and d.scale == pytest.approx(32 ** -0.5)
    assert d.inputs == ("blocks.1.attn.hook_q", "blocks.1.attn.hook_k") and "bidirectional" in d.describe()


def test_nonfiring_layer_norm_scales_carry_the_reason():
    nf = {n.template: n.reason for n in BertOverlay().nonfiring()}
    assert set(nf) == {"embed_ln.hook_scale", "blocks.{i}.ln1.hook_scale", "blocks.{i}.ln2.hook_scale",
                       "ln_final.hook_scale"}
    assert all("fused layer_norm" in r for r in nf.values())


def test_serving_shapes_that_do_not_apply_say_why_in_vllms_words():
    assert ENCODER.why_not("single") is None
    assert "do not support prefix caching" in ENCODER.why_not("prefix-cache")
    assert "do not support chunked prefill" in ENCODER.why_not("chunked")
    assert "generates no tokens" in ENCODER.why_not("decode") and "generates no tokens" in ENCODER.why_not("preempt")
    from harness.engines.serving import SCHEMES

    assert {s for s in SCHEMES if ENCODER.why_not(s)} == set(SCHEMES) - {"single"}


@pytest.mark.parametrize("n, types", [(7, [0, 0, 0, 1, 1, 1, 1]), (2, [0, 1]), (1, [0])])
def test_token_types_are_zeros_then_ones(n, types):
    assert ENCODER.token_types(n) == types
    assert Encoder(second_segment=None).token_types(n) is None


def test_a_second_segment_outside_the_prompt_is_refused():
    with pytest.raises(ValueError, match="not in \\(0, 1\\)"):
        Encoder(second_segment=1.0)
