"""Stitch a serving run's captures back into one tensor per prompt, by position.

Contract: :func:`stitch(raw, batches, requests, targets, row_dims, flat_rows)` takes what the capture
worker recorded over every forward of a serving run (harness.engines.serving) -- ``raw``:
``"{read key}#{n}"`` with ``n`` counting calls across forwards; ``batches``: one layout per
forward, ``{"req_ids", "query_start_loc", "starts", "tokens"}`` (vLLM's request ids, the
offsets of each request's rows, the position of each request's first row, the token ids fed) --
and returns ``"{prompt}:{read key}#{call}"`` tensors of the target sequences' length, plus a
:class:`Coverage` per prompt saying where every position came from.  Pure: unit-testable on
small tensors (tests/unit/engines/test_serving.py).

Rules:
- A position is taken from the prompt's own (main) request, its latest computation (a
  preempted request is recomputed: the recomputation is what the engine used).
- A position the main request never computed (its prefix was served from the cache) is
  taken from another request whose tokens agree with the target up to and including that
  position: causal attention makes its rows the same rows.  Which, and how many, is recorded.
- Every stitched row's fed token must be the target's token at that position, or
  :class:`StitchError` names the prompt and position: stitching by the wrong offsets can
  never compare the wrong rows silently.  A position no request computed is a
  :class:`StitchError` too: fewer positions are never compared silently.

Traps: vLLM names requests internally ``"{id}-{8 random chars}"`` in recent lines (the
external id alone in older ones); both match the external id.  A module called ``k`` times
per forward has ``k`` calls per forward in ``raw``; calls per forward must divide evenly.
A read some line passes with its heads folded into the token rows (``flat_rows``, from
``HookSpec.flat_rows``: vLLM 0.20.2's CUDA Gated DeltaNet norm inputs, ``[T x heads, d]``) has
``heads`` rows per token: a 2-D such read is cut in units of ``heads`` rows, and the stitched read
keeps the fold (the layout a single run's read has, which the comparison unfolds:
harness.comparison.shapes.unflatten_rows); cut per row, a prompt would get the heads of the
wrong tokens.  A read of another rank (the CPU line's ``[T, heads, d]``) is cut as any other.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from harness.vocab.capture_keys import call_key, capture_key, split_call


class StitchError(RuntimeError):
    """The captures cannot be put back into positions; the message names the prompt and position."""


@dataclass
class Coverage:
    prompt: int
    positions: int
    from_main: int = 0  # positions the prompt's own request computed
    from_other: int = 0  # positions served from the cache, taken from the request that computed them
    recomputed: int = 0  # positions the main request computed more than once (preemption)
    forwards: int = 0  # engine steps that computed any of its positions
    first_main_position: int = 0  # where the main request's own computation began (cached tokens before it)
    others: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _external(internal: str, externals: list[str]) -> str | None:
    for ext in externals:
        if internal == ext or internal.startswith(ext + "-"):
            return ext
    return None


@dataclass(frozen=True)
class _Segment:
    forward: int
    row: int  # first row in the forward
    n: int
    request: str  # external id
    start: int  # position of the first row
    tokens: tuple[int, ...] | None


def _segments(batches: list[dict], externals: list[str]) -> list[_Segment]:
    out = []
    for f, layout in enumerate(batches):
        ids, qsl, starts = layout.get("req_ids"), layout.get("query_start_loc"), layout.get("starts")
        if ids is None or qsl is None or starts is None:
            raise StitchError(f"forward {f}: the engine reported no batch layout with positions "
                              f"(req_ids/query_start_loc/starts); harness.engines.vllm_compat.batch_layout")
        toks = layout.get("tokens")
        for r, internal in enumerate(ids):
            ext = _external(internal, externals)
            if ext is None:
                raise StitchError(f"forward {f}: request {internal!r} is none of the requests sent {externals}")
            a, b = qsl[r], qsl[r + 1]
            out.append(_Segment(f, a, b - a, ext, int(starts[r]), tuple(toks[a:b]) if toks is not None else None))
    return out


def _sources(target: list[int], main: str, segments: list[_Segment], tokens: dict[str, list[int]],
             prompt: int) -> tuple[list[tuple[int, int]], Coverage]:
    """(forward, row) for every position of ``target``, and where they came from."""
    n = len(target)
    src: list[tuple[int, int] | None] = [None] * n
    main_count = [0] * n
    cov = Coverage(prompt, n)
    for seg in segments:  # in forward order: a later computation replaces an earlier one
        if seg.request != main:
            continue
        for i in range(seg.n):
            t = seg.start + i
            if t < n:
                src[t] = (seg.forward, seg.row + i)
                main_count[t] += 1
    main_positions = [t for t in range(n) if main_count[t]]
    cov.from_main = len(main_positions)
    cov.first_main_position = min(main_positions) if main_positions else n
    cov.recomputed = sum(1 for c in main_count if c > 1)
    others = set()
    for t in range(n):
        if src[t] is not None:
            continue
        for seg in reversed(segments):
            if seg.request == main or not seg.start <= t < seg.start + seg.n:
                continue
            if tokens.get(seg.request, [])[: t + 1] == target[: t + 1]:
                src[t] = (seg.forward, seg.row + t - seg.start)
                cov.from_other += 1
                others.add(seg.request)
                break
    missing = [t for t in range(n) if src[t] is None]
    if missing:
        raise StitchError(f"prompt {prompt}: positions {_ranges(missing)} of {n} were computed by no request "
                          f"(served from a cache nobody filled, or never scheduled)")
    for t, (f, row) in enumerate(src):
        seg = next(s for s in segments if s.forward == f and s.row <= row < s.row + s.n)
        if seg.tokens is not None and seg.tokens[row - seg.row] != target[t]:
            raise StitchError(f"prompt {prompt}, position {t}: forward {f} row {row} fed token "
                              f"{seg.tokens[row - seg.row]}, the sequence has {target[t]}: wrong offsets")
    cov.forwards = len({f for f, _ in src})
    cov.others = sorted(others)
    return src, cov  # type: ignore[return-value]


def _ranges(ts: list[int]) -> str:
    out, start = [], ts[0]
    for a, b in zip(ts, ts[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            if b is not None:
                start = b
    return ", ".join(out)


def _runs(src: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(forward, first row, count): consecutive positions read from consecutive rows of one forward."""
    runs: list[list[int]] = []
    for f, row in src:
        if runs and runs[-1][0] == f and runs[-1][1] + runs[-1][2] == row:
            runs[-1][2] += 1
        else:
            runs.append([f, row, 1])
    return [tuple(r) for r in runs]  # type: ignore[misc]


