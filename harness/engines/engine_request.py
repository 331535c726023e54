"""What an engine process is asked to do: one typed request, the only door into the engine.

Contract: :class:`EngineRequest` is frozen and is the whole of what a subject process
(harness.engines.subject_vllm, subject_tl_vllm, subject_hidden_states) is told.  A run builds it once
(harness.values.engine_request: from the target, the variant, the plan and the prompts); a variation of
it -- the refusal probe's two-token boot, the GGUF file's run, a launch's own ``out_dir`` -- is a
``dataclasses.replace`` of it, never a hand-built dict.  It crosses the process boundary as JSON:
:meth:`EngineRequest.to_json` on the host, :meth:`EngineRequest.read` (:meth:`from_json`) in the engine,
which rebuilds the same value; a field the class does not know, or a required one that is missing, is a
:class:`EngineRequestError` naming it, so a host and an engine of different code fail on the first line
instead of reading a default.  The engine reads attributes, never keys.

Fields fall into groups: every subject's (the checkpoint and how vLLM runs it), the default subject's
(``reads``, ``params``, ``row_dims``, ``flat_rows``: what its hooks record and export, and how a serving run's
stitcher cuts their token rows), an encoder's (:class:`Pooling`), and
``subject_args``: another subject's own part, a frozen dataclass its module declares and its registry row names
(harness.engines.subjects, ``Subject.args``: TransformerLens's backend's hooks, vLLM's hidden-state export, vllm-lens's
layers), so adding a subject adds no field here.  A subject ignores the groups of the others.

Traps:

- Frozen means no field can be rebound; the mappings (``row_dims``, ``flat_rows``, ``llm_overrides``)
  are read-only views of the request's own deep copies, so a caller's later change to its dict does not
  reach a request already built (a value nested in ``llm_overrides`` stays a plain dict: vLLM type-checks
  what ``LLM(**...)`` hands it).  A request holding them is not hashable.
- JSON has no tuples: sequences come back as lists and are turned into tuples again on construction
  (``__post_init__``), so ``from_json(r.to_json()) == r`` for every request; ``reads`` and ``params``
  are stored sorted and unique (the order the engine installs hooks in is then the same for every
  caller).  ``prompts`` keep their order: prompt ``p`` is the ``p``-th.
- ``out_dir`` belongs to one launch (the host's work folder for that engine), so the run's request
  leaves it empty and each ``capture_*`` sets it; an engine given none refuses to start.
- ``subject_args`` crosses as a JSON object with its class's dotted path under ``kind``; only a class some registry
  row names is built (:func:`subject_args_of`), so an engine of other code fails on the first line here too.
- ``llm_overrides`` are merged into ``LLM(...)`` last (a GGUF file's tokenizer and quantization, an MLA
  backend): they win over every argument the engine derives itself.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any


class EngineRequestError(ValueError):
    """A request the engine cannot read: a field unknown to it, a required one missing, or an empty
    ``out_dir``; the message names them."""


def _frozen_map(value: Mapping | None) -> Mapping:
    """A read-only view of a deep copy, so nothing outside the request can change it (nested values stay
    plain dicts and lists: ``LLM(**overrides)`` hands them to vLLM, which type-checks them)."""
    return MappingProxyType(copy.deepcopy(dict(value or {})))


def _tokens(prompts) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(t) for t in p) for p in prompts)


@dataclass(frozen=True)
class Pooling:
    """An encoder's engine inputs (overlays.base.Encoder): vLLM's pooling ``task`` for ``LLM.encode``, and
    each prompt's token type ids (None: none are passed)."""
    task: str
    token_types: tuple[tuple[int, ...], ...] | None = None
    # the per-token output's width: None, the vocabulary (the head's logits); d_model where vLLM serves the
    # encoder without its head and ``encode`` returns its last hidden state (overlays.base.Encoder.output)
    width: int | None = None

    def __post_init__(self) -> None:
        if self.token_types is not None:
            object.__setattr__(self, "token_types", _tokens(self.token_types))

    def types_of(self, prompt: int) -> tuple[int, ...] | None:
        """Prompt ``prompt``'s token type ids, or None."""
        return None if self.token_types is None else self.token_types[prompt]


