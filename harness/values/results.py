"""The result schema: rows, a model's result, a model's run.  Data only.

Contract: a :class:`HookResult` is one compared (reference, hook) row with the numbers
behind its verdict; a :class:`ModelResult` is one (target, variant) with its rows,
non-firing hooks, timings and versions, and is what a report's JSON holds
(``to_dict``); :class:`ModelRun` adds the in-memory captures for callers that want
them (tests).  Statuses are :data:`Status`; a row's final status is assigned in one
place (harness.comparison.gate.Gate.finalize) and never mutated afterwards.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


# pass: compared, within tolerance.  fail: compared, above it.  error: could not be
# compared (no value, a conversion failed, shapes differ).  inconclusive: compared,
# but the reference's own noise in this dtype is too large to gate the row.
Status = Literal["pass", "fail", "error", "inconclusive"]


@dataclass
class HookResult:
    model: str
    reference: str  # "bridge" | "compat" | "compat-processed" | "hf" | "bridge~hf" | "bridge-ragged"
    hook: str  # canonical name (the vLLM side)
    reference_hook: str  # name on the reference side
    layer: int | None
    kind: str
    status: Status
    tolerance: float
    rel_err: float = math.nan
    max_abs: float = math.nan
    ref_scale: float = math.nan
    cos_min: float = math.nan
    worst: dict = field(default_factory=dict)
    message: str = ""
    floor: float | None = None  # the reference's own noise floor for this hook (harness.comparison.tolerances)
    logit_metrics: dict = field(default_factory=dict)  # KL, top-1, top-k overlap (logprobs rows)
    derived: bool = False  # computed host-side from other hooks' captures (harness.comparison.derived)
    known_issue: str | None = None  # a documented bug in the reference engine (harness.comparison.known_issues)
    # the typical row beside the worst one (harness.comparison.gate): median row error and median signed
    # scale deviation, each with the floor run's own value and its calibrated tolerance
    rel_median: float = math.nan
    floor_median: float | None = None
    tolerance_median: float = math.nan
    scale_median: float = math.nan
    floor_scale: float | None = None
    tolerance_scale: float = math.nan
    # error / tolerance on the statistics that gate the row (< 1 passes; a planted bug sits orders of
    # magnitude above 1): decided once, by harness.comparison.gate.Gate.finalize, and only read after
    margin: float = math.nan

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
    device: str = "cpu"  # "cpu" or "cuda"
    subject: str = "vllm"  # harness.values.variant.SUBJECTS
    device_info: dict = field(default_factory=dict)  # GPU name, driver, CUDA, precision mode
    # which kernels computed the numbers (harness.kernel_path.label: "avx2", "avx512-bf16-amx",
    # "cuda-FLASH_ATTN-piecewise"): a verdict is a verdict of (model, variant, kernel path)
    kernel_path: str = ""
    compiled: bool = False  # vLLM with torch.compile (and CUDA graphs on GPU) instead of eager
    rows: list[HookResult] = field(default_factory=list)
    nonfiring: list[dict] = field(default_factory=list)
    # "vllm" / "hf": engine boot and forward latency; "phases": seconds per phase of the run, in order
    # (harness.pipeline.runner names them; "report" is added by the report writer); "peak_memory":
    # MiB (harness.phases.peak_memory: which process each covers)
    timings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    prompts: list[list[int]] = field(default_factory=list)
    prompt_names: list[str] = field(default_factory=list)
    # where the prompts came from and, for text prompts, their texts, decoded tokens and notes
    # (harness.models.text_prompts.PromptSet.info)
    prompt_info: dict = field(default_factory=dict)
    # tokens whose top-k experts differ between vLLM and the bridge (harness.comparison.routing):
    # explained ones set prompts aside downstream, unexplained ones leave the failures standing
    routing_flips: list[dict] = field(default_factory=list)
    chaotic_tokens: list[dict] = field(default_factory=list)  # harness.comparison.chaos: set aside, with why
    selected_hooks: list[str] | None = None  # selective capture: the hooks asked for (None: all offered)
    skipped: str | None = None  # this (model, dtype) is not run, and why (a declared vLLM refusal)
    # a declared known vLLM bug that applies to this run, and whether its signature held in the rows
    # (harness.comparison.known_vllm_bugs.VllmBugCheck.to_dict); None where none applies
    known_vllm_bug: dict | None = None
    # a --model-path run that fails: its architecture's known vLLM bugs checked as candidates whose signature did not
    # hold (VllmBugCheck.to_dict each, with ``inferred_from``); one that held is ``known_vllm_bug`` instead
    candidate_vllm_bugs: list[dict] = field(default_factory=list)
    error: str | None = None
    wall_s: float = 0.0
    fingerprint: str | None = None  # code, checkpoint, variant, versions (harness.values.fingerprint)
    provenance: dict = field(default_factory=dict)  # a packaged checkpoint's origin (package, file sha256, ...)
    # a serving run (harness.engines.serving): scheme, engine steps, generated tokens, and per prompt
    # where every position came from (harness.engines.stitch.Coverage); empty for the single shape
    serving: dict = field(default_factory=dict)
    # stored references (--references-dir, harness.references.stored): loaded or computed, and where
    references_stored: dict = field(default_factory=dict)
    # the documented reference bugs the references ran corrected for, "; "-joined (harness.references.reference:
    # "group-wise gated norm", known_issues.GATED_NORM_BUGS; a config mend's label and reason,
    # harness.references.config_mends); None: the references ran as they are
    reference_corrected: str | None = None
    # hooks read from HF's unfused projections because the loaded tree has no fused one (harness.values.plan.Plan.reads_found)
    unfused_reads: list[str] = field(default_factory=list)
    # the model's verdict and counts, decided once when the run ends (harness.comparison.verdict)
    summary: dict = field(default_factory=dict)

    @classmethod
    def start(cls, target: Any, variant: Any, overlay_name: str | None = None) -> "ModelResult":
        """An empty result naming ``target`` and ``variant`` (harness.values.variant.Variant)."""
        return cls(target.name, target.architecture, overlay_name or (getattr(target.overlay, "report_name", None) or type(target.overlay).__name__
                                                         if target.overlay is not None else target.overlay_name), target.source,
                   str(target.checkpoint) if target.checkpoint is not None else "", variant.dtype, target.seed, device=variant.device,
                   subject=variant.subject, compiled=variant.compiled, device_info=dict(variant.run_info),
                   provenance=dict(getattr(target, "provenance", None) or {}))

    def to_dict(self) -> dict:
        return asdict(self)

    def row(self, reference: str, hook: str) -> HookResult | None:
        for r in self.rows:
            if r.reference == reference and r.hook == hook:
                return r
        return None


@dataclass
class ModelRun:
    target: Any  # harness.models.targets.Target
    result: ModelResult
    plan: Any = None  # harness.values.plan.Plan
    subject: Any = None  # harness.engines.subject.SubjectCapture
    refs: Any = None  # harness.references.reference.ReferenceCapture

    @property
    def specs(self) -> dict:
        return self.plan.specs if self.plan is not None else {}
