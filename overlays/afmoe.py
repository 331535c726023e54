"""AFMoE overlay (Arcee Trinity, ``AfmoeForCausalLM``, vLLM's native model): sandwich norms, gated
attention with per-head q/k norms, dense-then-sparse layers with a shared expert and sigmoid routing
with an expert bias -- the :data:`AFMOE` row.

vLLM's ``AfmoeDecoderLayer`` (``model.layers.{i}``): fused add-norm ``input_layernorm`` (ln1) and
``pre_mlp_layernorm`` (ln2), plain ``post_attention_layernorm`` / ``post_mlp_layernorm`` after each
sublayer, a ``(delta, residual)`` return -- Gemma-2's sandwich (:data:`overlays.gemma2.GEMMA2`'s norm
places, plain RMS weights).  Hook by hook:

- ``embed.hook_out`` is ``embed_tokens``'s output; with ``mup_enabled`` vLLM and HF multiply it by
  ``sqrt(hidden_size)`` after the module, and TransformerLens's ``embed`` bridge is the module, so
  the embedding hook stays unscaled and ``blocks.0.hook_in`` (the layer's input) carries the scale.
- Attention: fused ``qkv_proj`` (no biases), per-head ``q_norm`` / ``k_norm`` on ``[T, heads,
  head_dim]`` (``QK_PER_HEAD``), ``rotary_emb`` on sliding layers only (the global layers are NoPE: no
  rotary module, vLLM and HF alike), vLLM's attention, then the output times ``sigmoid(gate_proj(x))``
  before ``o_proj``: ``hook_z`` is ``o_proj``'s input, the gated heads (TransformerLens's ``o``
  bridge input, the same tensor).  The q/k norms' ``hook_normalized`` keep HF's ``[T, heads, head_dim]``
  layout (TransformerLens wraps HF's norm there, before HF's transpose: ``qk_norm_heads_first=False``).
  TransformerLens's adapter keeps HF's attention (``maintain_native_attention``) and has no rotated q/k:
  ``hook_rot_q`` / ``hook_rot_k`` make no rows and only feed the derived scores / pattern (as
  :mod:`overlays.gptj`); its ``hook_attn_scores`` holds HF's post-softmax weights, a documented
  reference bug (harness.comparison.known_issues).  The family row makes every layer sliding, so every
  layer rotates (as :mod:`overlays.exaone4`): a NoPE layer's ``hook_rot_q`` / ``hook_rot_k`` would never
  fire, which this row cannot say per layer.
- ``ln1_post`` / ``ln2_post`` carry the legacy ``hook_attn_out`` / ``hook_mlp_out``.
- MLP: layers below ``num_dense_layers`` run a dense gated MLP (``gate_up_proj``; TransformerLens's
  ``dense_gate`` / ``dense_in`` / ``dense_out`` aliases), the rest ``AfmoeMoE``: router ``gate``
  (fp32 logits; HF's ``mlp.router.gate``, TransformerLens's ``mlp.router_gate``), shared experts
  ``mlp.shared_experts.hook_*`` (width ``moe_intermediate_size`` x ``num_shared_experts``, one here),
  the runner ``experts``.  Routing: ``sigmoid(logits) + expert_bias`` chooses the top-k
  (``Mlp.routing_bias``: the block's ``expert_bias``, vLLM's parameter and the checkpoint's name),
  the chosen sigmoid scores renormalized, times ``route_scale``.
- Router rows: the canonical-name bridge has no ``mlp.gate`` and TransformerLens's AFMoE adapter no
  router-choice hooks, so the logits are compared in compatibility mode under
  ``mlp.router_gate.hook_out``, and the choice (``mlp.gate.hook_expert_weights`` /
  ``hook_expert_indices``) against HF's ``mlp.router``, whose ``(logits, weights, ids)`` output
  harness.references.reference scatters as TransformerLens's router hooks hold a choice.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .mixtral import MOE_NONFIRING
from .tree import MOE, QK_PER_HEAD, SIGMOID_BIAS, Mlp, TreeOverlay

_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))  # captured only to derive scores / pattern
_ROUTER = (
    ("attn.hook_rot_q", _NOT_COMPARED), ("attn.hook_rot_k", _NOT_COMPARED),
    ("mlp.gate.hook_out", (("bridge", None), ("compat", "blocks.{i}.mlp.router_gate.hook_out"))),
    *((f"mlp.gate.{h}", (("bridge", None), ("compat", None), ("hf", f"blocks.{{i}}.mlp.gate.{h}")))
      for h in ("hook_expert_weights", "hook_expert_indices")),
)

AFMOE = replace(
    DECODER, name="afmoe",
    attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD, qk_norm_heads_first=False),
    norms=replace(DECODER.norms, ln2="pre_mlp_layernorm", ln1_post="post_attention_layernorm",
                  ln2_post="post_mlp_layernorm"),
    mlp=Mlp(kind=MOE, module="mlp", shared="shared_experts", shared_width="moe_intermediate_size",
            routing=SIGMOID_BIAS, routing_bias="expert_bias"),
    dense_layers="num_dense_layers", dense_mlp=Mlp(),
    references=_ROUTER,
    nonfiring=MOE_NONFIRING,
)


class AfmoeOverlay(TreeOverlay):
    """AFMoE: sandwich norms, gated attention with q/k norms, dense then MoE layers with a shared expert."""

    tree = AFMOE


__all__ = ["AFMOE", "AfmoeOverlay"]
