"""Compare a subject tensor with a reference tensor (pure functions).

Contract: :func:`compare_tensors` returns :class:`Metrics` -- max abs error,
the reference's scale, error relative to that scale (worst last-dim row, see
:func:`compare_tensors`), the worst
per-position cosine similarity, and where the worst element sits with both
sides' values there.  NaNs in the *reference* mark entries to ignore (vLLM
returned only top-k log-probs); a NaN in the subject where the reference is
finite counts as an infinite error.  Whether an error is within its tolerance is the
gate's rule (harness.comparison.gate.Band.exceeded); :func:`failure_message`
writes the message a reader can act on without re-running, in the
spirit of vLLM's ``check_logprobs_close``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Metrics:
    max_abs: float
    ref_scale: float
    rel_err: float
    cos_min: float
    worst_index: tuple[int, ...]
    subject_at_worst: float
    reference_at_worst: float
    shape: tuple[int, ...]
    # ||subject|| / ||reference|| over the compared entries: a scale bug (a
    # missing embedding normalizer, a wrong multiplier) shows as its factor
    norm_ratio: float = math.nan
    # the median row's relative error: a systematic mapping bug moves every row, a few
    # chaotic rows (a bf16 near-tie, a massive-activation token) do not move the median
    rel_median: float = math.nan
    # median over rows of ||subject row|| / ||reference row|| - 1 (signed): a scale bug's factor,
    # immune to rounding noise, which has no preferred sign
    scale_median: float = math.nan

    def to_dict(self) -> dict:
        return asdict(self)


class ShapeMismatch(ValueError):
    pass


def all_finite(t: torch.Tensor) -> bool:
    """No NaN and no infinity in ``t``, from one reduction (no mask tensor): a sum is finite exactly
    when every entry is, unless finite entries overflow it -- then this says False and the caller
    takes its slower exact path, so an overflow costs time, never a wrong answer."""
    return bool(torch.isfinite(t.sum())) if t.is_floating_point() else True


def _masked(s: torch.Tensor, r: torch.Tensor, general: bool = False):
    """(|s - r| with the error conventions below, r and s with ignored entries zeroed, the compared
    entries of r and of s flattened, the mask of compared entries -- None where every entry is compared).  A reference with no NaN and
    no infinity (the common case) takes a path without the masks' passes (about half of
    ``compare_tensors``' time on SmolLM2's hooks); ``general=True`` forces the masked path, which
    gives the same values (tests/unit/comparison/test_compare.py checks it bitwise)."""
    if not general and all_finite(r):
        diff = torch.sub(s, r).abs_()  # one buffer, not two: the same kernels, the same values
        if not all_finite(s):
            diff = torch.where(torch.isfinite(s), diff, torch.full_like(r, math.inf))
        return diff, r, s, r.reshape(-1), s.reshape(-1), None
    # NaN in the reference: ignore.  +-inf in the reference (a masked attention
    # score): the subject must hold the same infinity; it adds no error and no scale.
    infinite = torch.isinf(r)
    valid = ~torch.isnan(r) & ~infinite
    diff = torch.where(valid, (s - r).abs(), torch.zeros_like(r))
    diff = torch.where(valid & ~torch.isfinite(s), torch.full_like(r, math.inf), diff)
    diff = torch.where(infinite & (s != r), torch.full_like(r, math.inf), diff)
    return (diff, torch.where(valid, r, torch.zeros_like(r)), torch.where(valid, s, torch.zeros_like(s)),
            r[valid], s[valid], None if bool(valid.all()) else valid)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``torch.unravel_index`` for one index, in Python (a tensor round trip per call cost 0.1 ms)."""
    if 0 in shape:  # an empty tensor has no entry: every index 0
        return tuple(0 for _ in shape)
    out = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        out.append(i)
    return tuple(reversed(out))


