"""Known bugs of *vLLM* -- the engine under test -- checked against a run's own rows.

Contract: a family row may declare a :class:`~harness.models.families.KnownVllmBug` (a bug of vLLM's
that fails that family's whole run in some dtypes on some devices).  Where it applies to a run,
:func:`check(bug, rows, order)` -- pure, rows as the report holds them -- decides whether its
*signature* holds in this run:

1. some vLLM-facing row (any reference but ``bridge~hf``; a row a documented reference bug explains
   does not count) fails or errors;
2. the first such hook in forward order (``order``: harness.values.plan.Plan.forward_order; a hook it
   does not list follows in row order) matches one of the declaration's ``first_failing`` templates --
   so no row of a hook upstream of it fails or errors (an inconclusive row is not compared, not a
   failure);
3. every non-passing vLLM-facing row of that hook is a ``fail``, never an ``error``, and its ``rel_err``
   lies in the declared range, where one is declared;
4. no ``bridge~hf`` row fails or errors: a disagreement of the references is no vLLM bug's doing.

The run stores the :class:`VllmBugCheck` (``ModelResult.known_vllm_bug``).  Held: the verdict stays
``fail``, named as the bug (harness.comparison.verdict), every vLLM-facing ``fail`` row -- each at or
after the first failing hook, by 2 -- is explained (:func:`explains`: the parity test xfails it), and the
run does not fail ``python -m harness run`` unless some row *errors* (an error row is never explained).
Not held: the declaration is stale (:func:`stale_message`), the run fails, and the parity tests of the
signature's hooks fail saying so (:func:`stale_at`): strict xfail semantics.

Traps:
- A selective run (``-k``, ``--layers``) that leaves out the signature's hooks cannot confirm the bug
  (:func:`observable`): it is not checked, and its failures stay plain failures.
- The signature is a fingerprint of the bug, not a proof: name the layer where it first shows and,
  for a scale bug, its rel err (1 - 1/2.5 is not a rounding error), so another fault at the same hook
  fails instead of hiding behind the declaration.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

from harness.models.families import KnownVllmBug
from harness.vocab.hooks import matches

BAD = ("fail", "error")
CROSS = "~"  # a reference name holding it (bridge~hf) compares the references with each other, never vLLM


def _facing(row: Mapping) -> bool:
    return CROSS not in row["reference"] and not row.get("known_issue")


def forward_order(rows: Iterable[Mapping], order: Iterable[str] | None = None) -> list[str]:
    """The hooks of ``rows`` in forward order: ``order``'s, then any others in row order."""
    seen = list(dict.fromkeys(r["hook"] for r in rows))
    listed = [h for h in dict.fromkeys(order or ()) if h in set(seen)]
    return listed + [h for h in seen if h not in set(listed)]


def first_failing(rows: Iterable[Mapping], order: Iterable[str] | None = None) -> str | None:
    """The first hook in forward order with a vLLM-facing row that fails or errors; None if none."""
    rows = [r for r in rows if _facing(r)]
    bad = {r["hook"] for r in rows if r["status"] in BAD}
    return next((h for h in forward_order(rows, order) if h in bad), None)


@dataclass(frozen=True)
class VllmBugCheck:
    """A declaration's outcome in one run: what ``ModelResult.known_vllm_bug`` stores (``to_dict``)."""

    name: str
    reason: str
    first_failing: tuple[str, ...]  # the signature: its templates ...
    rel_err: tuple[float, float] | None  # ... and range
    holds: bool
    why: str  # the evidence it holds, or why it does not
    hook: str | None = None  # this run's first failing hook

    def to_dict(self) -> dict:
        return asdict(self)


def _rows_text(rows: list[Mapping]) -> str:
    return ", ".join(f"{r['reference']} {r['status']} rel err {r['rel_err']:.4g}" for r in rows)


def check(bug: KnownVllmBug, rows: list[Mapping], order: Iterable[str] | None = None) -> VllmBugCheck:
    """Does ``bug``'s signature hold in these rows (the module's rules 1-4)?"""
    def out(holds: bool, why: str, hook: str | None = None) -> VllmBugCheck:
        return VllmBugCheck(bug.name, bug.reason, tuple(bug.first_failing), bug.rel_err, holds, why, hook)

    wanted = " or ".join(bug.first_failing)
    hook = first_failing(rows, order)
    if hook is None:
        return out(False, "no row was compared" if not rows else
                   f"no vLLM row fails (the first failing hook should be {wanted}): vLLM may have fixed it")
    at = [r for r in rows if _facing(r) and r["hook"] == hook and r["status"] != "pass"]
    if not any(matches(t, hook) for t in bug.first_failing):
        return out(False, f"the first failing hook in forward order is {hook} ({_rows_text(at)}), not {wanted}", hook)
    errors = [r for r in at if r["status"] == "error"]
    if errors:
        return out(False, f"{hook} vs {errors[0]['reference']} errors instead of failing: "
                          f"{errors[0].get('message', '')[:200]}", hook)
    if bug.rel_err is not None:
        low, high = bug.rel_err
        off = [r for r in at if r["status"] == "fail" and not low <= r["rel_err"] <= high]
        if off:
            return out(False, f"{hook} fails with rel err outside the declared [{low:g}, {high:g}]: "
                              f"{_rows_text(off)}", hook)
    cross = [r for r in rows if CROSS in r["reference"] and r["status"] in BAD]
    if cross:
        return out(False, f"the references disagree ({cross[0]['hook']} vs {cross[0]['reference']} "
                          f"{cross[0]['status']}s), which no vLLM bug explains", hook)
    hooks = forward_order([r for r in rows if _facing(r)], order)
    upstream = set(hooks[:hooks.index(hook)])
    up = [r["status"] for r in rows if _facing(r) and r["hook"] in upstream]
    inconclusive = up.count("inconclusive")
    return out(True, f"first failing hook in forward order {hook} ({_rows_text(at)}); the {len(up)} vLLM rows of "
                     f"the {len(upstream)} hooks upstream of it pass"
                     + (f" ({inconclusive} inconclusive: not compared)" if inconclusive else ""), hook)


def observable(bug: KnownVllmBug, plan) -> bool:
    """Whether a run with ``plan`` (harness.values.plan.Plan; None: the run never got one, an engine error) can
    show ``bug``'s signature: a selection (``-k``, ``--layers``, ``--hook-kinds``) that leaves out every
    signature hook cannot, and is not checked -- its failures stay plain failures, its passes plain passes."""
    return plan is None or any(matches(t, h) for t in bug.first_failing for h in plan.forward_order)


def explains(check_: Mapping | None, reference: str, status: str) -> bool:
    """Whether a run's stored check explains a row of that ``reference`` and ``status``: its signature
    held and the row is a vLLM-facing failure (never an error)."""
    return bool(check_ and check_.get("holds")) and CROSS not in reference and status == "fail"


def stale_at(check_: Mapping | None, reference: str, hook: str) -> bool:
    """Whether this row carries a stale declaration's failure: the signature did not hold and the row is a
    vLLM-facing row of one of the signature's hooks (the test that would have xfailed)."""
    return (bool(check_) and not check_.get("holds") and CROSS not in reference
            and any(matches(t, hook) for t in check_.get("first_failing", ())))


def stale_message(check_: Mapping) -> str:
    return (f"declared known vLLM bug '{check_['name']}' does not show in this run: {check_['why']}. Drop the "
            "declaration (known_vllm_bug in harness/models/families.py) if vLLM fixed it, or update its signature")
