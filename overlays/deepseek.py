"""DeepSeek-V2 / V3 overlays (Kimi-K2 is ``DeepseekV3ForCausalLM``): multi-head latent attention
(MLA), dense-then-sparse layers, shared experts -- the :data:`DEEPSEEK_V3` / :data:`DEEPSEEK_V2` rows.

vLLM's ``DeepseekV2DecoderLayer`` (``model.layers.{i}``, both architectures) is Llama-shaped around
its sublayers: ``input_layernorm`` / ``post_attention_layernorm`` as fused add-norms and a ``(delta,
residual)`` return, so the residual-stream and ``ln1`` / ``ln2`` hooks are
:mod:`overlays.decoder_only`'s.  Attention is ``self_attn`` (``DeepseekV2MLAAttention``), whose
``MultiHeadLatentAttentionWrapper`` runs, in prefill:

    q_lora_rank set:  fused_qkv_a_proj -> [q_c | kv_c | k_pe];  q_a_layernorm(q_c) -> q_b_proj -> q
    q_lora_rank None: q_proj(x) -> q;  kv_a_proj_with_mqa(x) -> [kv_c | k_pe]          (V2-Lite)
    kv_a_layernorm(kv_c);  rotary_emb(positions, q[..., nope:], k_pe)  (q's rope part rotated in place)
    mla_attn.mla_attn(q, kv_c_normed, k_pe): prefill runs kv_b_proj(kv_c_normed) -> per head [k_nope | v]
    o_proj(z)

Hook by hook (:meth:`overlays.tree.TreeOverlay._mla`):

- ``attn.hook_q_latent`` / ``attn.hook_kv_latent`` are the latent norms' outputs (TL's
  ``MLAAttentionBridge`` takes them after ``q_a_layernorm`` / ``kv_a_layernorm``, weight included);
  ``attn.q_a_layernorm.hook_normalized`` / ``attn.kv_a_layernorm.hook_normalized`` un-fold them.  No
  q latent without ``q_lora_rank`` (V2-Lite: TL has none either).
- ``attn.hook_rot_q`` / ``hook_rot_k`` are ``rotary_emb``'s outputs: the rope part of each q head
  ``[T, H, rope]`` and the one rope key shared by every head ``[T, 1, rope]`` (TL: the same shapes).
  Trap: vLLM rotates adjacent pairs in place (GPT-J style, ``is_neox_style=False``); HF's V3 with
  ``rope_interleave`` first moves even and odd entries into two halves and rotates those (V2's
  complex-number rotary keeps the pairs in place), so V3's reads get ``DeInterleave`` (the row's
  ``rope_deinterleave_key``): the same numbers, reordered.
- ``attn.hook_q`` is the final q entering attention, ``[nope | rotated rope]`` per head: the MLA
  layer's first input, with the rope part de-interleaved for V3, swapped to TL's heads-first
  ``[H, T, nope + rope]``.
- ``attn.hook_v`` is ``kv_b_proj``'s output in prefill, split per head into ``[k_nope | v]``, v's
  columns, heads-first ``[H, T, v]``.  Only the ``CPU_MLA`` backend calls ``kv_b_proj`` in prefill;
  ``AMX_MLA`` and the CUDA backends absorb it, so there the hook is non-firing for that kernel path
  (harness.engines.mla_backends, applied by the plan).
- ``attn.hook_z`` is ``o_proj``'s input split into ``H`` heads of ``v_head_dim``.  TransformerLens
  4.3.0 splits it by ``head_dim`` (= ``qk_rope_head_dim``): a reference layout bug, compared regrouped
  with its signature checked (harness.comparison.known_issues.LAYOUT_BUGS).
- Router choice (``mlp.gate.hook_expert_weights`` / ``hook_expert_indices``) and V2's
  ``attn.q_a_layernorm.hook_normalized``: TL's adapters have no such hooks, so these rows are compared
  against HF's modules (the ``hf`` reference) instead of the bridge.
- Non-firing: ``attn.hook_k`` (TL: ``[k_nope | rope key repeated over heads]``) is concatenated
  inside the MLA backend, never at a module boundary; the scores and pattern are fused in the
  kernel and cannot be derived without that k.  In decode vLLM absorbs ``kv_b_proj`` into the
  query and output (``W_UK_T`` / ``W_UV``), so ``hook_v`` exists only in prefill.
- MLP: layers below ``first_k_dense_replace`` run a dense ``DeepseekV2MLP`` (fused ``gate_up_proj``,
  TL's dense-layer ``mlp.hook_pre`` / ``hook_pre_linear`` / ``hook_post``); the rest a
  ``DeepseekV2MoE``: router logits ``mlp.gate.hook_out`` (``gate``'s ``out[0]``), shared experts
  ``mlp.shared_experts.hook_*`` (a gated MLP of its own, TL's ``shared_experts`` bridge), and the
  block's output ``mlp.hook_out`` (routed experts x ``routed_scaling_factor`` plus the shared
  experts).  Per-expert and routing hooks are :data:`overlays.mixtral.MOE_NONFIRING`'s, on the
  sparse layers only (``Tree.dense_layers``).
- Routing: V3 scores with a sigmoid plus ``e_score_correction_bias`` over groups (vLLM reads
  ``topk_method == "noaux_tc"`` and ``scoring_func``, which the family rows set, HF's V3 always
  does this); V2 with a softmax over one group.  Both show in ``mlp.hook_out`` only.
- float16: vLLM rescales the residual stream by ``1 / routed_scaling_factor`` in fp16
  (``DeepseekV2DecoderLayer.forward``, "Fix FP16 overflow"), so its fp16 stream is not the model's.
  vLLM does not refuse the dtype, so it cannot be declared as a refusal (the harness re-checks those
  by booting); see the family rows.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .mixtral import MOE_NONFIRING
from .tree import FROM_CONFIG, MLA, MOE, Attention, Mlp, TreeOverlay

_NO_K = ("MLA: the full per-head key [k_nope | rope key] is concatenated inside vLLM's MLA backend (prefill) or "
         "never formed (decode absorbs kv_b_proj into the query, W_UK_T): no module boundary holds it (its parts "
         "are compared: hook_v's kv_b_proj output and hook_rot_k)")
_NO_SCORES = ("vLLM's MLA attention kernel fuses QK^T, mask and softmax, and the full per-head key it would be "
              "derived from never crosses a module boundary (see attn.hook_k)")

# TransformerLens 4.3.0's DeepSeek adapters have no router hooks, and V2's none on q_a_layernorm: those rows are
# compared with HF's own modules instead (harness.references.reference: the router's (logits, top-k weights,
# top-k ids) output, scattered and sorted as TL's router hooks hold them; the latent norm's output over its
# weight), so every offered hook is gated
_HF_ONLY = (("bridge", None), ("compat", None))
_HF_ROUTER = tuple((f"mlp.gate.{h}", (*_HF_ONLY, ("hf", f"blocks.{{i}}.mlp.gate.{h}")))
                   for h in ("hook_expert_weights", "hook_expert_indices"))

DEEPSEEK_V3 = replace(
    DECODER, name="deepseek_v3", references=_HF_ROUTER,
    attention=Attention(qkv_layout=MLA, rope_deinterleave_key="rope_interleave"),
    mlp=Mlp(kind=MOE, module="mlp", shared="shared_experts", routing=FROM_CONFIG), dense_layers="first_k_dense_replace",
    dense_mlp=Mlp(),
    score_inputs=None,
    nonfiring=(NonFiring("blocks.{i}.attn.hook_k", _NO_K),
               NonFiring("blocks.{i}.attn.hook_attn_scores", _NO_SCORES),
               NonFiring("blocks.{i}.attn.hook_pattern", _NO_SCORES), *MOE_NONFIRING),
)
# V2's HF rotary (complex numbers on adjacent pairs) keeps vLLM's order: no de-interleave
DEEPSEEK_V2 = replace(DEEPSEEK_V3, name="deepseek_v2",
                      attention=replace(DEEPSEEK_V3.attention, rope_deinterleave_key=None),
                      references=(*_HF_ROUTER, ("attn.q_a_layernorm.hook_normalized",
                                                (*_HF_ONLY, ("hf", "blocks.{i}.attn.q_a_layernorm.hook_normalized")))))


class DeepseekV3Overlay(TreeOverlay):
    """DeepSeek-V3 / Kimi-K2: MLA (rope de-interleaved), dense then MoE layers, shared experts."""

    tree = DEEPSEEK_V3


class DeepseekV2Overlay(TreeOverlay):
    """DeepSeek-V2 (and V2-Lite, no q compression): MLA, dense then MoE layers, shared experts."""

    tree = DEEPSEEK_V2


__all__ = ["DEEPSEEK_V2", "DEEPSEEK_V3", "DeepseekV2Overlay", "DeepseekV3Overlay"]
