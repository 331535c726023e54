"""Prompts as token ids, deterministic per (vocab size, seed).

Contract: :func:`default_prompts` returns a list of token-id lists: one of 16
tokens and one of 7, each starting with BOS, drawn from ids that are not
special (>= 4 in a synthetic vocab).  Token ids, not text, so a synthetic
WordLevel tokenizer and a real one are driven the same way.
"""
from __future__ import annotations

import torch


def default_prompts(vocab_size: int, bos_token_id: int | None, seed: int = 1234,
                    lengths: tuple[int, ...] = (16, 7)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    low = 4 if vocab_size > 8 else 0
    prompts = []
    for n in lengths:
        body = torch.randint(low, vocab_size, (n - (1 if bos_token_id is not None else 0),), generator=gen)
        prompts.append(([bos_token_id] if bos_token_id is not None else []) + body.tolist())
    return prompts
