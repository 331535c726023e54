"""Mixtral overlay: the Llama tree with a sparse mixture-of-experts block.

vLLM's ``MixtralDecoderLayer`` (``model.layers.{i}``) is Llama-shaped --
``input_layernorm``, ``self_attn`` (fused ``qkv_proj`` -> ``rotary_emb`` ->
``attn`` -> ``o_proj``), the fused add-norm ``post_attention_layernorm`` and a
``(delta, residual)`` return -- so the residual-stream, norm and attention
hooks are :mod:`overlays.decoder_only`'s.  The feed-forward is
``block_sparse_moe`` (``MixtralMoE``): a router ``gate`` (``GateLinear``,
returns ``(logits, None)``) and ``experts`` (``MoERunner`` over ``FusedMoE``
with 3-D ``w13`` / ``w2`` expert weights).  Hook by hook:

- ``mlp.hook_in`` / ``mlp.hook_out`` are the MoE block's input and output
  (the weighted sum over the top-k experts), as TransformerBridge's
  ``MoEBridge`` takes them.
- ``mlp.gate.hook_out`` is the router logits ``[T, n_experts]`` (before
  softmax / top-k): ``gate``'s ``out[0]``; the bridge's ``MoERouterBridge``
  fires its ``hook_out`` on the same logits.
- Non-firing, per expert: ``mlp.hook_pre`` / ``hook_pre_linear`` /
  ``hook_post`` would be one ``[T, d_mlp]`` tensor in a dense MLP; here each
  token's gate/up/activation exist only per (token, selected expert) inside
  the fused-MoE kernel, never as one tensor.  (TransformerBridge's
  ``MoEBridge`` aliases ``mlp.hook_pre`` / ``hook_post`` to the block's
  ``hook_in`` / ``hook_out``, which are compared under those names.)
- Non-firing, routing: ``mlp.gate.hook_expert_weights`` /
  ``hook_expert_indices`` (and the block-level aliases) are the softmax /
  top-k / renormalize results.  vLLM computes them in
  ``FusedMoERouter.select_experts``, a plain method of a non-module router
  object called inside ``MoERunner``: no module boundary ever holds them.
  The router logits they are computed from *are* compared.
"""
from __future__ import annotations

from typing import Any

from .base import HookSpec, NonFiring, config_get
from .decoder_only import DecoderOnlyOverlay

_PER_EXPERT = ("per expert: vLLM's fused-MoE kernel computes gate/up/activation per (token, selected expert) pair "
               "from 3-D expert weights; no single [T, d_mlp] tensor exists (TransformerBridge's MoEBridge aliases "
               "this name to the MoE block's hook_in/hook_out, compared as mlp.hook_in/mlp.hook_out)")
_ROUTING = ("vLLM's top-k routing runs in FusedMoERouter.select_experts, a method of a plain (non-nn.Module) "
            "router object inside MoERunner: the routing weights / expert ids never cross a module boundary "
            "(the router logits they come from are compared as mlp.gate.hook_out)")


class SparseMoEOverlay(DecoderOnlyOverlay):
    """Llama-shaped tree whose MLP is a sparse MoE block (router ``gate`` + fused ``experts``)."""

    name = "sparse_moe"
    moe_module = "block_sparse_moe"  # the MoE block's attribute on the decoder layer

    def dims(self, cfg: Any) -> dict[str, Any]:
        return {**super().dims(cfg),
                "n_experts": int(config_get(cfg, "num_local_experts", "num_experts"))}

    def layer_specs(self, i: int, d: dict[str, Any]) -> dict[str, HookSpec]:
        b, D = f"blocks.{i}", d["d_model"]
        moe = f"model.layers.{i}.{self.moe_module}"
        moe_specs = {
            f"{b}.mlp.hook_in": HookSpec(moe, "in[0]", width=D),
            f"{b}.mlp.gate.hook_out": HookSpec(f"{moe}.gate", "out[0]", width=d["n_experts"]),
            f"{b}.mlp.hook_out": HookSpec(moe, "out", width=D),
        }
        dense_inner = {f"{b}.mlp.hook_pre", f"{b}.mlp.hook_pre_linear", f"{b}.mlp.hook_post"}
        out: dict[str, HookSpec] = {}
        for hook, spec in super().layer_specs(i, d).items():
            if hook == f"{b}.mlp.hook_in":
                out[hook] = moe_specs[hook]
                out[f"{b}.mlp.gate.hook_out"] = moe_specs[f"{b}.mlp.gate.hook_out"]
            elif hook == f"{b}.mlp.hook_out":
                out[hook] = moe_specs[hook]
            elif hook not in dense_inner:
                out[hook] = spec
        return out

    def nonfiring(self) -> list[NonFiring]:
        per_expert = ("hook_pre", "hook_pre_linear", "hook_post")
        routing = ("gate.hook_expert_weights", "gate.hook_expert_indices", "hook_expert_weights",
                   "hook_expert_indices")
        return ([NonFiring(f"blocks.{{i}}.mlp.{h}", _PER_EXPERT) for h in per_expert]
                + [NonFiring(f"blocks.{{i}}.mlp.{h}", _ROUTING) for h in routing])


class MixtralOverlay(SparseMoEOverlay):
    """Mixtral: Llama tree, MoE block at ``block_sparse_moe`` (router ``gate``, fused experts)."""

    name = "mixtral"
    moe_module = "block_sparse_moe"


__all__ = ["MixtralOverlay", "SparseMoEOverlay"]