def stitch(raw: dict[str, torch.Tensor], batches: list[dict], requests: dict[str, list[int]],
           targets: list[dict], row_dims: dict[str, int] | None = None, flat_rows: dict[str, int] | None = None
           ) -> tuple[dict[str, torch.Tensor], list[Coverage]]:
    """``requests``: external id -> every token of that request (prompt and generated);
    ``targets``: ``{"prompt": p, "main": external id, "tokens": the sequence compared}`` per prompt;
    ``row_dims``: read key -> its token dim (1 for ``[1, T, ...]`` reads of vLLM's Transformers backend);
    ``flat_rows``: read key -> the heads a line may fold into its token rows (module doc)."""
    row_dims, flat_rows = row_dims or {}, flat_rows or {}
    segments = _segments(batches, list(requests))
    n_forwards = len(batches)
    totals: dict[str, int] = {}
    for key in raw:
        read, n = split_call(key)
        totals[read] = max(totals.get(read, 0), n + 1)
    out: dict[str, torch.Tensor] = {}
    coverage = []
    plans = []
    for target in targets:
        src, cov = _sources(list(target["tokens"]), target["main"], segments, requests, target["prompt"])
        plans.append((target["prompt"], _runs(src)))
        coverage.append(cov)
    for read, total in totals.items():
        if n_forwards == 0 or total % n_forwards:
            raise StitchError(f"{read}: {total} calls over {n_forwards} forwards: calls per forward must divide evenly")
        k, dim = total // n_forwards, row_dims.get(read, 0)
        for prompt, runs in plans:
            for c in range(k):
                parts = [_token_rows(raw[call_key(read, f * k + c)], dim, row, count, flat_rows.get(read), read, f)
                         for f, row, count in runs]
                out[capture_key(prompt, read, c)] = parts[0].clone() if len(parts) == 1 else torch.cat(parts, dim=dim)
    return out, coverage


def _token_rows(value: torch.Tensor, dim: int, row: int, count: int, heads: int | None, read: str,
                forward: int) -> torch.Tensor:
    """Token rows ``row`` .. ``row + count`` of one forward's ``value`` along ``dim``; a 2-D read with ``heads``
    folded into its rows (module doc) has ``heads`` rows per token."""
    if not heads or value.dim() != 2:
        return value.narrow(dim, row, count)
    if dim != 0:
        raise StitchError(f"{read}: heads folded into the token rows (flat_rows {heads}) of a read whose token dim "
                          f"is {dim}, not 0: the overlay's HookSpec is inconsistent")
    if value.shape[0] % heads:
        raise StitchError(f"{read}, forward {forward}: a [T x {heads}, d] read has {value.shape[0]} rows, no multiple "
                          f"of {heads} (the read is not what the overlay's HookSpec.flat_rows says)")
    return value.narrow(0, row * heads, count * heads)
