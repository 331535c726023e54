"""Shape normalization, in one place.

vLLM flattens a request's tokens (``[T, ...]``) and the overlays split heads to
``[T, n_heads, head_dim]``; TransformerLens returns ``[batch, T, ...]`` (and
``[batch, heads, T, T]`` for patterns).  The canonical layout the comparison
sees is the reference's without its batch dimension.
"""
from __future__ import annotations

import torch

from harness.vocab.hook_rules import sorted_per_token


def reference_to_canonical(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Drop the batch dim of a single-prompt reference capture; a per-token set (expert ids:
    harness.vocab.hook_rules.sorted_per_token) sorted ascending, the order vLLM's side is read in."""
    if tensor.ndim >= 1 and tensor.shape[0] == 1:
        tensor = tensor[0]
    if sorted_per_token(name):
        tensor = tensor.sort(dim=-1).values
    return tensor.detach().cpu()


def subject_to_canonical(tensor: torch.Tensor, n_tokens: int, token_dim: int = 0) -> torch.Tensor:
    """Keep the request's rows (an engine may pad the token dim: a CUDA graph's forward is padded to its captured
    size) along ``token_dim``, the raw read's token dim (``HookSpec.raw_token_dim``: 1 where vLLM's Transformers
    backend runs HF modules on ``[1, T, ...]``).  Trap: cut along dim 0 such a read keeps the padding."""
    if tensor.dim() <= token_dim:
        return tensor
    return tensor.narrow(token_dim, 0, min(n_tokens, tensor.shape[token_dim]))


def unflatten_rows(flat_rows: int | None, raw: torch.Tensor) -> torch.Tensor:
    """A raw read a line passed with its heads folded into the token rows (``HookSpec.flat_rows``): a 2-D
    ``[T x flat_rows, d]`` read viewed ``[T, flat_rows, d]``, so the token rows can be cut; any other read as it is.
    Raises where the rows are no multiple of ``flat_rows`` (the read is not what the overlay says)."""
    if not flat_rows or raw.dim() != 2:
        return raw
    if raw.shape[0] % flat_rows:
        raise ValueError(f"a [T x {flat_rows}, d] read has {raw.shape[0]} rows, no multiple of {flat_rows}")
    return raw.unflatten(0, (-1, flat_rows))
