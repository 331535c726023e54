"""How many log-probs per row vLLM is asked for, and therefore which entries a ``logprobs`` row compares.

Contract: :func:`logprob_k(vocab_size)` is None (every entry of every row) up to
:data:`FULL_LOGPROBS_VOCAB`, else :data:`LOGPROB_TOP_K`.  The engine asks for that many
(harness.engines.subject_vllm), and the references measure the ``logprobs`` floor on the truth's
top-k entries (harness.references.reference), so a row and its floor hold the same kind of entries.

Trap: a floor over the whole vocabulary is dominated by the tail's large log-probs, each with a small
relative error; measured on SmolLM2-135M bf16 it read 3x below the top-20 entries' own noise
(docs/numerics.md), so a vLLM as close to the truth as HF failed its row.
"""
from __future__ import annotations

LOGPROB_TOP_K = 20  # log-probs vLLM returns per row for a vocabulary above FULL_LOGPROBS_VOCAB
FULL_LOGPROBS_VOCAB = 8192  # up to this vocabulary every row's whole distribution is returned


def logprob_k(vocab_size: int) -> int | None:
    """How many log-probs per row vLLM is asked for (None: the whole vocabulary).  A full row of a
    large vocabulary costs the engine and the comparison a [T, V] matrix per prompt; the references'
    ``logprobs`` floor is measured on the same entries (harness.references.reference)."""
    return None if vocab_size <= FULL_LOGPROBS_VOCAB else LOGPROB_TOP_K
