"""A model's verdict: the one rule that turns a run's final rows into ``pass`` / ``partial`` / ``fail`` /
``error`` / ``skipped`` and the counts behind it.

Contract: :func:`summarize` is the rule; harness.pipeline.runner.run_model applies it once, when the
run ends (a failed or refused run included), and stores it in the result (``ModelResult.summary``).
Reports, the support matrix, the CLI's exit status (:func:`fails_run`) and the pytest plugin read that
stored summary through :func:`summary_of` and never decide a verdict themselves.  A declared known vLLM
bug (harness.comparison.known_vllm_bugs) whose signature held leaves the verdict ``fail``, named
(``known_vllm_bug``), and does not fail the run; one whose signature did not hold is stale
(``stale_vllm_bug``): the run's rows decide ``fail`` as ever, and a run they would pass is an ``error``.
Rows are read, not re-gated: each row's status and margin were decided by
harness.comparison.gate.Gate.finalize.

Trap: a result written before summaries were stored (an older report file) has none; :func:`summary_of`
summarizes it here, by the same rule, and says so (``computed_on_read``).
"""
from __future__ import annotations

import math
from typing import Any

from harness.comparison.known_vllm_bugs import stale_message

VERDICTS = ("pass", "partial", "fail", "error", "skipped")


def summarize(result: dict) -> dict:
    """The model/variant's verdict and counts.  ``pass`` only if every offered hook was *gated*
    (at least one vLLM-vs-reference row compared it and passed or failed: not inconclusive, not
    explained by a reference bug) and no row failed or errored; ``partial`` when some hooks were
    not gated (listed in ``ungated_hooks``); ``fail`` when a row failed; ``error`` when a row or
    the run could not be compared, or nothing was, or a declared known vLLM bug did not show;
    ``skipped`` for a declared vLLM refusal."""
    rows = result.get("rows", [])
    bug = result.get("known_vllm_bug") or {}  # the run's check of a declared vLLM bug (known_vllm_bugs)
    stale = bool(bug) and not bug.get("holds")
    known = [r for r in rows if r.get("known_issue") and r["status"] != "pass"]
    inconclusive = sum(r["status"] == "inconclusive" for r in rows)
    gated = [r for r in rows if r["kind"] != "argmax" and not r.get("known_issue") and r["status"] in ("pass", "fail")]
    passed = sum(r["status"] == "pass" for r in rows)
    failed = sum(r["status"] == "fail" and not r.get("known_issue") for r in rows)
    errors = sum(r["status"] == "error" for r in rows)
    # "worst" = closest to (or furthest past) its own tolerance: tolerances differ by hook
    worst = max(gated, key=lambda r: stored_margin(r) if _finite(stored_margin(r)) else math.inf, default=None)
    nonfiring = sum(len(n.get("hooks", [])) for n in result.get("nonfiring", []))
    subject_rows = [r for r in rows if "~" not in r["reference"]]  # vLLM vs a reference
    offered = list(dict.fromkeys(r["hook"] for r in subject_rows))
    gated_hooks = {r["hook"] for r in subject_rows if r["status"] in ("pass", "fail") and not r.get("known_issue")}
    ungated = [h for h in offered if h not in gated_hooks]
    if result.get("skipped"):
        verdict = "skipped"
    elif result.get("error") or not offered:
        verdict = "error"  # an engine failed, or nothing was compared (an overlay with no hooks)
    elif failed:
        verdict = "fail"
    elif stale:  # the rows would pass (or be partial): what the declaration hides now runs
        verdict = "error"
    elif errors:
        verdict = "error"
    elif ungated:
        verdict = "partial"
    else:
        verdict = "pass"
    # the hooks compared with TransformerLens; a family it cannot boot (overlays.base.Overlay.tl_adapter False): with
    # HF, the logit rows aside
    counted = ([r for r in rows if r["reference"] != "hf"]
               or [r for r in rows if r["hook"] not in ("logprobs", "argmax")])
    hooks = {r["hook"] for r in counted}
    return {
        "rows": len(rows), "passed": passed, "failed": failed, "errors": errors,
        "known_issues": len(known),
        "inconclusive": inconclusive,
        "hooks_offered": len(hooks),
        # a row a documented reference bug explains does not fail its hook where another reference gated it (OPT's
        # TransformerLens scores hook holds the pattern; HF's own scores gate vLLM's)
        "hooks_passed": len(hooks - set(ungated) - {r["hook"] for r in counted
                                                    if r["status"] != "pass" and not r.get("known_issue")}),
        "hooks_gated": len(offered) - len(ungated), "hooks_compared": len(offered), "ungated_hooks": ungated,
        "hook_kinds": len({r["kind"] for r in counted}),
        "nonfiring": nonfiring,
        "worst_rel_err": worst["rel_err"] if worst else None,
        "worst_margin": stored_margin(worst) if worst else None,
        "worst_where": f"{worst['hook']} vs {worst['reference']}" if worst else None,
        "selection": result.get("selected_hooks") is not None,
        "verdict": verdict,
        "known_vllm_bug": bug["name"] if bug.get("holds") else None,
        "stale_vllm_bug": stale_message(bug) if stale else None,
    }


def fails_run(summary: dict) -> bool:
    """Whether this verdict fails ``python -m harness run`` (exit status 1): ``fail`` and ``error`` do,
    except a ``fail`` a declared known vLLM bug explains (its signature held and no row errored: an error
    row is never explained); ``partial`` and ``skipped`` do not."""
    if summary["verdict"] not in ("fail", "error"):
        return False
    return not (summary["verdict"] == "fail" and summary.get("known_vllm_bug") and not summary["errors"])


def stored_margin(row: dict) -> float:
    """The margin the gate stored in the row (harness.comparison.gate.Gate.row_margin); NaN in a
    report written before the gate stored it."""
    m = row.get("margin")
    return float(m) if isinstance(m, (int, float)) else math.nan


def summary_of(result: dict) -> dict:
    """The summary ``run_model`` stored in ``result``; for a result written before it stored one, the
    same rule applied now (marked ``computed_on_read``)."""
    stored = result.get("summary")
    if stored:
        return stored
    return {**summarize(result), "computed_on_read": True}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
