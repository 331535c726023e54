"""Many planted engine bugs against one set of references: the references are the cost.

Contract: :func:`prepare(target, variant, hooks)` builds the plan, the prompts,
the references (with their noise floors) and the gate once and returns a
:class:`Baseline` (:func:`from_run`: the same from a finished full run's references, e.g. the
pytest session's run of that family, so nothing is computed twice); :func:`run_fault(baseline, fault)` boots one vLLM subject with
the :class:`~harness.engines.engine_faults.EngineFault` planted (``None``: a clean
engine), evaluates it against the baseline's references and returns a
:class:`FaultRun` -- the rows plus :meth:`FaultRun.first_failure`, the first
hook in forward order whose row against a vLLM-facing reference does not
pass.  One reference capture then serves any number of faults (one engine boot
each): ``tests/engine/test_planted_faults.py`` and ``scripts/detection_limits.py`` both use it.

Traps: "forward order" is the overlay's hook order (embed, then per layer
``hook_in`` ... ``hook_out``, then ``ln_final`` / ``unembed``), with each derived
hook (attention scores / pattern) placed right after the last hook it is
computed from; ``bridge~hf`` rows never see vLLM and are ignored.  A selective
``hooks`` set captures only those hooks (plus derived inputs): the first failure
is then the first among them.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.comparison.evaluate import evaluate
from harness.comparison.gate import Gate
from harness.engines.engine_faults import EngineFault
from harness.models.targets import Target
from harness.paths import RUNS_ROOT
from harness.values.plan import Plan, build_plan
from harness.values.results import HookResult
from harness.values.variant import Variant
from harness.pipeline.runner import capture_reference_side, prompts_for


@dataclass
class Baseline:
    target: Target
    variant: Variant
    plan: Plan
    prompts: list[list[int]]
    refs: object  # harness.references.reference.ReferenceCapture
    gate: Gate
    reference_s: float = 0.0

    @property
    def order(self) -> list[str]:
        """Every compared hook in forward order (derived hooks after their last input)."""
        return self.plan.forward_order


@dataclass
class FaultRun:
    fault: EngineFault | None
    rows: list[HookResult]
    order: list[str]
    boot_s: float | None = None
    wall_s: float = 0.0
    meta: dict = field(default_factory=dict)

    def vllm_rows(self, hook: str) -> list[HookResult]:
        """The rows of ``hook`` against references that see vLLM (not ``bridge~hf``)."""
        return [r for r in self.rows if r.hook == hook and "~" not in r.reference]

    def status(self, hook: str, reference: str = "bridge") -> str | None:
        row = next((r for r in self.rows if r.hook == hook and r.reference == reference), None)
        return row.status if row else None

    def row(self, hook: str, reference: str = "bridge") -> HookResult | None:
        return next((r for r in self.rows if r.hook == hook and r.reference == reference), None)

    def first_failure(self, statuses: tuple[str, ...] = ("fail", "error")) -> str | None:
        """The first hook in forward order with a vLLM-facing row in ``statuses``; None if none."""
        row = self.first_failure_row(statuses)
        return row.hook if row is not None else None

    def first_failure_row(self, statuses: tuple[str, ...] = ("fail", "error")) -> HookResult | None:
        """That hook's first row in ``statuses`` (which reference, how far off)."""
        for hook in self.order:
            for r in self.vllm_rows(hook):
                if r.status in statuses:
                    return r
        return None


def hooks_for_layers(target: Target, variant: Variant, layers, *, embed: bool = True,
                     derived: bool = False, kinds: set[str] | None = None) -> set[str]:
    """A selective run's hooks: every offered hook of ``layers`` (only hook kinds in ``kinds``
    if given, e.g. ``{"hook_out"}``), plus, with ``embed``, the embeddings: ``embed.hook_out`` and every
    other hook before the first layer's (GPT-2's and OPT's learned positions; BERT's position and
    token-type embeddings and its embedding LayerNorm); derived hooks (attention scores / pattern) only with ``derived``.
    Keeps a sweep on a deep model cheap."""
    from harness.vocab.hooks import hook_kind, layer_of

    plan = build_plan(target, variant)
    wanted = set(layers)
    order = plan.compared_hooks
    first_layer = next((n for n, h in enumerate(order) if layer_of(h) is not None), len(order))
    out = {"embed.hook_out", *order[:first_layer]} if embed else set()
    for h in plan.compared_hooks:
        if layer_of(h) in wanted and (derived or h not in plan.derived):
            if kinds is None or hook_kind(h) in kinds:
                out.add(h)
    return out


def prepare(target: Target, variant: Variant, hooks: set[str] | frozenset[str] | None = None) -> Baseline:
    """Plan, prompts, references (with floors) and gate for ``target`` / ``variant``: once per sweep."""
    t0 = time.perf_counter()
    plan = build_plan(target, variant, hooks)
    prompts = list(prompts_for(target).values())
    gate = Gate.for_run(variant, target.architecture)
    refs = capture_reference_side(target, variant, plan, prompts, gate)
    return Baseline(target, variant, plan, prompts, refs, gate, reference_s=time.perf_counter() - t0)


def from_run(run, variant: Variant, hooks: set[str] | frozenset[str] | None = None) -> Baseline:
    """A baseline on a finished run's references (``run``: a :class:`~harness.values.results.ModelRun` of
    ``variant`` that captured every offered hook, e.g. a pytest session's): nothing is recomputed.  The
    faults' engines capture only ``hooks``; the references hold more, and the rows read only the hooks
    they compare.  The floors are per hook, so each row's floor and tolerance are a prepared baseline's;
    the chaotic tokens (bf16) are those the whole model's floor run found, which a selection could only
    see fewer of."""
    if run.refs is None or run.plan is None:
        raise ValueError(f"{run.target.name}: the run has no references to reuse ({run.result.error or 'not run'})")
    if run.plan.selected is not None:
        raise ValueError(f"{run.target.name}: the run captured a selection ({len(run.plan.selected)} hooks), "
                         "not every offered hook: prepare() the baseline instead")
    plan = build_plan(run.target, variant, hooks)
    gate = Gate.for_run(variant, run.target.architecture)
    return Baseline(run.target, variant, plan, run.result.prompts, run.refs, gate,
                    reference_s=run.result.timings.get("phases", {}).get("references", 0.0))


def run_fault(base: Baseline, fault: EngineFault | None, work_root: Path | None = None) -> FaultRun:
    """One vLLM subject with ``fault`` planted, evaluated against ``base``'s references.
    Raises :class:`harness.engines.subject.SubjectError` if the engine fails (a fault naming
    nothing in the model fails the boot on purpose)."""
    from harness.pipeline.runner import capture_subject  # the runner's own subject launch, unchanged

    t0 = time.perf_counter()
    root = work_root or RUNS_ROOT
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root, prefix=f"{base.target.name}-fault-"))
    subject = capture_subject(base.target, base.variant, base.plan, base.prompts, work,
                               fault.env() if fault is not None else None)  # its captures own ``work``
    from harness.pipeline.runner import routing_params

    rows, _flips = evaluate(base.plan, subject, base.refs, base.prompts, base.gate, base.target.name,
                            routing_params(base.plan, Path(base.target.checkpoint), base.variant.dtype))
    return FaultRun(fault, rows, base.order, boot_s=subject.meta.get("boot_s"),
                    wall_s=time.perf_counter() - t0, meta={"vllm_version": subject.meta.get("vllm_version")})


__all__ = ["Baseline", "FaultRun", "from_run", "hooks_for_layers", "prepare", "run_fault"]
