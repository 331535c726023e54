"""Tokens set aside from a row: upstream events after which a prompt's tokens are no evidence (pure).

Contract: an *event* is anything with ``prompt``, ``token``, ``explained``, ``upstream_of(hook)``,
``describe()`` and ``why`` -- today an explained expert-routing flip
(:class:`harness.comparison.routing.Flip`) and a chaotic token (:class:`harness.comparison.chaos.ChaoticToken`).
:func:`set_aside(hook, events)` says, per prompt, which event moves ``hook``'s values there (the
earliest token among the explained events upstream of ``hook``): a causal model's tokens before it
are untouched, the tokens at and after it are left out of the row, and the row names the event.
:func:`mask_from` does the leaving out (NaN on the reference side, which compare_tensors ignores).

Traps: mask *after* the non-finite check (harness.comparison.nonfinite), never before -- the mask
writes NaN on purpose.  An event that is not explained sets nothing aside (a mapping bug must fail).
"""
from __future__ import annotations

from typing import Iterable, Protocol

import torch


class Event(Protocol):
    prompt: int
    token: int

    @property
    def explained(self) -> bool: ...

    @property
    def why(self) -> str: ...

    def upstream_of(self, hook: str) -> bool: ...

    def describe(self) -> str: ...


def set_aside(hook: str, events: Iterable[Event]) -> dict[int, Event]:
    """Prompt -> the explained event upstream of ``hook`` at the earliest token."""
    out: dict[int, Event] = {}
    for e in sorted(events, key=lambda e: (e.token, getattr(e, "layer", 0))):
        if e.explained and e.prompt not in out and e.upstream_of(hook):
            out[e.prompt] = e
    return out


def mask_from(reference: torch.Tensor, token: int, pos_axis: int) -> torch.Tensor:
    """``reference`` with positions ``>= token`` along ``pos_axis`` set to NaN: the tokens at and
    after an event are set aside, not the prompt."""
    out = reference.clone().to(torch.promote_types(reference.dtype, torch.float32))
    out.narrow(pos_axis, token, out.shape[pos_axis] - token).fill_(float("nan"))
    return out


def note(aside: dict[int, Event]) -> str:
    """The row's sentence naming what was set aside and why."""
    if not aside:
        return ""
    return "; tokens set aside from the event on: " + "; ".join(
        f"{e.why} ({e.describe()})" for _, e in sorted(aside.items()))