@dataclass(frozen=True)
class EngineRequest:
    # every subject's
    checkpoint: str  # a local checkpoint directory, or a GGUF file
    dtype: str  # vLLM's dtype: float32 | bfloat16 | float16
    prompts: tuple[tuple[int, ...], ...]  # token ids, in prompt order
    vocab_size: int  # the width of every log-prob row
    max_model_len: int
    out_dir: str = ""  # where this launch's engine writes (set per launch: module doc)
    device: str = "cpu"  # "cpu" | "cuda": the engine's arguments (harness.engines.vllm_compat)
    enforce_eager: bool = True  # False: vLLM's torch.compile (CUDA graphs on a GPU)
    tp: int = 1  # vLLM's tensor_parallel_size
    executor: str = "mp"  # vLLM's distributed_executor_backend: mp | ray
    serving: str = "single"  # how the engine is driven (harness.engines.serving.SCHEMES)
    full_logprobs: bool = True  # every entry of every row; False: the top LOGPROB_TOP_K (harness.logprob_request)
    ragged: bool = True  # also run all prompts in one batch (the ``bridge-ragged`` rows)
    llm_overrides: Mapping[str, Any] = field(default_factory=dict)  # into LLM(...) last (module doc)
    # the default subject's (harness.engines.subject_vllm)
    reads: tuple[tuple[str, str], ...] = ()  # (module, read) pairs to record (overlays.base.READ_GRAMMAR)
    params: tuple[str, ...] = ()  # parameter names to export (the host-side conversions read them)
    row_dims: Mapping[str, int] = field(default_factory=dict)  # read key -> its token dim where not 0
    # read key -> the heads a line may fold into its token rows (HookSpec.flat_rows: a 2-D [T x heads, d] read); the
    # serving stitcher cuts such a read's rows in units of it (harness.engines.stitch)
    flat_rows: Mapping[str, int] = field(default_factory=dict)
    pooling: Pooling | None = None  # an encoder: vLLM's pooling runner and LLM.encode instead of generate
    discover: bool = False  # also hand back the loaded model's module tree (harness.engines.discovery)
    timing_repeats: int = 5  # capture-off forwards timed after the captures
    # another subject's own part (module doc): the frozen dataclass its registry row names (Subject.args); None
    subject_args: Any = None

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 -- frozen
        set_("checkpoint", str(self.checkpoint))
        set_("out_dir", str(self.out_dir))
        set_("prompts", _tokens(self.prompts))
        set_("reads", tuple(sorted({(str(m), str(r)) for m, r in self.reads})))
        set_("params", tuple(sorted(set(self.params))))
        for name in ("llm_overrides", "row_dims", "flat_rows"):
            set_(name, _frozen_map(getattr(self, name)))
        if isinstance(self.pooling, Mapping):
            set_("pooling", _build(Pooling, self.pooling, "pooling"))
        if isinstance(self.subject_args, Mapping):
            set_("subject_args", subject_args_of(self.subject_args))

    @property
    def prompt_lengths(self) -> list[int]:
        return [len(p) for p in self.prompts]

    # --- across the process boundary ---------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON values: tuples as lists, nested values as dicts (``subject_args`` with its ``kind``)."""
        data = _plain(self)
        if self.subject_args is not None:
            data["subject_args"] = {"kind": kind_of(self.subject_args), **data["subject_args"]}
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: Mapping) -> "EngineRequest":
        """The request ``data`` (:meth:`to_dict`'s form) holds; :class:`EngineRequestError` naming every
        unknown and every missing field."""
        return _build(cls, data, "engine request")

    @classmethod
    def from_json(cls, text: str) -> "EngineRequest":
        return cls.from_dict(json.loads(text))

    @classmethod
    def read(cls, path: str | Path) -> "EngineRequest":
        """The engine's side: the request the host wrote to ``path``, checked (an ``out_dir`` is required)."""
        request = cls.from_json(Path(path).read_text())
        if not request.out_dir:
            raise EngineRequestError(f"engine request {path}: no out_dir (each launch sets its own; module doc)")
        return request


def frozen_map(value: Mapping | None) -> Mapping:
    """A read-only view of a deep copy (for a subject's own mappings in its ``subject_args``)."""
    return _frozen_map(value)


def kind_of(args: Any) -> str:
    """The dotted path of ``args``'s class: how ``subject_args`` names it in JSON (``Subject.args``)."""
    return f"{type(args).__module__}.{type(args).__qualname__}"


def subject_args_of(data: Mapping) -> Any:
    """``subject_args`` from its JSON form: the class ``kind`` names, which some registry row must name
    (harness.engines.subjects, ``Subject.args``), built from the other keys (:func:`_build`'s checks)."""
    from harness.engines.subjects import args_class

    data = dict(data)
    kind = data.pop("kind", None)
    cls = args_class(kind)
    if cls is None:
        raise EngineRequestError(f"subject_args: kind {kind!r} is no subject's (harness.engines.subjects, Subject.args); "
                                 "a host and an engine of different code?")
    return _build(cls, data, f"subject_args ({kind})")


def _plain(value: Any) -> Any:
    if is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _build(cls, data: Mapping, what: str):
    """``cls(**data)`` after checking the names: unknown and missing fields are errors that name them."""
    if not isinstance(data, Mapping):
        raise EngineRequestError(f"{what}: expected a JSON object of {cls.__name__}'s fields, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    unknown, missing = sorted(set(data) - known), sorted(required - set(data))
    if unknown or missing:
        said = [f"unknown field(s) {unknown}" if unknown else "", f"missing field(s) {missing}" if missing else ""]
        raise EngineRequestError(f"{what}: {'; '.join(s for s in said if s)} ({cls.__name__} knows "
                                 f"{sorted(known)}; a host and an engine of different code?)")
    return cls(**data)


__all__ = ["EngineRequest", "EngineRequestError", "Pooling", "frozen_map", "kind_of", "subject_args_of"]
