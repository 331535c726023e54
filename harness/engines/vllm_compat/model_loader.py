"""vLLM's model loader (``vllm/model_executor/model_loader/base_loader.py``: ``BaseModelLoader``).

Contract: :func:`before_weight_postprocessing` -- run a change on every freshly loaded model before vLLM
post-processes its weights (the test-only engine faults: harness.engines.engine_faults).

Facts by line: ``BaseModelLoader.load_model`` calls the module-level ``process_weights_after_loading`` it
imported by name into ``base_loader`` (read in 0.20.2, 0.27.1, 0.31.0 and 0.32.0).
"""
from __future__ import annotations

from typing import Any

INTERNALS: list[tuple[str, str]] = [
    ("vllm.model_executor.model_loader.base_loader", "process_weights_after_loading"),
]


def before_weight_postprocessing(apply: Any) -> None:
    """Run ``apply(model)`` on every freshly loaded model after its ``load_weights``
    and before vLLM's ``process_weights_after_loading`` (oneDNN repacking on CPU,
    quantization, fused-MoE layouts), where a change to a parameter still reaches
    the kernels.  vLLM 0.20-0.32: ``BaseModelLoader.load_model`` (every loader
    inherits it) calls ``load_weights`` then the module-level
    ``process_weights_after_loading`` it imported by name into
    ``vllm.model_executor.model_loader.base_loader``; that name is wrapped.
    Idempotent per process.  Raises naming the internal if a vLLM line moved it."""
    from vllm.model_executor.model_loader import base_loader

    original = getattr(base_loader, "process_weights_after_loading", None)
    if original is None:
        raise AttributeError("vllm.model_executor.model_loader.base_loader has no process_weights_after_loading: "
                             "update harness.engines.vllm_compat.before_weight_postprocessing for this vLLM line")
    if getattr(original, "_vp_before", None) is not None:
        original._vp_before = apply  # already wrapped in this process: the newest fault wins
        return

    def process_weights_after_loading(model, *args, **kwargs):
        wrapper._vp_before(model)
        return original(model, *args, **kwargs)

    wrapper = process_weights_after_loading
    wrapper._vp_before = apply
    base_loader.process_weights_after_loading = wrapper
