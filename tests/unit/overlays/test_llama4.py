"""Llama-4 text (overlays/llama4.py), engine-free: the q/k rows vLLM permutes and the inverse DeInterleave that undoes
it, the chunked mask of the derived scores (Derived.chunk), interleaved MoE layers (Tree.sparse_layers), and the HF
router's choice as the reference reads it."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from harness.comparison.conversions import apply_one
from harness.comparison.derived import attention_pattern, derive, visible_keys
from harness.models.families import FAMILIES
from harness.references.reference import _router_choice_hooks
from overlays import get_overlay
from overlays.base import DeInterleave, Derived, Heads
from overlays.llama4 import LLAMA4
from overlays.mixtral import MOE_NONFIRING


@pytest.fixture(scope="module")
def cfg():
    return AutoConfig.for_model("llama4_text", **FAMILIES["llama4_text"].hf_config_kwargs())


def _vllm_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """vLLM's Llama4ForCausalLM.permute_qk_weight_for_rotary on a [n_heads * head_dim, d] weight."""
    f_out, f_in = w.shape
    return w.view(n_heads, f_out // n_heads // 2, 2, f_in).transpose(1, 2).reshape(f_out, f_in)


def test_inverse_deinterleave_undoes_vllms_qk_permutation():
    gen = torch.Generator().manual_seed(0)
    heads, hd, d = 4, 32, 16
    w, x = torch.randn(heads * hd, d, generator=gen), torch.randn(5, d, generator=gen)
    hf_q = (x @ w.T).view(5, heads, hd)
    vllm_q = (x @ _vllm_permute(w, heads).T).view(5, heads, hd)
    assert not torch.allclose(vllm_q, hf_q)
    back = apply_one(DeInterleave(0, hd, inverse=True), vllm_q, {})
    assert torch.equal(back, hf_q)
    assert torch.equal(apply_one(DeInterleave(0, hd), back, {}), vllm_q)  # the two directions are inverses
    assert DeInterleave(0, 4, inverse=True).describe().endswith("halves -> pairs")


def test_visible_keys_chunk():
    seen = visible_keys(6, chunk=4)
    assert seen[5].tolist() == [False, False, False, False, True, True]
    assert seen[3].tolist() == [True, True, True, True, False, False]
    assert torch.equal(visible_keys(6), visible_keys(6, chunk=None))


def test_derived_pattern_is_chunked():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(10, 4, 8, generator=gen), torch.randn(10, 2, 8, generator=gen)
    spec = Derived("pattern", ("q", "k"), scale=8 ** -0.5, chunk=4)
    p = derive(spec, {"q": q, "k": k})
    assert torch.all(p[:, 5, :4] == 0) and torch.allclose(p[:, 5, 4:6].sum(-1), torch.ones(4, dtype=p.dtype))
    assert torch.equal(p[:, :4, :4], attention_pattern(q[:4], k[:4], scale=8 ** -0.5))
    assert "chunk=4" in spec.describe()


def test_specs(cfg):
    overlay = get_overlay("Llama4ForCausalLM")
    assert overlay.tree is LLAMA4
    specs, derived = overlay.hook_specs(cfg), overlay.derived_specs(cfg)
    assert cfg.moe_layers == [1] and cfg.layer_types == ["chunked_attention", "chunked_attention", "full_attention"]
    # q / k re-interleaved on every layer (vLLM permutes them all), v not
    for i in range(3):
        assert specs[f"blocks.{i}.attn.hook_q"].convert[-1] == DeInterleave(0, 32, inverse=True)
        assert specs[f"blocks.{i}.attn.hook_k"].convert[-1] == DeInterleave(0, 32, inverse=True)
        assert specs[f"blocks.{i}.attn.hook_v"].convert[-1] == Heads(2, 32)
        rot = specs[f"blocks.{i}.attn.hook_rot_q"]
        assert (rot.module, rot.read) == (f"model.layers.{i}.self_attn.attn", "in[0]")
        assert all(name is None for _, name in rot.references)
    # chunked mask on the rope layers only
    assert [derived[f"blocks.{i}.attn.hook_pattern"].chunk for i in range(3)] == [128, 128, None]
    # dense, MoE, dense
    assert specs["blocks.0.mlp.hook_pre"].module == "model.layers.0.feed_forward.gate_up_proj"
    assert specs["blocks.0.mlp.hook_pre"].width == 256 and "blocks.2.mlp.hook_post" in specs
    assert specs["blocks.1.mlp.gate.hook_out"].module == "model.layers.1.feed_forward.router"
    assert specs["blocks.1.mlp.gate.hook_expert_indices"].module == "model.layers.1.feed_forward.experts.vp_route"
    assert specs["blocks.1.mlp.shared_expert.hook_pre"].width == 64
    assert "blocks.1.mlp.hook_pre" not in specs and "blocks.0.mlp.gate.hook_out" not in specs
    listed = {nf.template for nf in overlay.nonfiring_for(cfg)}
    assert {t.template.replace("{i}", "1") for t in MOE_NONFIRING} <= listed
    assert not any(t.startswith(("blocks.0.mlp.", "blocks.2.mlp.")) for t in listed)


def test_hf_router_choice_read():
    class Router(torch.nn.Linear):  # HF's Llama4Router: (sigmoid scores at the top-k ids, 0 elsewhere; logits)
        top_k = 1

        def forward(self, x):
            logits = super().forward(x)
            top, ids = torch.topk(logits, self.top_k, dim=1)
            scores = torch.full_like(logits, float("-inf")).scatter_(1, ids, top)
            return torch.sigmoid(scores), logits

    layer = torch.nn.Module()
    layer.feed_forward = torch.nn.Module()
    layer.feed_forward.router = Router(8, 4, bias=False)
    caps: dict[str, torch.Tensor] = {}
    handles = _router_choice_hooks(layer, 1, caps)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2))
    scores, logits = layer.feed_forward.router(x)
    for h in handles:
        h.remove()
    assert torch.equal(caps["blocks.1.mlp.gate.hook_expert_weights"][0], scores)
    assert torch.equal(caps["blocks.1.mlp.gate.hook_expert_indices"][0], logits.argmax(-1, keepdim=True))
