"""Gemma overlay: the decoder-only tree with two Gemma conversions.

- Embedding scale.  vLLM multiplies the embedding by ``sqrt(hidden_size)``
  *after* ``embed_tokens`` (``GemmaModel.embed_input_ids``), while HF 5 applies
  it inside its scaled-embedding module, so TransformerLens's
  ``embed.hook_out`` is the scaled value.  The hook on ``embed_tokens`` sees the
  unscaled one: ``embed.hook_out`` multiplies by ``sqrt(hidden_size)`` (rounded
  to the model dtype, as both engines do).  TransformerLens 4.3.0's own vLLM
  overlay misses exactly this and is off by 1/sqrt(d_model).
- ``(1 + w)`` norms.  Gemma's RMSNorm stores ``w`` as an offset and multiplies
  by ``1 + w``; un-folding ``hook_normalized`` divides by ``1 + w``, not ``w``.
"""
from __future__ import annotations

from typing import Any

from .base import Mul, config_get
from .decoder_only import DecoderOnlyOverlay


class GemmaOverlay(DecoderOnlyOverlay):
    """Gemma: decoder-only tree, embedding x sqrt(d_model), norms x (1 + w)."""

    name = "gemma"
    norm_offset = 1.0

    def embed_conversions(self, cfg: Any) -> tuple:
        return (Mul(float(config_get(cfg, "hidden_size")) ** 0.5),)
