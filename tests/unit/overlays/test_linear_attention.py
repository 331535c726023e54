"""Qwen3-Next / Qwen3.5 (overlays/qwen3_next.py, overlays/qwen3_5.py, Tree.gdn_mixer, Attention.output_gate): engine-free.

The GDN reads are checked against HF's own split of the same projection outputs (Qwen3-Next's
``fix_query_key_value_ordering``, Qwen3.5's column split), so a wrong group layout fails here without vLLM."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from harness.comparison.conversions import convert
from harness.models.families import resolve_families
from overlays import get_overlay
from overlays.base import Cols, Flatten, Heads
from overlays.qwen3_next import QWEN3_NEXT

GDN_INNER = ("hook_q_pre_conv", "hook_k_pre_conv", "hook_v_pre_conv", "hook_beta_logit", "hook_recurrence_out",
             "hook_gate_input")


def _cfg(name: str):
    spec = resolve_families(name)[0]
    return AutoConfig.for_model(spec.model_type, **spec.config)


@pytest.mark.parametrize("name, arch", [("qwen3_next", "Qwen3NextForCausalLM"), ("qwen3_5", "Qwen3_5ForCausalLM"),
                                        ("qwen3_5_moe", "Qwen3_5MoeForCausalLM")])
def test_mixer_layers_offer_gdn_hooks_and_attention_layers_attention(name, arch):
    cfg, ov = _cfg(name), get_overlay(arch)
    specs = ov.hook_specs(cfg)
    nonfiring = {nf.template for nf in ov.nonfiring_for(cfg)}
    for i in (0, 2):  # linear_attention layers
        assert not any(h.startswith(f"blocks.{i}.attn.") for h in specs)
        for h in GDN_INNER:
            spec = specs[f"blocks.{i}.linear_attn.{h}"]
            assert dict(spec.references) == {"bridge": None, "hf": f"blocks.{i}.linear_attn.{h}"}
        assert specs[f"blocks.{i}.linear_attn.hook_in"].module == f"model.layers.{i}.linear_attn"
        assert {f"blocks.{i}.attn.hook_q", f"blocks.{i}.attn.hook_pattern", f"blocks.{i}.linear_attn.hook_beta",
                f"blocks.{i}.linear_attn.hook_q"} <= nonfiring
    assert not any(h.startswith("blocks.1.linear_attn.") for h in specs)
    assert {"blocks.1.linear_attn.hook_in", "blocks.1.linear_attn.hook_log_decay"} <= nonfiring
    assert "blocks.1.attn.hook_pattern" in ov.derived_specs(cfg)
    assert set(ov.derived_specs(cfg)) == {"blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern"}
    # every offered hook is captured or declared, never both
    assert not set(specs) & nonfiring


def test_gated_attention_q_is_tl_whole_projection_and_gate_second_half():
    cfg = _cfg("qwen3_next")
    specs = get_overlay("Qwen3NextForCausalLM").hook_specs(cfg)
    H, hd, kv = 4, 32, 2 * 32
    qkv = torch.arange(7 * (2 * H * hd + 2 * kv), dtype=torch.float32).view(7, -1)
    q = convert(specs["blocks.1.attn.hook_q"], qkv, {})
    assert q.shape == (7, 2 * H, hd) and torch.equal(q.flatten(1), qkv[:, :2 * H * hd])
    gate = convert(specs["blocks.1.attn.hook_q_gate"], qkv, {})
    per_head = qkv[:, :2 * H * hd].view(7, H, 2 * hd)
    assert torch.equal(gate, per_head[..., hd:].flatten(1))
    assert torch.equal(convert(specs["blocks.1.attn.hook_k"], qkv, {}).flatten(1), qkv[:, 2 * H * hd:2 * H * hd + kv])
    assert specs["blocks.1.attn.hook_z"].module == "model.layers.1.self_attn.o_proj"


def test_qwen3_next_reads_equal_hf_fix_query_key_value_ordering():
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet
    cfg = _cfg("qwen3_next")
    hf = Qwen3NextGatedDeltaNet(cfg, layer_idx=0)
    specs = get_overlay("Qwen3NextForCausalLM").hook_specs(cfg)
    gen = torch.Generator().manual_seed(0)
    qkvz = torch.randn(1, 5, hf.in_proj_qkvz.out_features, generator=gen)
    ba = torch.randn(1, 5, hf.in_proj_ba.out_features, generator=gen)
    q, k, v, _, b, _ = hf.fix_query_key_value_ordering(qkvz, ba)
    for name, want, raw in (("q", q, qkvz), ("k", k, qkvz), ("v", v, qkvz)):
        got = convert(specs[f"blocks.0.linear_attn.hook_{name}_pre_conv"], raw[0], {})
        assert torch.equal(got, want[0]), name
    assert torch.equal(convert(specs["blocks.0.linear_attn.hook_beta_logit"], ba[0], {}), b[0])


def test_qwen3_5_reads_are_flat_columns():
    cfg = _cfg("qwen3_5")
    specs = get_overlay("Qwen3_5ForCausalLM").hook_specs(cfg)
    nk, nv, d = 2, 4, 64
    K, V = nk * d, nv * d
    qkvz = torch.randn(5, 2 * K + 2 * V)
    assert torch.equal(convert(specs["blocks.0.linear_attn.hook_k_pre_conv"], qkvz, {}), qkvz[:, K:2 * K].view(5, nk, d))
    assert torch.equal(convert(specs["blocks.0.linear_attn.hook_v_pre_conv"], qkvz, {}),
                       qkvz[:, 2 * K:2 * K + V].view(5, nv, d))
    ba = torch.randn(5, 2 * nv)
    assert torch.equal(convert(specs["blocks.0.linear_attn.hook_beta_logit"], ba, {}), ba[:, :nv])
    assert specs["blocks.1.mlp.hook_pre"].module == "model.layers.1.mlp.gate_up_proj"


def test_flatten_conversion():
    x = torch.arange(24.).view(2, 3, 4)
    assert convert(type("S", (), {"convert": (Flatten(-2, -1),)})(), x, {}).shape == (2, 12)
    assert Flatten(1, 2).describe() == "x.flatten(1, 2)"
    spec = type("S", (), {"convert": (Heads(2, 4), Cols(0, 2), Flatten(-2, -1))})()
    assert torch.equal(convert(spec, torch.arange(16.).view(2, 8), {}), torch.tensor([[0., 1, 4, 5], [8, 9, 12, 13]]))


def test_rows_and_refusals():
    rows = {s.name: s for s in resolve_families("qwen3_next,qwen3_5,qwen3_5_moe")}
    assert set(rows["qwen3_next"].unsupported_dtypes) == {"float32", "float16"}
    assert rows["qwen3_next"].dtype_refusal_on("float32", "cpu").says == "CPU GDN attention requires BF16."
    for name, config in (("qwen3_5", "qwen3_5.Qwen3_5Config"), ("qwen3_5_moe", "qwen3_5_moe.Qwen3_5MoeConfig")):
        cpu, cuda = rows[name].refusal_on("cpu"), rows[name].refusal_on("cuda")
        assert cpu.probe == "import:vllm.model_executor.models.qwen3_5" and cpu.devices == ("cpu",)
        assert "failed to be inspected" in cpu.reason and not cpu.says
        # vLLM 0.20.2 (CUDA) boots and refuses the text-only config: its own words, re-checked by the boot
        assert cuda.probe == "boot" and cuda.devices == ("cuda",) and cuda.says in cuda.reason
        assert cuda.says.startswith("Invalid type of HuggingFace config.") and config in cuda.says
    assert QWEN3_NEXT.gdn_mixer.layout == "interleaved"


def test_prefix_cache_declared_not_applicable_on_the_hybrid_only():
    from types import SimpleNamespace

    from harness.pipeline.runner import not_applicable
    from overlays.qwen3_next import PREFIX_CACHE_BLOCK
    target = SimpleNamespace(name="qwen3_next", overlay=get_overlay("Qwen3NextForCausalLM"))
    assert PREFIX_CACHE_BLOCK in not_applicable(target, SimpleNamespace(serving="prefix-cache"))
    assert not_applicable(target, SimpleNamespace(serving="decode")) is None
    assert not_applicable(target, SimpleNamespace(serving="chunked")) is None
    llama = SimpleNamespace(name="llama", overlay=get_overlay("LlamaForCausalLM"))
    assert not_applicable(llama, SimpleNamespace(serving="prefix-cache")) is None
