"""Gemma overlay: the decoder-only tree with two Gemma conversions (the :data:`GEMMA` row).

- Embedding scale.  vLLM multiplies the embedding by ``sqrt(hidden_size)``
  *after* ``embed_tokens`` (``GemmaModel.embed_input_ids``, a ``normalizer``
  buffer in the model dtype), while HF 5 applies it inside its scaled-embedding
  module, so TransformerLens's ``embed.hook_out`` is the scaled value.  The hook
  on ``embed_tokens`` sees the unscaled one, so ``embed.hook_out`` is read where
  the scaled value enters the stream: layer 0's ``hidden_states`` input (equal
  to ``blocks.0.hook_in``), the engine's own product -- multiplying the
  ``embed_tokens`` read by the config's ``sqrt(hidden_size)`` would hide a wrong
  normalizer in the engine.  TransformerLens 4.3.0's own vLLM overlay reads
  ``embed_tokens`` and is off by 1/sqrt(d_model).
- ``(1 + w)`` norms.  Gemma's RMSNorm stores ``w`` as an offset and multiplies
  by ``1 + w``; un-folding ``hook_normalized`` divides by ``1 + w``, not ``w``.
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import GEMMA_RMS, Norms, Scale, TreeOverlay

# embedding x sqrt(hidden_size) (in the model dtype: Mul casts), norms x (1 + w)
GEMMA = replace(DECODER, name="gemma", embed_scale=Scale("hidden_size", power=0.5), norms=Norms(kind=GEMMA_RMS))


class GemmaOverlay(TreeOverlay):
    """Gemma: decoder-only tree, embedding x sqrt(d_model), norms x (1 + w)."""

    tree = GEMMA


__all__ = ["GEMMA", "GemmaOverlay"]
