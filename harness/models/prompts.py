"""Prompts as token ids, deterministic per (vocab size, seed).

Contract: :func:`default_prompts(vocab, bos, max_len)` returns named token-id
lists (each starting with BOS where the model has one), drawn from ids that are
not special (>= 4 in a synthetic vocab):

* ``short``    -- 7 tokens;
* ``medium``   -- 16 tokens (longer than the sliding windows of the synthetic configs);
* ``repeated`` -- a 5-token pattern repeated (attention to identical keys, induction-like);
* ``long``     -- ``max_len - 8`` tokens, near the engine's ``max_model_len``.

Token ids, not text, so a synthetic WordLevel tokenizer and a real one are driven
the same way.  (The lengths differ, but nothing depends on it: the ragged-batch run
matches vLLM's requests to prompts by request id.)
"""
from __future__ import annotations

import torch


def default_prompts(vocab_size: int, bos_token_id: int | None, max_len: int = 256,
                    seed: int = 1234) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    low = 4 if vocab_size > 8 else 0
    head = [bos_token_id] if bos_token_id is not None else []

    def body(n: int) -> list[int]:
        return torch.randint(low, vocab_size, (n - len(head),), generator=gen).tolist()

    pattern = body(len(head) + 5)
    prompts = {
        "short": head + body(7),
        "medium": head + body(16),
        "repeated": head + (pattern * 6)[: 29 - len(head)],
        "long": head + body(max(max_len - 8, 40)),
    }
    return prompts
