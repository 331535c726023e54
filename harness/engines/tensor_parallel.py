"""Tensor parallelism: how a capture is spread over ranks, and how the ranks' captures become one.

Contract: :func:`tp_layout` names the layout of one read from the module's vLLM layer
class (column-/row-parallel linear, logits processor, attention, rotary) and whether it
sits in a parallel region (:func:`in_parallel_region`); :func:`merge_ranks` turns the
ranks' captures into the tensor one device would have produced; :func:`rank_disagreement`
measures replicated reads (0.0 means bitwise equal).  Pure functions of modules and tensors;
what vLLM's layer classes are called and which attributes say their shards is the version
layer's (harness.engines.vllm_compat.layers), so nothing here differs between vLLM lines.

Trap: when there are fewer kv heads than ranks, ranks hold replicated kv shards; those
are bitwise equal and are taken once (``cat``), or skipped by ``step`` (``cols``).
"""
from __future__ import annotations

import torch

from harness.engines.vllm_compat.layers import (COLUMN_PARALLEL, ROW_PARALLEL, class_names, column_shards,
                                                gathers_output, parallel_kind, row_parallel)


def in_parallel_region(parent: torch.nn.Module | None) -> bool:
    """Whether ``parent``'s other children see per-rank shards: it holds both a column-parallel
    layer (which splits heads / features over ranks) and a row-parallel one (which reduces them),
    like ``self_attn`` (qkv_proj ... o_proj) or ``mlp`` (gate_up_proj ... down_proj).  A per-head
    q/k norm, the rotary embedding, the attention op and the activation there hold shards."""
    if parent is None:
        return False
    kinds = set()
    for child in parent.children():
        kinds |= class_names(child)
    return COLUMN_PARALLEL in kinds and ROW_PARALLEL in kinds


def tp_layout(module: torch.nn.Module, side: str, tp: int, in_region: bool = False) -> dict:
    """How a read of ``module`` (``side`` ``in`` or ``out``) is spread over ``tp`` ranks;
    ``in_region``: the module sits between a column- and a row-parallel layer
    (:func:`in_parallel_region` of its parent).

    ``{"kind": "replicated"}``: every rank holds the whole value (post all-reduce,
    norms, residual stream); ``"cat"``: rank r holds shard r along the feature
    dim after the tokens (row-parallel inputs, attention, rotary, per-head norms
    and activations inside a parallel region); ``"cols"``:
    column-parallel outputs, per-rank ``segments`` ``[width, step]`` (q | k | v or
    gate | up; ``step`` > 1 where kv heads are replicated over ranks); ``"sum"``:
    partial sums (a row-parallel layer that does not reduce); ``"rank0"``: only
    rank 0's value counts (the gathered logits)."""
    if tp <= 1:
        return {"kind": "replicated"}
    kind = parallel_kind(module)
    if kind == "logits":
        return {"kind": "rank0"}
    if kind in ("column", "qkv"):
        if side == "in" or gathers_output(module):
            return {"kind": "replicated"}
        sizes, replicas = column_shards(module)
        steps = [1] + [replicas] * (len(sizes) - 1) if kind == "qkv" else [1] * len(sizes)
        return {"kind": "cols", "segments": [[s, st] for s, st in zip(sizes, steps)]}
    if kind == "row":
        input_is_parallel, reduce_results = row_parallel(module)
        if side == "in":
            return {"kind": "cat" if input_is_parallel else "replicated"}
        return {"kind": "replicated" if reduce_results else "sum"}
    if in_region or kind in ("attention", "rotary"):
        return {"kind": "cat"}
    return {"kind": "replicated"}


def merge_ranks(layout: dict, values: list[torch.Tensor | None]) -> torch.Tensor:
    """One tensor from the ranks' captures of one read (``values[r]`` from rank r)."""
    kind = layout["kind"]
    if kind in ("replicated", "rank0") or len(values) == 1:
        return values[0]
    if any(v is None for v in values):
        raise ValueError(f"a rank recorded nothing for a {kind} read")
    if kind == "cat":
        # Ranks holding the same shard (kv heads replicated when there are fewer kv heads
        # than ranks) are bitwise equal: each shard is taken once.  Shards are along the
        # first dim after the tokens: [T, width] or [T, heads, head_dim].
        shards = [v for i, v in enumerate(values) if i == 0 or not torch.equal(v, values[i - 1])]
        return torch.cat(shards, dim=1 if shards[0].ndim >= 2 else -1)
    if kind == "sum":
        return torch.stack(values).sum(0)
    if kind == "cols":
        widths = [w for w, _ in layout["segments"]]
        parts = [torch.split(v, widths, dim=-1) for v in values]
        out = []
        for s, (_, step) in enumerate(layout["segments"]):
            out += [parts[r][s] for r in range(0, len(values), step)]
        return torch.cat(out, dim=-1)
    raise ValueError(f"unknown tensor-parallel layout {kind!r}")


def rank_disagreement(values: list[torch.Tensor | None]) -> float:
    """Largest ``max|rank r - rank 0| / rms(rank 0)`` over ranks (0.0: identical)."""
    base = values[0].double()
    scale = base.pow(2).mean().sqrt().item() or 1.0
    worst = 0.0
    for v in values[1:]:
        if v is None or v.shape != values[0].shape:
            return float("inf")
        worst = max(worst, (v.double() - base).abs().max().item() / scale)
    return worst
