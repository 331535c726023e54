"""overlays.generic: the seed's generic decoder overlay, found by module role in vLLM's tree (pure; the engine
run is tests/engine/test_generic_overlay.py)."""
from __future__ import annotations

import pytest

from overlays.base import DropBatch
from overlays.generic import GenericDecoderOverlay, NotStandardShape, find_layout


def _tree(layers="model.layers", n=3, attn="self_attn", mlp="mlp", norm="model.norm"):
    out = [("model", "XModel"), ("model.embed_tokens", "VocabParallelEmbedding"), (layers, "ModuleList")]
    for i in range(n):
        out += [(f"{layers}.{i}", "XDecoderLayer"), (f"{layers}.{i}.{attn}", "XAttention"),
                (f"{layers}.{i}.{attn}.rotary_emb", "RotaryEmbedding"), (f"{layers}.{i}.{mlp}", "XMLP"),
                (f"{layers}.{i}.input_layernorm", "RMSNorm")]
    return out + ([(norm, "RMSNorm")] if norm else []) + [("logits_processor", "LogitsProcessor")]


def test_the_standard_shape_is_found_by_role():
    lay = find_layout(_tree(attn="attention", mlp="feed_forward"))
    assert (lay.embed, lay.layers, lay.n_layers, lay.attention, lay.mlp, lay.final_norm) == (
        "model.embed_tokens", "model.layers", 3, "attention", "feed_forward", "model.norm")


def test_what_is_missing_is_named():
    with pytest.raises(NotStandardShape, match=r"final norm beside the layers \(model.norm\)"):
        find_layout(_tree(norm=None))
    with pytest.raises(NotStandardShape, match="an MLP child in model.layers.0"):
        find_layout([x for x in _tree() if not x[0].endswith(".mlp")])
    with pytest.raises(NotStandardShape, match="list of decoder layers"):
        find_layout([("model.embed_tokens", "VocabParallelEmbedding")])


def test_the_seed_hooks_native_and_on_the_transformers_backend():
    cfg = {"hidden_size": 128, "vocab_size": 512}
    native = GenericDecoderOverlay(find_layout(_tree())).hook_specs(cfg)
    assert native["blocks.1.hook_out"].read == "out[0]+out[1]" and native["embed.hook_out"].convert == ()
    assert {h.split(".", 2)[-1] if h.startswith("blocks") else h for h in native} == {
        "embed.hook_out", "hook_out", "attn.hook_out", "mlp.hook_out", "ln_final.hook_normalized", "unembed.hook_out"}
    hf = GenericDecoderOverlay(find_layout(_tree(), hf_modules=True), declared_kinds=23)
    specs = hf.hook_specs(cfg)
    assert specs["blocks.1.hook_out"].read == "out[0]" and specs["blocks.1.hook_out"].convert == (DropBatch(),)
    assert "generic decoder overlay" in hf.name and "against 23" in hf.name
    assert any(nf.template == "blocks.{i}.attn.hook_q" for nf in hf.nonfiring())
