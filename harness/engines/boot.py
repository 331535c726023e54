"""The one door into a vLLM engine: every ``LLM(...)`` of the harness and the benchmarks is built here.

Contract:

* :func:`env_defaults` -- the engine process's environment for ``device`` / ``tp``
  (:func:`harness.engines.vllm_compat.subject_env_defaults`), each set only where the caller's
  environment has no value (``os.environ.setdefault``): a run's own settings (the variant's
  ``VLLM_USE_V2_MODEL_RUNNER``, a user's export) win.
* :func:`boot_llm` -- builds ``vllm.LLM`` from named arguments and layers of keyword arguments:

  - ``**fixed``: the arguments the call site names (``model``, ``dtype``, ``max_model_len``,
    ``enforce_eager``, ``worker_extension_cls``, ...).  No layer may repeat one: that raises
    ``TypeError``, as Python does for ``LLM(x=1, **{"x": 2})``.
  - ``defaults``, then ``llm_kwargs(**version)`` (the version layer: what differs by device and vLLM
    line; ``version=None``: not asked, the caller says everything itself, as the benchmarks do), then
    each of ``overrides`` in order: merged left to right, a later layer winning (the subjects pass the
    serving scheme's arguments, the pooling runner and the request's ``llm_overrides`` last).

  It returns the engine; what the engine is then asked (``collective_rpc``, ``generate``) is the caller's.
* :data:`CAPTURE_EXTENSION` -- the suite's worker extension (capture only);
  :data:`BENCH_EXTENSION` -- the same plus the benchmarks' probes (harness.engines.bench_probes),
  which only benchmarks load.

Traps:

- The environment must be in place before the process imports ``vllm`` (vLLM reads parts of it at
  import and at first use), so :func:`env_defaults` is a step of its own, called first thing, not part of
  :func:`boot_llm` (whose caller has usually imported ``vllm.SamplingParams`` by then).
- TransformerLens's ``boot_vllm`` (the ``tl-vllm`` subject, the benchmarks' TL peers) builds TL's own
  engine; it does not come through here, only its environment does (:func:`env_defaults`).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

CAPTURE_EXTENSION = "harness.engines.vllm_worker.CaptureExtension"
BENCH_EXTENSION = "harness.engines.bench_probes.BenchCaptureExtension"


def env_defaults(device: str = "cpu", tp: int = 1) -> None:
    """Set the engine environment of ``device`` / ``tp`` where it is unset (module doc)."""
    from harness.engines.vllm_compat import subject_env_defaults

    for key, value in subject_env_defaults(device, tp).items():
        os.environ.setdefault(key, value)


def engine_arguments(*, version: Mapping[str, Any] | None = None, defaults: Mapping[str, Any] | None = None,
                     overrides: Iterable[Mapping[str, Any]] = (), **fixed: Any) -> dict[str, Any]:
    """What :func:`boot_llm` hands ``LLM(...)``: ``fixed``, then the merged layers (module doc).  Raises
    ``TypeError`` where a layer repeats a fixed argument."""
    from harness.engines.vllm_compat import llm_kwargs

    layered: dict[str, Any] = dict(defaults or {})
    if version is not None:
        layered.update(llm_kwargs(**version))
    for layer in overrides:
        layered.update(layer)
    clash = sorted(set(fixed) & set(layered))
    if clash:
        raise TypeError(f"LLM() got multiple values for keyword argument(s) {clash}")
    return {**fixed, **layered}


def boot_llm(*, version: Mapping[str, Any] | None = None, defaults: Mapping[str, Any] | None = None,
             overrides: Iterable[Mapping[str, Any]] = (), **fixed: Any):
    """The vLLM engine of these arguments (module doc); the one ``LLM(...)`` construction."""
    from vllm import LLM

    return LLM(**engine_arguments(version=version, defaults=defaults, overrides=overrides, **fixed))
