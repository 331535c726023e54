"""The subjects: what captures vLLM's activations for a run, one declared row each.

Contract: :data:`SUBJECTS` maps a subject's name (``--subject``) to its :class:`Subject`, a frozen row of
data: a one-line doc, the dotted paths of its functions, what it cannot run (each refusal with the reason
its error message gives) and the facts the rest of the harness reads from it.  Every rule that depends
on which subject runs reads this table: the variant's validation, environment and names
(harness.values.variant), the plan and the report's overlay name (harness.values.plan), the engine
request (harness.values.engine_request), the capture (harness.pipeline.runner.capture_subject), the
peers a line installs (harness.frontends.lines) and the command line's choices (harness.frontends.options).
Adding a subject is one row here plus its module, which provides:

- ``capture(request, work_dir, *, env, timeout_s) -> SubjectCapture``: launch its engine on the
  :class:`~harness.engines.engine_request.EngineRequest` and load what it wrote (harness.engines.subject);
- ``plan(hf_config, overlay) -> (specs, derived, nonfiring)``: what it offers for a model (``overlay``:
  the family's overlay, the references' hook names; None for a family declared refused); None in the
  row: the overlay's own plan (harness.values.plan.offered);
- ``request(request, specs) -> EngineRequest``: the request with its ``subject_args`` filled from the plan's
  specs; None in the row: the overlay's reads, parameters and token dims
  (harness.values.engine_request.run_request);
- ``args``: the frozen dataclass of its own part of the request (``EngineRequest.subject_args``; JSON-plain
  fields, tuples and mappings restored in its ``__post_init__``), named by the row so the engine process
  can rebuild it (harness.engines.engine_request.subject_args_of).

Traps:
- The functions are named by dotted path and imported only when called: the subjects' modules import
  TransformerLens or reach vLLM, and this table is read by every variant the command line builds.
- The refusals: ``no_serving`` (a serving shape other than ``single``), ``no_tp`` (tensor parallelism),
  ``no_compiled`` (compiled mode) and ``no_v2`` (``--runner v2``) hold the reason text of the error, None
  where the subject can.  Refusals sharing one reason are one error naming all their options
  (``--subject vllm-lens with --serving decode / --tp 1 / compiled False / --runner auto: ...``), in that
  order; :meth:`Subject.refusals` writes them, harness.values.variant raises them.
- ``tl-vllm`` (TransformerLens's own vLLM backend) takes no tensor parallelism, no serving shape and
  no V2 runner of ours; it is *not* refused compiled mode (TL's ``boot_vllm`` takes ``enforce_eager``).
  ``vllm-hidden-states`` (vLLM's ``extract_hidden_states`` export) is driven one prompt at a time on one
  device by its own code.  ``vllm-lens`` likewise, and eager on the V1 runner only (its plugin forces
  ``enforce_eager`` and raises on V2).
- Only the default subject (:data:`DEFAULT`) drives other executors (``--executor ray``): every other
  one's engine is booted by this harness in one process (``any_executor``).
- A ``peer`` is another project's capture tool, installed into a line's environment only with
  ``scripts/line_env.sh <line> --peers`` (harness.frontends.lines).  Its plugin may load in every vLLM of
  that environment: its ``kill_switch`` environment variable is set in the engine of every *other*
  subject (:func:`kill_switches`; vllm-lens's ``VLLM_LENS_DISABLE``), so they run as vLLM ships.
- ``refusal_probe``: a peer that cannot run on this machine at all (``nnsight``: its vLLM worker is vLLM's GPU
  worker) is a row too, so the matrix shows it as a refusal in its own words, re-checked per run, never a pass.
- ``overlay_name``: the report's overlay text for a subject that does not use the family's overlay;
  ``{overlay}`` in it is that overlay's class name (the references' hook names come from it).  The
  default subject's names are bare (``report``, ``cpu-float32``); every other subject's carry its name.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

DEFAULT = "vllm"


@dataclass(frozen=True)
class Subject:
    name: str
    doc: str  # one line: what captures
    capture: str  # dotted path: capture(request, work_dir, *, env, timeout_s) -> SubjectCapture
    plan: str | None = None  # dotted path: plan(hf_config, overlay) -> (specs, derived, nonfiring); None: the overlay's
    request: str | None = None  # dotted path: request(request, specs) -> EngineRequest; None: the overlay's reads
    no_serving: str | None = None  # why a serving shape other than ``single`` cannot run (None: it can)
    no_tp: str | None = None  # why tensor parallelism cannot
    no_compiled: str | None = None  # why compiled mode cannot
    no_v2: str | None = None  # why vLLM's V2 model runner cannot
    any_executor: bool = False  # drives --executor ray (else booted by this harness in one process)
    peer: bool = False  # another project's tool, installed into a line with scripts/line_env.sh --peers
    kill_switch: str | None = None  # a peer's environment variable that disables its plugin in other subjects
    overlay_name: str | None = None  # the report's overlay_name ({overlay}: the family overlay's class); None: its own
    # dotted path: the frozen dataclass of its own part of the request (EngineRequest.subject_args); None: none
    args: str | None = None
    # dotted path: refusal_probe(python) -> the reason this subject cannot run in that engine interpreter, in the
    # peer's own words, or None where it could (a stale declaration); re-checked on every run, before anything is
    # built (harness.pipeline.refusals.recheck_subject): the run is skipped with it, never passed
    refusal_probe: str | None = None

    def refusals(self, serving: str, tp: int, compiled: bool, runner: str) -> list[str]:
        """The errors of running this subject so (``runner`` as asked: ``auto`` is not ``v2``); [] if it can."""
        asked = (("serving", serving != "single", f"--serving {serving}"), ("tp", tp > 1, f"--tp {tp}"),
                 ("compiled", bool(compiled), f"compiled {bool(compiled)}"),
                 ("v2", runner == "v2", f"--runner {runner}"))
        reasons: dict[str, list[tuple[bool, str]]] = {}
        for axis, refused, shown in asked:
            reason = getattr(self, f"no_{axis}")
            if reason is not None:
                reasons.setdefault(reason, []).append((refused, shown))
        return [f"--subject {self.name} {'with ' if len(axes) > 1 else ''}{' / '.join(s for _, s in axes)}: {reason}"
                for reason, axes in reasons.items() if any(r for r, _ in axes)]

    def capture_fn(self) -> Callable:
        return _resolve(self.capture)

    def plan_fn(self) -> Callable | None:
        return None if self.plan is None else _resolve(self.plan)

    def request_fn(self) -> Callable | None:
        return None if self.request is None else _resolve(self.request)

    def refusal_probe_fn(self) -> Callable | None:
        return None if self.refusal_probe is None else _resolve(self.refusal_probe)

    def overlay_text(self, overlay: Any) -> str | None:
        return None if self.overlay_name is None else self.overlay_name.format(overlay=type(overlay).__name__)


def _resolve(dotted: str) -> Callable:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


# reasons shared by several refusals of a subject (one error names all their options)
_TL_ONE_PROMPT = "TransformerLens's vLLM backend is driven one prompt at a time by its own code; use --subject vllm"
_HS_ONE_PROMPT = ("vLLM's hidden-state export is driven one prompt at a time on one device by its own code; "
                  "use --subject vllm for the serving axes and tensor parallelism")
_LENS_ONE_PROMPT = ("vllm-lens is driven one prompt at a time on one device here, its plugin forces enforce_eager=True "
                    "and refuses vLLM's V2 model runner; use --subject vllm")

_ROWS = (
    Subject("vllm", "this harness's overlays on vLLM",
            capture="harness.engines.subject.capture_vllm", any_executor=True),
    Subject("tl-vllm", "TransformerLens's own vLLM backend",
            capture="harness.engines.subject_tl_vllm.capture_tl_vllm",
            plan="harness.engines.subject_tl_vllm.subject_plan",
            request="harness.engines.subject_tl_vllm.subject_request",
            args="harness.engines.subject_tl_vllm.TlHooks",
            no_serving=_TL_ONE_PROMPT,
            no_tp="TransformerLens's vLLM backend is booted on one device by this harness; drop --tp or use "
                  "--subject vllm",
            no_v2=_TL_ONE_PROMPT,
            overlay_name="transformer_lens.model_bridge.sources.vllm (TL's own overlay; the references' hook names "
                         "from {overlay})"),
    Subject("vllm-hidden-states", "vLLM's own extract_hidden_states export: the residual stream between layers only",
            capture="harness.engines.subject_hidden_states.capture_hidden_states",
            plan="harness.engines.subject_hidden_states.subject_plan",
            request="harness.engines.subject_hidden_states.subject_request",
            args="harness.engines.subject_hidden_states.HiddenStatesExport",
            no_serving=_HS_ONE_PROMPT,
            no_tp=_HS_ONE_PROMPT,
            overlay_name="vLLM's extract_hidden_states export (harness.engines.subject_hidden_states)"),
    Subject("vllm-lens", "vllm-lens's residual-stream and attention q/k captures, a peer's plugin on its "
                         "line: --engine-python of scripts/line_env.sh 0.30.0 --peers",
            capture="harness.engines.subject_vllm_lens.capture_vllm_lens",
            plan="harness.engines.subject_vllm_lens.subject_plan",
            request="harness.engines.subject_vllm_lens.subject_request",
            args="harness.engines.subject_vllm_lens.LensLayers",
            no_serving=_LENS_ONE_PROMPT, no_tp=_LENS_ONE_PROMPT, no_compiled=_LENS_ONE_PROMPT,
            no_v2=_LENS_ONE_PROMPT,
            peer=True, kill_switch="VLLM_LENS_DISABLE",
            overlay_name="vllm-lens's output_residual_stream and output_qk captures (harness.engines.subject_vllm_lens)"),
    Subject("nnsight", "nnsight's vLLM integration, a peer refused on a CPU line: its worker is vLLM's GPU worker "
                       "(re-checked by an import probe in the line of scripts/line_env.sh 0.30.0 --peers)",
            capture="harness.engines.subject_nnsight.capture_nnsight",
            refusal_probe="harness.engines.subject_nnsight.probe_refusal",
            peer=True),
)
SUBJECTS: dict[str, Subject] = {s.name: s for s in _ROWS}
PEERS: tuple[str, ...] = tuple(s.name for s in _ROWS if s.peer)


def args_class(kind: str | None) -> type | None:
    """The class of a request's ``subject_args`` that ``kind`` names, where a row names it (``Subject.args``); else None."""
    if kind is None or kind not in {s.args for s in _ROWS if s.args}:
        return None
    return _resolve(kind)


def kill_switches(subject: str) -> dict[str, str]:
    """The environment that keeps every peer's plugin other than ``subject``'s out of its engine."""
    return {s.kill_switch: "1" for s in _ROWS if s.kill_switch and s.name != subject}
