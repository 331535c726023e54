"""GPT-OSS overlay (``GptOssForCausalLM``, vLLM's native model): the Llama stream with attention sinks,
alternating sliding windows and a biased, clamped-SwiGLU MoE -- the :data:`GPT_OSS` row.

vLLM's ``TransformerBlock`` (``model.layers.{i}``) is Llama-shaped around its sublayers: fused add-norm
``input_layernorm`` / ``post_attention_layernorm`` (vLLM ``RMSNorm``, eps hard-coded 1e-5: the family
row sets the config's to match) and a ``(delta, residual)`` return, so the stream and norm hooks are
:mod:`overlays.decoder_only`'s.  What differs, hook by hook:

- Module names: the embedding is ``model.embedding``; attention is ``attn`` (``OAIAttention``:
  ``qkv_proj`` with q/k/v biases, ``rotary_emb`` (yarn, NeoX halves, always: vLLM builds it from the
  config's yarn keys), the inner ``attn``, ``o_proj`` with a bias); the MoE block ``mlp``
  (``MLPBlock``) with its router ``router`` and runner ``experts``.
- Attention sinks: one learned logit per head (``attn.sinks``) joins the softmax as an extra key
  column, then is dropped, so every real key's weight shrinks by the sink's share.  Scores
  ``q k^T * scale`` (causal, and the sliding window on even layers) are derived from the rotated q/k
  as usual: the sink enters only after them (TransformerLens's ``hook_attn_scores`` is taken there
  too).  The pattern is *not* derived: the derivation has no sink column, and vLLM's kernel keeps the
  sink inside its softmax; it is declared non-firing with that reason.
- Sliding window: vLLM applies ``sliding_window`` to even layers (``layer_idx % 2 == 0``), HF's
  default ``layer_types`` makes the same layers ``sliding_attention`` (the derived scores read
  ``layer_types``).
- Router: ``mlp.router`` (``GateLinear`` with a bias, ``return_bias=False``: one tensor); its logits are
  ``mlp.gate.hook_out`` here, TransformerLens's ``mlp.router.hook_out``: the plan compares the
  canonical-name bridge under the hook's own name only, so the router rows are compatibility mode's,
  under TransformerLens's name (``references``), and have no ragged-batch row.  Routing: top-k
  logits, softmaxed over the chosen k (HF's ``GptOssTopKRouter``; vLLM's ``renormalize=True``): the
  router's choice (``mlp.gate.hook_expert_weights`` / ``hook_expert_indices``) at the runner's route
  tap, TransformerLens's ``mlp.router.hook_expert_*``.
- Experts: biased gate/up and down projections, ``swigluoai`` activation (gate clamped above at
  ``swiglu_limit``, up clamped to ``±limit``, ``gate * sigmoid(alpha * gate) * (up + 1)``) inside the
  fused-MoE kernel: per-expert hooks non-firing (:data:`overlays.mixtral.MOE_NONFIRING`).
  ``mlp.hook_out`` is the block's output (HF's ``GptOssMLP`` returns ``(output, router scores)``;
  the bridge's ``hook_out`` is the output).
- No ``compat-processed`` rows (``Tree.refused_references``): TransformerLens 4.3.0's weight processing folds the
  value biases into ``b_O`` (``fold_value_biases``), which holds only where each query's attention weights over
  the real keys sum to 1; a sink takes part of the softmax mass, so the processed model's ``hook_z`` and every
  hook after layer 0's attention are not the model's (its ``hook_q`` / ``hook_k`` / pattern equal the unprocessed
  bridge's, ``hook_v`` and ``hook_z`` do not: docs/evidence.md, 2026-12-03).  The bridge, compatibility mode
  and HF gate every hook.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .mixtral import MOE_NONFIRING
from .tree import MOE, Mlp, TreeOverlay

_NO_PATTERN = ("GPT-OSS's learned per-head attention sink joins vLLM's softmax inside its attention kernel (an extra "
               "key column, dropped after), so the pattern never exists as a tensor, and the derivation from the "
               "rotated q/k has no sink column: not derived (the derived scores, before the sink, are compared)")

# TransformerLens's GPT-OSS adapter names the router mlp.router (its MoERouterBridge hooks): compared in compatibility
# mode under that name; the canonical-name bridge has no mlp.gate (harness.values.plan compares the bridge under the
# hook's own name only), so those rows are the compatibility mode's
_ROUTER = tuple((f"mlp.gate.{h}", (("bridge", None), ("compat", f"blocks.{{i}}.mlp.router.{h}")))
                for h in ("hook_out", "hook_expert_weights", "hook_expert_indices"))

GPT_OSS = replace(
    DECODER, name="gpt_oss", embed="embedding",
    attention=replace(DECODER.attention, module="attn"),
    mlp=Mlp(kind=MOE, module="mlp", router="router"),
    references=_ROUTER,
    nonfiring=(NonFiring("blocks.{i}.attn.hook_pattern", _NO_PATTERN), *MOE_NONFIRING),
    refused_references=("compat-processed",),
    scores_not_in_hf=("HF's eager GPT-OSS attention appends the sink column and subtracts each row's maximum before its "
                      "softmax, so the scores never exist there as a tensor of their own"),
)


class GptOssOverlay(TreeOverlay):
    """GPT-OSS: attention sinks (scores derived, pattern not), alternating sliding window, biased MoE router."""

    tree = GPT_OSS


__all__ = ["GPT_OSS", "GptOssOverlay"]