def _row_norms(x: torch.Tensor, squares: torch.Tensor) -> torch.Tensor:
    """Each last-dim row's L2 norm, ``x.pow(2).sum(-1).sqrt()``; a contiguous ``x`` is squared into ``squares``
    (``out=``: the same kernel into the same contiguous layout ``x.pow(2)`` allocates, so the same values) --
    a fresh buffer as large as a vocabulary-wide fp64 tensor costs more in page faults than its arithmetic
    (tests/unit/comparison/test_compare.py checks every metric bitwise against the allocating form)."""
    if x.is_contiguous():  # every caller passes a float64 view of ``squares``' shape
        return torch.pow(x, 2, out=squares).sum(-1).sqrt()
    return x.pow(2).sum(-1).sqrt()


def compare_tensors(subject: torch.Tensor, reference: torch.Tensor) -> Metrics:
    if tuple(subject.shape) != tuple(reference.shape):
        raise ShapeMismatch(f"subject shape {tuple(subject.shape)} != reference shape {tuple(reference.shape)}")
    s = subject.detach().to(torch.float64).cpu()
    r = reference.detach().to(torch.float64).cpu()
    diff, r_masked, s_masked, rv, sv, valid = _masked(s, r)
    all_valid = valid is None
    max_abs = float(diff.max()) if diff.numel() else 0.0
    # Error relative to the reference's scale, row by row: a row is a vector
    # along the last dim (a token's d_model vector, a head's d_head vector, a
    # query's row of attention), rel = max over rows of ||s - r|| / ||r||.  The
    # worst row localizes an error as sharply as a max-abs would, while the L2
    # inside a row keeps one rounded element of a heavy-tailed activation (a
    # bf16 MLP output) from dominating.  Rows whose reference norm is below a
    # tenth of the median row norm (the first query's one-entry row of attention
    # scores) are measured against that tenth instead.  The median is over the rows compared: a row
    # with no compared entry (every token after a set-aside event, NaN in the reference) is no row of
    # this comparison, and counted as a zero norm it would drag the guard down until a one-entry row
    # near zero is measured raw (a bf16 score with a condition number of 150 read as rel 0.37).
    d2 = diff.reshape(-1, diff.shape[-1]) if diff.ndim else diff.reshape(1, 1)
    r2 = r_masked.reshape(d2.shape)
    squares = torch.empty(d2.shape, dtype=d2.dtype)  # the three row norms' squares share it (_row_norms)
    row_err = _row_norms(d2, squares)
    row_ref = _row_norms(r2, squares)
    compared = row_ref if valid is None else row_ref[valid.reshape(d2.shape).any(-1)]
    guard = max(float(compared.median()) * 0.1, 1e-300) if compared.numel() else 1e-300
    row_rel = row_err / row_ref.clamp_min(guard)
    row_rel = torch.where(row_err == 0, torch.zeros_like(row_rel), row_rel)
    worst_row = int(row_rel.argmax()) if row_rel.numel() else 0
    rel = float(row_rel[worst_row]) if row_rel.numel() else 0.0
    scale = float(row_ref[worst_row]) if row_ref.numel() else 0.0
    col = int(d2[worst_row].argmax()) if d2.numel() else 0
    flat = worst_row * d2.shape[-1] + col
    idx = _unravel(flat, tuple(diff.shape)) if diff.ndim else ()
    s2 = s_masked.reshape(d2.shape)
    typical = row_ref > guard  # rows the guard does not stand in for (masked rows have no norm)
    rel_median = float(row_rel[typical].median()) if bool(typical.any()) else 0.0
    scale_median = (float((_row_norms(s2, squares)[typical] / row_ref[typical]).median()) - 1.0
                    if bool(typical.any()) else 0.0)
    del squares  # before the cosine's own buffers
    r_norm = float(rv.norm()) if rv.numel() else 0.0
    norm_ratio = float(sv.norm()) / r_norm if r_norm > 0 else math.nan
    # cosine per leading position (token): flatten the rest
    if s.ndim >= 2 and all_valid:
        a, b = s.reshape(s.shape[0], -1), r.reshape(r.shape[0], -1)
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-30)
        cos_min = float(cos.min())
    else:
        cos_min = math.nan
    return Metrics(max_abs, scale, rel, cos_min, idx,
                   float(s[idx]) if idx else math.nan, float(r[idx]) if idx else math.nan, tuple(s.shape),
                   norm_ratio, rel_median, scale_median)


