"""GLM-4.7-Flash overlay (``Glm4MoeLiteForCausalLM``, vLLM native): DeepSeek's multi-head latent attention
(MLA) with GLM-4.5-MoE's routing -- the :data:`GLM4_MOE_LITE` row, :data:`overlays.deepseek.DEEPSEEK_V3`'s
tree with GLM's router.

vLLM's ``Glm4MoeLiteDecoderLayer`` (``model.layers.{i}``) is DeepSeek's decoder layer without its float16
rescale: ``input_layernorm`` / ``post_attention_layernorm`` as fused add-norms, a ``(delta, residual)``
return, attention ``Glm4MoeLiteMLAAttention`` = ``DeepseekV2MLAAttention`` (the same
``MultiHeadLatentAttentionWrapper``), its MLP ``Glm4MoeLite`` = ``Glm4MoE`` (:mod:`overlays.glm`) above
``first_k_dense_replace``, a dense ``Glm4MoeMLP`` below.  Hook by hook:

- Attention: as :mod:`overlays.deepseek` (latents, ``hook_rot_q`` / ``hook_rot_k`` on ``rotary_emb``,
  the final q at the MLA layer's input, prefill's ``hook_v`` at ``kv_b_proj``, ``hook_z`` split into
  ``v_head_dim`` heads).  Trap: HF rotates de-interleaved where ``rope_interleave`` is true (its default,
  and the released config's), vLLM adjacent pairs in place (``is_neox_style=False``): the rope dims get
  ``DeInterleave``, as DeepSeek-V3's.
- ``attn.q_a_layernorm.hook_normalized``: TransformerLens 4.3.0's adapter maps ``q_a_layernorm`` as a
  plain component (``q_lora_optional``, as DeepSeek-V2's), no hook: compared with HF's module instead.
- ``attn.hook_z``: TL's MLA bridge splits ``o_proj``'s input by the config's ``head_dim``, which
  ``Glm4MoeLiteConfig`` maps to ``qk_rope_head_dim``, not ``v_head_dim``: DeepSeek's reference layout bug
  (harness.comparison.known_issues.LAYOUT_BUGS, this architecture listed there), regrouped with its
  signature checked.
- MLP: sparse layers run ``Glm4MoE``: router logits ``mlp.gate.hook_out`` (``GateLinear`` in fp32); the
  choice at the experts' runner (``mlp.gate.hook_expert_weights`` / ``hook_expert_indices``) compared with
  TL's ``MoERouterBridge`` (unlike DeepSeek's adapters, GLM-lite's has one); the routing rule is GLM's
  whatever the config says (``SIGMOID_BIAS``: sigmoid scores plus ``e_score_correction_bias``, top
  ``topk_group`` of ``n_group`` groups, renormalized, x ``routed_scaling_factor``: vLLM's ``Glm4MoE``
  hard-codes it, HF's ``Glm4MoeLiteTopkRouter`` always does it).  The shared expert is a module of its own
  (``shared_experts``, handed to the fused-MoE runner and called by it), offered as
  ``mlp.shared_experts.hook_*`` (TL's DeepSeek-family adapter bridges it).  Per-expert hooks non-firing
  (:data:`overlays.mixtral.MOE_NONFIRING`, sparse layers only).
- Non-firing: MLA's full key and so the scores / pattern (:mod:`overlays.deepseek`'s reasons).
- float16: ``Glm4MoeLiteDecoderLayer`` does not rescale its stream (DeepSeek's does), but the MoE runner
  divides the shared experts' output by ``routed_scaling_factor`` in fp16 as for ``glm4_moe`` (see the
  family rows).
"""
from __future__ import annotations

from dataclasses import replace

from .deepseek import DEEPSEEK_V3
from .tree import MOE, SIGMOID_BIAS, Mlp, TreeOverlay

_HF_ONLY = (("bridge", None), ("compat", None))

GLM4_MOE_LITE = replace(
    DEEPSEEK_V3, name="glm4_moe_lite",
    references=(("attn.q_a_layernorm.hook_normalized", (*_HF_ONLY, ("hf", "blocks.{i}.attn.q_a_layernorm.hook_normalized"))),),
    mlp=Mlp(kind=MOE, module="mlp", shared="shared_experts", routing=SIGMOID_BIAS),
)


class Glm4MoeLiteOverlay(TreeOverlay):
    """GLM-4.7-Flash: DeepSeek MLA (rope de-interleaved), dense then GLM-4.5 MoE layers, a shared expert."""

    tree = GLM4_MOE_LITE


__all__ = ["GLM4_MOE_LITE", "Glm4MoeLiteOverlay"]
