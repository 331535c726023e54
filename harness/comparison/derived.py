"""Hooks vLLM never materializes, derived host-side from hooks it does (pure).

Contract: :func:`derive(spec, values)` returns the TransformerLens value of a
:class:`overlays.base.Derived` hook from the already-converted captures it
names (``values[hook]`` for one prompt).  Attention, for one prompt of ``T``
tokens, with q ``[T, n_heads, d_head]`` and k ``[T, n_kv, d_head]``:

* ``attn_scores`` -> ``[n_heads, T, T]``: ``q @ k^T * scale``, k's heads
  repeated ``n_heads / n_kv`` times (grouped-query, head ``h`` reads kv head
  ``h // group`` as HF's ``repeat_kv`` does), then ``cap * tanh(s / cap)``
  where the config soft-caps, then the mask: key ``j`` is visible from query
  ``i`` iff ``j <= i`` and, with a sliding window ``w``, ``i - j < w`` (HF's
  ``kv_idx > q_idx - w``), and with an attention chunk ``c`` (``Derived.chunk``, Llama-4) ``i // c == j // c``.
  Masked entries are ``-inf``.  ALiBi (``Derived.alibi_slopes``, BLOOM) adds
  ``slope_h * j`` for key ``j`` after the scale, as HF's ``build_alibi_tensor`` and TL's bridge do (a kernel
  adding ``slope_h * (j - i)`` differs by a per-query constant the softmax cancels: the pattern is the same).  A bidirectional
  spec (``Derived.causal`` False: an encoder) masks nothing: every key is visible, but for a sliding window ``w``,
  which then reaches both ways, ``|i - j| < w`` (ModernBERT's local layers: HF's bidirectional sliding window mask
  ``|q_idx - kv_idx| <= sliding_window``, ``w = sliding_window + 1``).
* ``pattern`` -> ``[n_heads, T, T]``: softmax of the scores over keys.

Arithmetic runs in fp64 and the result is cast to the inputs' dtype promoted
to at least fp32, as :mod:`harness.comparison.conversions` does.

Traps:

- Masked entries differ by engine: TransformerBridge fills them with the
  dtype's most negative finite value, its compatibility mode with ``-inf``.
  Neither is a number to compare, so :func:`ignore_common_mask` turns the
  entries masked on *both* sides into NaN in the reference (NaN in the
  reference means "ignore" to :func:`harness.comparison.compare.compare_tensors`); an
  entry masked on one side only stays and fails with an infinite or huge
  error, so a wrong mask or window still fails.
- Soft-capping comes before the mask (HF and the bridge agree), so a capped
  score never exceeds ``cap`` and a masked one never becomes finite.
"""
from __future__ import annotations

from typing import Mapping

import torch

from overlays.base import Derived


def visible_keys(n_tokens: int, window: int | None = None, causal: bool = True, chunk: int | None = None) -> torch.Tensor:
    """``[T, T]`` bool: query ``i`` sees key ``j`` (``causal`` False: every key, an encoder's attention; ``chunk``:
    only keys of the query's own chunk, ``i // chunk == j // chunk``, Llama-4's chunked attention)."""
    i = torch.arange(n_tokens).unsqueeze(1)
    j = torch.arange(n_tokens).unsqueeze(0)
    seen = j <= i if causal else torch.ones(n_tokens, n_tokens, dtype=torch.bool)
    if window is not None:  # bidirectional (ModernBERT's local layers): keys on both sides, |i - j| < window
        seen &= ((i - j) if causal else (i - j).abs()) < window
    if chunk is not None:
        seen &= (i // chunk) == (j // chunk)
    return seen


def attention_scores(q: torch.Tensor, k: torch.Tensor, *, scale: float, window: int | None = None,
                     softcap: float | None = None, causal: bool = True,
                     alibi_slopes: tuple[float, ...] | None = None, chunk: int | None = None) -> torch.Tensor:
    if q.ndim != 3 or k.ndim != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"attention_scores needs q [T, H, D] and k [T, KV, D]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}")
    n_heads, n_kv = q.shape[1], k.shape[1]
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads are not a multiple of {n_kv} key heads")
    out_dtype = torch.promote_types(q.dtype, torch.float32)
    k = k.to(torch.float64).repeat_interleave(n_heads // n_kv, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q.to(torch.float64), k) * scale
    if alibi_slopes is not None:  # [H, 1, 1] x key position [1, 1, T]
        slopes = torch.tensor(alibi_slopes, dtype=torch.float64)
        if slopes.numel() != n_heads:
            raise ValueError(f"{slopes.numel()} ALiBi slopes for {n_heads} heads")
        scores = scores + slopes[:, None, None] * torch.arange(q.shape[0], dtype=torch.float64)[None, None, :]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~visible_keys(q.shape[0], window, causal, chunk), -torch.inf)
    return scores.to(out_dtype)


def attention_pattern(q: torch.Tensor, k: torch.Tensor, **kw) -> torch.Tensor:
    scores = attention_scores(q.to(torch.float64), k.to(torch.float64), **kw)
    return torch.softmax(scores, dim=-1).to(torch.promote_types(q.dtype, torch.float32))


_KINDS = {"attn_scores": attention_scores, "pattern": attention_pattern}


def derive(spec: Derived, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
    try:
        fn = _KINDS[spec.kind]
    except KeyError:
        raise ValueError(f"unknown derived kind {spec.kind!r}; known: {', '.join(_KINDS)}") from None
    missing = [h for h in spec.inputs if h not in values]
    if missing:
        raise KeyError(f"derived {spec.kind} needs {', '.join(missing)}, which was not captured")
    q, k = (values[h] for h in spec.inputs)
    return fn(q, k, scale=spec.scale, window=spec.window, softcap=spec.softcap, causal=spec.causal,
              alibi_slopes=spec.alibi_slopes, **({"chunk": spec.chunk} if spec.chunk else {}))


# A score at or below half of float16's most negative finite value is a mask.  A reference's mask is its run dtype's
# ``finfo.min``, *added* to the score by HF's additive masks (so an fp16 run's masked score is -65504 plus a score,
# in fp32 where the model upcasts its attention), and it may be stored in a wider dtype (an fp16 or bf16 reference
# saved as fp32); a score that low gets softmax weight exactly 0 in every float dtype, so it is masked in effect too.
MASK_BOUND = float(torch.finfo(torch.float16).min) / 2


def is_masked(x: torch.Tensor) -> torch.Tensor:
    """``-inf``, or at/below :data:`MASK_BOUND` (half of float16's most negative finite value, above bfloat16's and
    float32's): an fp16 or bf16 reference stored as fp32 still holds its dtype's mask value plus a score."""
    if not x.is_floating_point():
        return torch.zeros_like(x, dtype=torch.bool)
    return torch.isneginf(x) | (x <= MASK_BOUND)


def _may_hold_mask(x: torch.Tensor) -> bool:
    """False only where :func:`is_masked` holds nowhere in ``x`` (its minimum is above the bound; a
    NaN minimum says True, and the exact mask decides)."""
    if not x.is_floating_point() or x.numel() == 0:
        return False
    return not bool(x.min() > MASK_BOUND)


def ignore_common_mask(subject: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """The reference with NaN where both sides are masked (see the module's traps)."""
    if subject.shape != reference.shape:
        return reference  # the comparison reports the shape mismatch
    if not _may_hold_mask(reference) or not _may_hold_mask(subject):  # one reduction each, no mask tensors
        return reference
    both = is_masked(subject) & is_masked(reference)
    return reference.masked_fill(both, float("nan")) if bool(both.any()) else reference