def failure_message(label: str, metrics: Metrics, rel_tol: float, position_names: tuple[str, ...] = ()) -> str:
    where = ", ".join(
        f"{n}={i}" for n, i in zip(position_names or tuple(f"dim{k}" for k in range(len(metrics.worst_index))),
                                   metrics.worst_index)
    )
    return (
        f"{label}: rel_err {metrics.rel_err:.3e} > tolerance {rel_tol:.1e} "
        f"(rel_err = ||subject - reference|| / ||reference|| of the worst last-dim row; "
        f"max_abs {metrics.max_abs:.3e}, reference scale (that row's norm) {metrics.ref_scale:.3e}, "
        f"worst cosine {metrics.cos_min:.6f}, norm ratio ||subject||/||reference|| {metrics.norm_ratio:.4g}); "
        f"worst at [{where}]: "
        f"subject {metrics.subject_at_worst:.6g} vs reference {metrics.reference_at_worst:.6g}"
    )


def argmax_agreement(subject_lp: torch.Tensor, reference_lp: torch.Tensor, k: int = 5
                     ) -> tuple[int, int, bool, bool]:
    """(positions agreeing on top-1, positions, last position agrees, last position
    agrees or is a near tie).  A near tie, as in vLLM's ``check_logprobs_close``:
    each side's top-1 token is among the other side's top-k."""
    s_lp = torch.nan_to_num(subject_lp, nan=-math.inf)
    r_lp = torch.nan_to_num(reference_lp, nan=-math.inf)
    s, r = s_lp.argmax(-1), r_lp.argmax(-1)
    agree = s == r
    kk = min(k, s_lp.shape[-1])
    s_top, r_top = s_lp[-1].topk(kk).indices, r_lp[-1].topk(kk).indices
    near_tie = bool((s[-1] == r_top).any()) and bool((r[-1] == s_top).any())
    return int(agree.sum()), int(agree.numel()), bool(agree[-1]), bool(agree[-1]) or near_tie


def logit_metrics(pairs: list[tuple[torch.Tensor, torch.Tensor]], k: int = 5) -> dict:
    """KL(reference || subject) per position (max and mean), top-1 agreement and
    top-k overlap, over all prompts; log-prob matrices ``[T, V]``, NaN = missing."""
    kls, top1, overlap, positions = [], 0, 0.0, 0
    for s, r in pairs:
        s64, r64 = s.double(), r.double()
        full = not bool(torch.isnan(s64).any())
        if full:
            kl = (r64.exp() * (r64 - s64)).sum(-1)
            kls.extend(kl.tolist())
        s_top = torch.nan_to_num(s64, nan=-math.inf).topk(min(k, s64.shape[-1]), dim=-1).indices
        r_top = torch.nan_to_num(r64, nan=-math.inf).topk(min(k, r64.shape[-1]), dim=-1).indices
        for a, b in zip(s_top.tolist(), r_top.tolist()):
            overlap += len(set(a) & set(b)) / len(b)
        top1 += int((s_top[:, 0] == r_top[:, 0]).sum())
        positions += s64.shape[0]
    return {
        "kl_max": max(kls) if kls else None, "kl_mean": sum(kls) / len(kls) if kls else None,
        "top1_agree": top1, "positions": positions, f"top{k}_overlap": overlap / positions if positions else None,
    }


def top_k_mask(logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """``logprobs`` with every entry outside each row's top ``k`` set to NaN (ignored by compare): the
    entries a top-k engine returns (vLLM's log-probs of a large vocabulary)."""
    idx = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1).indices
    keep = torch.zeros_like(logprobs, dtype=torch.bool).scatter_(-1, idx, True)
    return torch.where(keep, logprobs, torch.full_like(logprobs, math.nan))

