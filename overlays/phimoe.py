"""Phi-3.5-MoE overlay (``PhiMoEForCausalLM``, HF's ``PhimoeForCausalLM``): StableLM's stream and
LayerNorms with Mixtral's MoE block -- the :data:`PHIMOE` row.

The released checkpoints' ``config.json`` says ``PhiMoEForCausalLM`` (vLLM's registry key and
TransformerLens's adapter key); transformers 5 names the class ``PhimoeForCausalLM`` (model type
``phimoe``).  The family row sets ``ModelSpec.released_architecture`` so the synthetic checkpoint
carries the released spelling, and this overlay is registered under it.

vLLM's ``PhiMoEDecoderLayer`` (``model.layers.{i}``): ``input_layernorm`` / ``post_attention_layernorm``
are ``torch.nn.LayerNorm`` (weight and bias), called without a residual; the layer adds both
residuals itself and returns ``(stream after the block, stream after attention)``.  Hook by hook:

- Stream: ``hook_in`` is the layer's ``hidden_states`` input, ``hook_out`` its ``out[0]`` alone (the
  second element is the mid stream: summing them, as the Llama tree does, would double-count),
  ``hook_resid_mid`` ``post_attention_layernorm``'s input (:data:`overlays.tree.STREAM_PAIR`).
- Norms: LayerNorm with bias: TL's ``hook_normalized`` is ``(x - mean) / std`` before weight and bias,
  so ``ln1``, ``ln2`` and ``ln_final`` un-fold ``(y - b) / w``; each returns one tensor (``out``).
- Attention: fused ``qkv_proj`` (``[q | k | v]``, grouped-query) and ``o_proj``, both built with
  ``bias=True`` whatever ``attention_bias`` says (the released model has the biases: the family row
  sets ``attention_bias``, else vLLM would keep uninitialized biases HF has not); NeoX rotary over the
  whole head.  vLLM passes no sliding window to its attention: the family row sets none (HF would mask
  with one).
- ``attn.hook_rot_q`` / ``hook_rot_k``: TransformerLens's PhiMoE adapter keeps HF's attention
  (``maintain_native_attention``) and exposes no rotated q/k (its bridge has no such hook), so they
  make no rows of their own and only feed the derived scores / pattern (as :mod:`overlays.gptj`).
  The bridge's ``hook_attn_scores`` holds HF's post-softmax weights (its generic ``AttentionBridge``):
  a documented reference bug (harness.comparison.known_issues, signature: scores equal pattern);
  the derived pattern is compared against both references.
- MoE at ``block_sparse_moe`` (:data:`overlays.mixtral.MIXTRAL`'s hooks): router logits
  ``mlp.gate.hook_out`` (``gate``'s ``out[0]``; HF's router is ``mlp.router``, which
  TransformerLens's adapter maps to ``mlp.gate``), the router's choice at the runner's route tap.
  Routing is the sparsemixer, not a softmax top-k: expert 1 is the arg-max logit, weighted by the
  softmax over the logits within ``2 * jitter_eps`` (relative) of it; expert 2 the arg-max of the
  rest, weighted likewise among them.  The router hook declares that rule (``Mlp.routing``
  ``SPARSEMIXER``): a near-tie is then also a logit at a softmax's relative threshold, where rounding
  moves it in or out and the weights jump as they do when ids swap (harness.comparison.routing).
  Trap: vLLM hard-codes ``jitter_eps = 0.01``
  (``phimoe_routing_function``), HF reads ``router_jitter_noise``: the family row keeps the released
  0.01, else the weights would differ by construction.
- ``lm_head`` has a bias in vLLM always (``ParallelLMHead(bias=True)``, loaded from the checkpoint):
  the family row sets ``lm_head_bias``, as the released model.  Trap: vLLM's
  ``PhiMoEForCausalLM.compute_logits`` calls ``logits_processor(self.lm_head, hidden_states)`` without
  the bias (GPT-J passes ``self.lm_head.bias``), so vLLM's logits lack it: a known vLLM bug declared on
  the family row (first failing hook ``unembed.hook_out``; every hook upstream passes).
"""
from __future__ import annotations

from dataclasses import replace

from .mixtral import MIXTRAL
from .stablelm import STABLELM
from .tree import SPARSEMIXER, TreeOverlay

# TransformerBridge's PhiMoE attention exposes no rotated q/k: captured only to derive scores / pattern
_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))

PHIMOE = replace(STABLELM, name="phimoe", norms=replace(STABLELM.norms, final_read="out"),
                 mlp=replace(MIXTRAL.mlp, routing=SPARSEMIXER),
                 references=(("attn.hook_rot_q", _NOT_COMPARED), ("attn.hook_rot_k", _NOT_COMPARED)),
                 nonfiring=MIXTRAL.nonfiring)


class PhiMoEOverlay(TreeOverlay):
    """Phi-3.5-MoE: LayerNorm with bias, residual added inside the layer, sparsemixer MoE at ``block_sparse_moe``."""

    tree = PHIMOE


__all__ = ["PHIMOE", "PhiMoEOverlay"]
