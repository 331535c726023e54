"""Capture changes nothing: the engine's log-probs with capture on equal those with capture off.

Contract: :func:`compare_logprobs(on, off)` compares two ``SubjectCapture.logprobs``
dicts (prompt -> ``[T, V]`` float64, NaN where vLLM returned nothing) of the *same*
engine configuration and returns an :class:`InvarianceResult`: the NaN pattern must
match, every other entry must be bitwise equal (compared as int64 bit patterns, so
``-0.0`` vs ``0.0`` or a one-ulp difference counts), and each prompt's greedy token
(argmax of its last row) must agree.  Pure: no engine, no I/O -- the parity test
(tests/engine/test_capture_invariance.py) boots the engines, :func:`capture_off_plan` gives the
"off" side of a plan (no reads, no parameters: the subject installs no capture hook,
only the forward timers every subject run has).

Traps:

- Bitwise, not "close": a hook that perturbs the engine (reading a tensor a later
  fused kernel modifies in place, a cast or ``contiguous()`` that changes which kernel
  runs) can move a log-prob by one ulp; a tolerance would hide exactly that.
- A differing NaN pattern is a difference even where no finite value differs: with
  top-k log-probs (vocab > 8192) the set of returned tokens changing is the symptom.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class InvarianceResult:
    n_prompts: int
    n_compared: int  # entries compared (finite or inf on both sides, NaN pattern equal)
    n_differing: int  # entries whose bits differ, plus NaN-pattern mismatches, plus shape / prompt mismatches
    max_abs_diff: float  # over entries present on both sides (0.0 when bitwise equal; inf for inf vs finite)
    first_difference: str | None  # human-readable: where and what; None when identical
    greedy_on: dict[int, int] = field(default_factory=dict)
    greedy_off: dict[int, int] = field(default_factory=dict)
    token_mismatches: tuple[int, ...] = ()  # prompts whose greedy token differs

    @property
    def identical(self) -> bool:
        return self.n_differing == 0 and not self.token_mismatches

    def describe(self) -> str:
        if self.identical:
            return (f"identical: {self.n_prompts} prompts, {self.n_compared} log-probs bitwise equal, "
                    f"greedy tokens {self.greedy_on}")
        return (f"{self.n_differing} differing entries, max |diff| {self.max_abs_diff:.3g}, greedy "
                f"token mismatches at prompts {list(self.token_mismatches)}; first: {self.first_difference}")


def _greedy(lp: torch.Tensor) -> int:
    last = lp[-1].nan_to_num(nan=float("-inf"))
    return int(last.argmax())


def _bits(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    return x.view(torch.int64) if x.dtype == torch.float64 else x.view({
        torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[x.dtype])


def compare_logprobs(on: dict[int, torch.Tensor], off: dict[int, torch.Tensor]) -> InvarianceResult:
    """``on`` / ``off``: prompt -> ``[T, V]`` log-probs from the capture-on / capture-off engines."""
    n_compared = n_differing = 0
    max_abs = 0.0
    first: str | None = None
    greedy_on: dict[int, int] = {}
    greedy_off: dict[int, int] = {}

    def note(text: str) -> None:
        nonlocal first
        if first is None:
            first = text

    for p in sorted(set(on) | set(off)):
        if p not in on or p not in off:
            n_differing += 1
            note(f"prompt {p}: only in the capture-{'on' if p in on else 'off'} run")
            continue
        a, b = on[p], off[p]
        if a.shape != b.shape or a.dtype != b.dtype:
            n_differing += 1
            note(f"prompt {p}: shape/dtype {tuple(a.shape)} {a.dtype} (on) vs {tuple(b.shape)} {b.dtype} (off)")
            continue
        if a.numel():
            greedy_on[p], greedy_off[p] = _greedy(a), _greedy(b)
        nan_a, nan_b = a.isnan(), b.isnan()
        nan_diff = nan_a != nan_b
        if nan_diff.any():
            n_differing += int(nan_diff.sum())
            idx = tuple(int(i) for i in nan_diff.nonzero()[0])
            note(f"prompt {p} row {idx[0]} token {idx[1]}: NaN (not returned) only in the capture-"
                 f"{'on' if bool(nan_a[idx]) else 'off'} run (on {float(a[idx])!r}, off {float(b[idx])!r})")
        both = ~(nan_a | nan_b)
        n_compared += int(both.sum())
        differ = both & (_bits(a) != _bits(b))
        if differ.any():
            n_differing += int(differ.sum())
            with torch.no_grad():
                d = (a[differ] - b[differ]).abs().nan_to_num(nan=float("inf"))  # inf - inf -> inf
            max_abs = max(max_abs, float(d.max()))
            idx = tuple(int(i) for i in differ.nonzero()[0])
            note(f"prompt {p} row {idx[0]} token {idx[1]}: on {float(a[idx])!r} vs off {float(b[idx])!r} "
                 f"(diff {float(a[idx]) - float(b[idx]):.3g})")
    mismatched = tuple(p for p in greedy_on if greedy_on[p] != greedy_off.get(p))
    if mismatched and first is None:  # unreachable while rows are bitwise equal; kept for safety
        note(f"prompt {mismatched[0]}: greedy token {greedy_on[mismatched[0]]} (on) vs {greedy_off[mismatched[0]]} (off)")
    return InvarianceResult(n_prompts=len(set(on) | set(off)), n_compared=n_compared, n_differing=n_differing,
                            max_abs_diff=max_abs, first_difference=first, greedy_on=greedy_on,
                            greedy_off=greedy_off, token_mismatches=mismatched)


def capture_off_plan(plan):
    """``plan`` with nothing to read: ``runner.capture_subject`` then passes ``reads=[]``, ``params=[]``
    (no capture hook installed) and every other engine argument unchanged."""
    return dataclasses.replace(plan, specs={}, derived={})


__all__ = ["InvarianceResult", "capture_off_plan", "compare_logprobs"]
