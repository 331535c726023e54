"""StableLM overlay: the Llama-shaped tree with LayerNorm and an unfused residual.

Module tree as in :mod:`overlays.decoder_only` (``model.layers.{i}`` with
``input_layernorm``, ``self_attn`` (``qkv_proj`` -> ``rotary_emb`` -> ``attn`` ->
``o_proj``), ``post_attention_layernorm``, ``mlp`` (``gate_up_proj`` ->
``down_proj``), ``model.norm``), but three things differ:

- Residual stream.  vLLM's ``StablelmDecoderLayer`` adds its residuals itself
  and returns ``(hidden_states, residual)`` where ``hidden_states`` is the
  *whole* stream after the block and ``residual`` the stream after attention
  (no fused add-norm): ``blocks.{i}.hook_out`` reads ``out[0]`` alone (summing
  ``out[0]+out[1]`` as the Llama tree does would double-count), ``hook_in``
  reads ``in.hidden_states``, ``hook_resid_mid`` ``post_attention_layernorm``'s
  input.
- Norms are ``torch.nn.LayerNorm`` with bias: TL's ``hook_normalized`` is
  ``(x - mean) / std`` before weight and bias, so ``ln1``, ``ln2`` and
  ``ln_final`` un-fold with ``(y - b) / w``.
- Partial rotary (``partial_rotary_factor``): vLLM's ``rotary_emb`` rotates the
  first ``rotary_dim`` dims of each head and passes the rest through, and
  returns the full ``[q | pass]`` heads, as TL's ``hook_rot_q`` / ``hook_rot_k``
  hold them; no conversion beyond the head split.  q/k/v carry biases
  (``use_qkv_bias``) inside ``qkv_proj``'s output.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import LAYER_NORM, STREAM_PAIR, TreeOverlay

# ln1 / ln2 are plain LayerNorm calls (read "out"); the final norm keeps the Llama row's read
STABLELM = replace(DECODER, name="stablelm", residual=STREAM_PAIR,
                   norms=replace(DECODER.norms, kind=LAYER_NORM, read="out"))


class StableLMOverlay(TreeOverlay):
    """StableLM: Llama tree, LayerNorm with bias, residual added inside the layer."""

    tree = STABLELM


__all__ = ["STABLELM", "StableLMOverlay"]
