"""LFM2-MoE's rows (overlays/lfm2_moe.py): LFM2's mixers with a dense-then-MoE feed-forward (Tree.dense_layers), the
sigmoid + expert-bias routing whose reference-side bias is read under the checkpoint's own name
(Mlp.routing_bias_checkpoint -> Routing.checkpoint_bias -> harness.pipeline.runner.routing_params), the builder
randomizing HF's zero-initialized expert_bias buffer, and HF's router rule against vLLM's CPU router and the flip rule."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig

from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.base import Routing


def _cfg(name: str):
    return AutoConfig.for_model(FAMILIES[name].model_type, **FAMILIES[name].config)


def test_lfm2_moe_layers_run_a_dense_mlp_then_the_moe_block():
    cfg, ov = _cfg("lfm2_moe_conv"), get_overlay("Lfm2MoeForCausalLM")
    specs = ov.hook_specs(cfg)
    # layer 0 (num_dense_layers 1): the fused [w1 | w3] of width intermediate_size, no LFM2 width adjustment
    pre, lin = specs["blocks.0.mlp.hook_pre"], specs["blocks.0.mlp.hook_pre_linear"]
    assert (pre.module, pre.width, lin.width) == ("model.layers.0.feed_forward.w13", 256, 256)
    assert specs["blocks.0.mlp.hook_post"].module == "model.layers.0.feed_forward.w2"
    assert not any(h.startswith("blocks.0.mlp.gate.") for h in specs)
    for i in (1, 2):  # the MoE layers: router logits and the route tap's choice
        gate = specs[f"blocks.{i}.mlp.gate.hook_out"]
        assert (gate.module, gate.width) == (f"model.layers.{i}.feed_forward.gate", 4)
        assert gate.routing == Routing("sigmoid", 1, 1, f"model.layers.{i}.feed_forward.gate.e_score_correction_bias",
                                       checkpoint_bias=f"model.layers.{i}.feed_forward.expert_bias")
        assert specs[f"blocks.{i}.mlp.gate.hook_expert_indices"].module == \
            f"model.layers.{i}.feed_forward.experts.vp_route"
        assert specs[f"blocks.{i}.mlp.gate.hook_expert_indices"].width == 2
        assert f"blocks.{i}.mlp.hook_pre" not in specs
    non = {n.template for n in ov.nonfiring_for(cfg)}
    assert {"blocks.1.mlp.hook_pre", "blocks.2.mlp.hook_post"} <= non and "blocks.0.mlp.hook_pre" not in non
    # the mixers are LFM2's: short-conv on every layer here, attention on layer 1 of lfm2_moe
    assert specs["blocks.1.conv.in.hook_out"].module == "model.layers.1.short_conv.in_proj"
    attn = get_overlay("Lfm2MoeForCausalLM").hook_specs(_cfg("lfm2_moe"))
    assert attn["blocks.1.attn.hook_rot_q"].module == "model.layers.1.self_attn.attn"


def test_routing_params_reads_the_bias_under_the_checkpoints_name(tmp_path):
    from safetensors.torch import save_file

    from harness.pipeline.runner import routing_params

    bias = torch.tensor([0.1, -0.2, 0.3, 0.0])
    save_file({"model.layers.1.feed_forward.expert_bias": bias,
               "model.layers.1.feed_forward.gate.weight": torch.zeros(4, 8)}, str(tmp_path / "model.safetensors"))
    engine = "model.layers.1.feed_forward.gate.e_score_correction_bias"
    renamed = SimpleNamespace(routing=Routing("sigmoid", bias=engine,
                                              checkpoint_bias="model.layers.1.feed_forward.expert_bias"))
    same = SimpleNamespace(routing=Routing("sigmoid", bias="model.layers.1.feed_forward.gate.weight"))
    params = routing_params(SimpleNamespace(specs={"a": renamed, "b": same, "c": SimpleNamespace(routing=None)}),
                            tmp_path, "float32")
    assert set(params) == {engine, "model.layers.1.feed_forward.gate.weight"}  # keyed by the engine's names
    torch.testing.assert_close(params[engine], bias)


def test_the_builder_randomizes_hfs_zero_expert_bias_buffer():
    from transformers import Lfm2MoeForCausalLM

    from harness.models.checkpoints import randomize_

    model = Lfm2MoeForCausalLM(_cfg("lfm2_moe_conv"))
    assert not model.model.layers[1].feed_forward.expert_bias.any()
    randomize_(model, FAMILIES["lfm2_moe_conv"])
    for i in (1, 2):
        assert model.model.layers[i].feed_forward.expert_bias.abs().min() > 0


@pytest.mark.parametrize("seed", range(4))
def test_hfs_router_is_vllms_cpu_grouped_topk_and_the_flip_rules_choice(seed):
    """HF's Lfm2MoeTopKRouter (sigmoid, + expert_bias for the choice, renormalized with +1e-6, x scale) against
    vLLM's CPU _grouped_topk over one group (what Lfm2MoeSparseMoeBlock asks for) and the flip rule's chosen()."""
    from transformers.models.lfm2_moe.modeling_lfm2_moe import Lfm2MoeTopKRouter
    from vllm.model_executor.layers.fused_moe.router.cpu_router import _grouped_topk

    from harness.comparison.routing import chosen

    cfg = _cfg("lfm2_moe_conv")
    gen = torch.Generator().manual_seed(seed)
    router = Lfm2MoeTopKRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=gen) / 128**0.5)
    x, bias = torch.randn(64, 128, generator=gen), 0.1 * torch.randn(4, generator=gen)
    logits, weights, ids = router(x, bias)
    v_weights, v_ids = _grouped_topk(logits, 2, True, 1, 1, "sigmoid", cfg.routed_scaling_factor, bias)
    hf = torch.zeros(64, 4).scatter_(1, ids, weights)
    vllm = torch.zeros(64, 4).scatter_(1, v_ids.long(), v_weights)
    torch.testing.assert_close(vllm, hf, rtol=1e-5, atol=1e-5)  # HF's +1e-6 in the renormalization only
    assert (hf.sum(-1) - cfg.routed_scaling_factor).abs().max() < 1e-4
    mask, _ = chosen(logits, 2, Routing("sigmoid", bias="b"), bias)
    assert torch.equal(mask, hf != 0)
    plain, _ = chosen(logits, 2, Routing("sigmoid"), None)  # the bias changes some choice: it is read
    assert seed or not torch.equal(plain, mask)
