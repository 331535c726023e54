"""Mixtral overlay: the Llama tree with a sparse mixture-of-experts block (the :data:`MIXTRAL` row).

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
- The router's choice: ``mlp.gate.hook_expert_weights`` (``[T, n_experts]``,
  each chosen expert's weight at its id, 0 elsewhere) and
  ``mlp.gate.hook_expert_indices`` (``[T, k]``, ids sorted ascending: compared as
  sets).  vLLM computes them in ``router.select_experts``, a method of a plain
  (non-module) router object inside ``MoERunner``; the worker routes that
  call through a child module of the runner, ``experts.vp_route``
  (harness.engines.route_tap), whose output the hooks read.  The block-level
  aliases (``mlp.hook_expert_*``) are non-firing: the same tensors.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .tree import MOE, Mlp, TreeOverlay

_PER_EXPERT = ("per expert: vLLM's fused-MoE kernel computes gate/up/activation per (token, selected expert) pair "
               "from 3-D expert weights; no single [T, d_mlp] tensor exists (TransformerBridge's MoEBridge aliases "
               "this name to the MoE block's hook_in/hook_out, compared as mlp.hook_in/mlp.hook_out)")
_ALIAS = ("TransformerBridge's block-level alias of the router's mlp.gate.hook_expert_weights / "
          "hook_expert_indices (the same tensor), compared under the router's name")

# every sparse-MoE row declares these (the dense MLP's inner hooks and the routing results)
MOE_NONFIRING = (
    *(NonFiring(f"blocks.{{i}}.mlp.{h}", _PER_EXPERT) for h in ("hook_pre", "hook_pre_linear", "hook_post")),
    *(NonFiring(f"blocks.{{i}}.mlp.{h}", _ALIAS) for h in ("hook_expert_weights", "hook_expert_indices")),
)

MIXTRAL = replace(DECODER, name="mixtral", mlp=Mlp(kind=MOE, module="block_sparse_moe"), nonfiring=MOE_NONFIRING)


class MixtralOverlay(TreeOverlay):
    """Mixtral: Llama tree, MoE block at ``block_sparse_moe`` (router ``gate``, fused experts)."""

    tree = MIXTRAL


__all__ = ["MIXTRAL", "MOE_NONFIRING", "MixtralOverlay"]
