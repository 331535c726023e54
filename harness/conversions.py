"""Apply an overlay's declared conversions to a raw vLLM read (pure).

Contract: :func:`convert(spec, raw, params)` returns the TransformerLens value
for one hook from the raw tensor the worker recorded and the parameters it
exported.  Unknown conversions raise ``TypeError``; a missing parameter raises
``KeyError`` naming it.  Arithmetic happens in fp32 at least (``÷ w`` in bf16
would add its own rounding), then the result is compared as-is.
"""
from __future__ import annotations

from typing import Mapping

import torch

from overlays.base import Cols, Conversion, Heads, HookSpec, Mul, UnfoldNorm


def apply_one(conv: Conversion, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    if isinstance(conv, Mul):
        # Both engines multiply by the scale rounded to the model dtype.
        return x * torch.tensor(conv.factor, dtype=x.dtype)
    if isinstance(conv, UnfoldNorm):
        if conv.param not in params:
            raise KeyError(f"conversion needs parameter {conv.param!r}, which the subject did not export")
        w = params[conv.param].to(torch.float64) + conv.offset
        return (x.to(torch.float64) / w).to(torch.promote_types(x.dtype, torch.float32))
    if isinstance(conv, Cols):
        return x[..., conv.start:conv.stop]
    if isinstance(conv, Heads):
        return x.reshape(*x.shape[:-1], conv.n_heads, conv.head_dim)
    raise TypeError(f"unknown conversion {conv!r}")


def convert(spec: HookSpec, raw: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    x = raw
    for conv in spec.convert:
        x = apply_one(conv, x, params)
    return x
