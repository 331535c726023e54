"""Apertus overlay: the Llama tree with per-head q/k norms, its own norm names and a non-gated xIELU MLP
(vLLM's native ``ApertusForCausalLM``).

vLLM's ``ApertusDecoderLayer`` (``model.layers.{i}``) is Llama's: fused ``(delta, residual)`` pair,
add-norms returning ``(normed, residual)``, fused ``self_attn.qkv_proj`` (``[q | k | v]``, grouped-query,
biases on q/k/v and ``o_proj`` where ``attention_bias`` is set).  What differs, hook by hook:

- ``ln1`` / ``ln2``: the norms are ``attention_layernorm`` / ``feedforward_layernorm`` (as in HF and
  TransformerLens's adapter), read ``out[0]`` and un-folded ``÷ w``.
- q/k norms: ``self_attn.q_norm`` / ``k_norm`` (``RMSNorm(head_dim)``) on ``[T, heads, head_dim]``
  between ``qkv_proj`` and rotary, as Qwen3 (``QK_PER_HEAD``: un-fold, then TL's heads-first swap);
  ``attn.hook_q`` / ``hook_k`` stay the projections before the norm.  vLLM 0.20 calls the same norms on
  ``q.view(-1, head_dim)``, ``[T * heads, head_dim]``, rows a token-indexed capture cannot hold, so the normed q / k
  are read where both lines hand them to rotary, ``[T, heads * head_dim]`` (``qk_norm_at_rotary``), split into heads:
  one overlay reads both lines.
- MLP: ``down_proj(xielu(up_proj(x)))``, no gate (``Mlp(kind=PLAIN)``): ``mlp.hook_pre`` is
  ``up_proj``'s output, ``mlp.hook_post`` ``down_proj``'s input, i.e. the xIELU output.  xIELU has two
  learned scalars per layer (``mlp.act_fn.alpha_p`` / ``alpha_n``, through softplus): vLLM's ``XIELU``
  creates them as bfloat16 parameters whatever the model dtype (``dtype=torch.bfloat16`` default in
  ``vllm/model_executor/layers/activation.py``, ``ApertusMLP`` never passes one), where HF builds them
  in ``config.dtype``.  In a float32 run vLLM therefore computes with the alphas rounded to bfloat16:
  ``mlp.hook_post`` is the first hook off (the family row's ``known_vllm_bug``), everything before it
  passing; in bfloat16 both sides hold the same bfloat16 alphas.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import PLAIN, QK_PER_HEAD, Mlp, TreeOverlay

APERTUS = replace(DECODER, name="apertus",
                  attention=replace(DECODER.attention, qk_norm=QK_PER_HEAD, qk_norm_at_rotary=True),
                  norms=replace(DECODER.norms, ln1="attention_layernorm", ln2="feedforward_layernorm"),
                  mlp=Mlp(kind=PLAIN, up="up_proj", down="down_proj"))


class ApertusOverlay(TreeOverlay):
    """Apertus: Llama tree, per-head q/k norms, attention_layernorm / feedforward_layernorm, xIELU MLP."""

    tree = APERTUS


__all__ = ["APERTUS", "ApertusOverlay"]
