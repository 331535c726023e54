"""vLLM's model runners: V1 ``GPUModelRunner`` (``vllm/v1/worker/gpu_model_runner.py``; the CPU runner
subclasses it) and V2 (``vllm/v1/worker/gpu/model_runner.py``).

Contract: :func:`runner_model` -- the loaded model inside a worker; :func:`batch_layout` -- which rows of the
current forward belong to which request; :func:`track_batch_requests` -- the V2 runner's request order;
:func:`wrap_forward_calls` / :func:`replay_inputs` -- where a full CUDA graph is replayed without calling
the model, for the graph-safe path (harness.engines.graph_capture).

Facts by line:

- V1 (0.20-0.32) keeps a persistent ``input_batch`` (``req_ids``) and ``query_start_loc`` on the runner, and
  calls ``self.model`` for every real step in ``_model_forward`` (a ``CUDAGraphWrapper`` under full graphs,
  whose ``unwrap()`` gives the model).
- V2 keeps no ``input_batch``/``query_start_loc`` on the runner: the offsets come from the forward context's
  attention metadata, the request order from the batch its methods return before the forward
  (:data:`_V2_BATCH_METHODS`): ``prepare_inputs`` in 0.20.2 and 0.27.1, ``gather_batch_req_state`` too from
  0.28.0 to 0.32.0 (read in each line's ``vllm/v1/worker/gpu/model_runner.py``).  Its full graphs replay
  through ``cudagraph_manager.run_fullgraph(desc)``, the manager made after the model loads.
"""
from __future__ import annotations

from typing import Any

import torch

INTERNALS: list[tuple[str, str]] = [
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
    ("vllm.forward_context", "get_forward_context"),
]


def runner_model(worker: Any) -> torch.nn.Module:
    """The loaded model inside a worker (V1 and V2 runners both keep ``model``).

    Trap: with full CUDA graphs the V1 runner replaces ``model`` by a
    ``CUDAGraphWrapper`` (not an ``nn.Module``; ``unwrap()`` gives the model)."""
    model = getattr(worker.model_runner, "model", None)
    while model is not None and not isinstance(model, torch.nn.Module) and hasattr(model, "unwrap"):
        model = model.unwrap()
    if not isinstance(model, torch.nn.Module):
        raise AttributeError(f"{type(worker.model_runner).__name__} holds no loaded nn.Module")
    return model


def batch_layout(runner: Any, positions: Any = None, input_ids: Any = None, layout: dict | None = None) -> dict:
    """Which rows of the current forward belong to which request, and where they sit.

    ``req_ids`` and ``query_start_loc``: V1 runner: ``input_batch.req_ids`` and
    ``query_start_loc.np``; V2 runner: the request order :func:`track_batch_requests`
    stashed from ``gather_batch_req_state`` and the forward context's attention metadata
    (offsets only).  Otherwise requests are named by position (``"#0"``...), right within
    one forward only.  ``starts`` (the position of each request's first row) and ``tokens``
    (the ids fed) come from the model's own ``positions`` / ``input_ids`` arguments, so they
    hold for either runner; serving runs stitch by them (harness.engines.stitch).  ``layout``: the
    rows already known (a V2 full-graph replay: :func:`replay_inputs`), instead of the runner's."""
    layout = dict(layout) if layout is not None else _rows_layout(runner)
    qsl = layout.get("query_start_loc")
    if qsl is not None and positions is not None:
        pos = positions[0] if positions.dim() == 2 else positions  # M-RoPE: [3, T]; the text position first
        flat = pos[: qsl[-1]].tolist()
        layout["starts"] = [int(flat[a]) if a < len(flat) else None for a in qsl[:-1]]
    if qsl is not None and input_ids is not None:
        layout["tokens"] = [int(x) for x in input_ids[: qsl[-1]].tolist()]
    return layout


def _rows_layout(runner: Any) -> dict:
    try:
        req_ids = list(runner.input_batch.req_ids)
        qsl = [int(x) for x in runner.query_start_loc.np[: len(req_ids) + 1]]
        return {"req_ids": req_ids, "query_start_loc": qsl}
    except AttributeError:
        pass
    try:
        from vllm.forward_context import get_forward_context

        meta = get_forward_context().attn_metadata
        first = next(iter(meta.values())) if isinstance(meta, dict) else meta
        first = first[0] if isinstance(first, list) else first
        qsl = getattr(first, "query_start_loc_cpu", None)
        if qsl is None:
            qsl = first.query_start_loc.cpu()
        qsl = [int(x) for x in qsl]
        stashed = getattr(runner, "_vp_req_ids", None)
        n = len(stashed) if stashed is not None else int(getattr(first, "num_reqs", len(qsl) - 1))
        req_ids = list(stashed) if stashed is not None else [f"#{i}" for i in range(n)]
        return {"req_ids": req_ids, "query_start_loc": qsl[: n + 1]}
    except Exception:  # noqa: BLE001 -- layout unknown: single-request runs still work
        return {"req_ids": None, "query_start_loc": None}


# V2-runner methods that return the step's batch (or a tuple starting with it) with ``req_ids`` in row
# order, before the forward: 0.32 has both; older V2 lines have at least ``prepare_inputs``.
_V2_BATCH_METHODS = ("gather_batch_req_state", "prepare_inputs")


def track_batch_requests(runner: Any) -> None:
    """V2 model runner (``vllm/v1/worker/gpu/model_runner.py``): it builds each step's input batch
    inside ``execute_model`` and keeps none on itself before the forward.  The methods in
    ``_V2_BATCH_METHODS`` that exist are wrapped to stash the batch's ``req_ids`` (row order) on
    ``runner._vp_req_ids`` for :func:`batch_layout`.  A no-op on the V1 runner, whose persistent
    ``input_batch`` already says it (it has no such method returning ``req_ids`` first)."""
    if hasattr(runner, "input_batch"):
        return
    for name in _V2_BATCH_METHODS:
        original = getattr(runner, name, None)
        if original is None or getattr(original, "_vp_wrapped", False):
            continue

        def wrapped(*args, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            batch = out[0] if isinstance(out, tuple) and out else out
            ids = getattr(batch, "req_ids", None)
            if ids is not None:
                runner._vp_req_ids = list(ids)
                runner._vp_batch = batch  # a full-graph replay's layout (replay_inputs)
            return out

        wrapped._vp_wrapped = True
        setattr(runner, name, wrapped)


def wrap_forward_calls(runner: Any, around: Any) -> list[str]:
    """Graph-safe capture (harness.engines.graph_capture): wrap the runner's call that may replay a
    full CUDA graph without calling the model, as ``around(original, args, kwargs, kind)``.  V1
    (``vllm/v1/worker/gpu_model_runner.py``, 0.20-0.32): ``_model_forward``, which calls
    ``self.model`` (a ``CUDAGraphWrapper`` under full graphs) for every real step (vLLM's dummy
    runs call ``self.model`` directly and are not wrapped).  V2 (``vllm/v1/worker/gpu/model_runner.py``):
    ``cudagraph_manager.run_fullgraph(desc)``; the manager is made after the model loads
    (``initialize_kv_cache``), so ``execute_model`` is wrapped to wrap it on first use.  Returns
    what was wrapped; idempotent."""
    done: list[str] = []
    fwd = getattr(runner, "_model_forward", None)
    if fwd is not None and not hasattr(runner, "cudagraph_manager"):
        if not getattr(fwd, "_vp_wrapped", False):
            def model_forward(*args, _original=fwd, **kwargs):
                return around(_original, args, kwargs, "v1")
            model_forward._vp_wrapped = True
            runner._model_forward = model_forward
        return ["_model_forward"]
    execute = getattr(runner, "execute_model", None)
    if execute is None:
        return done

    def wrap_manager() -> None:
        manager = getattr(runner, "cudagraph_manager", None)
        replay = getattr(manager, "run_fullgraph", None)
        if replay is None or getattr(replay, "_vp_wrapped", False):
            return

        def run_fullgraph(*args, _original=replay, **kwargs):
            return around(_original, args, kwargs, "v2")
        run_fullgraph._vp_wrapped = True
        manager.run_fullgraph = run_fullgraph

    if not getattr(execute, "_vp_wrapped", False):
        def execute_model(*args, _original=execute, **kwargs):
            wrap_manager()
            return _original(*args, **kwargs)
        execute_model._vp_wrapped = True
        runner.execute_model = execute_model
    wrap_manager()
    return ["execute_model", "cudagraph_manager.run_fullgraph"]


def replay_inputs(runner: Any, kind: str, args: tuple, kwargs: dict) -> tuple:
    """``(tokens, positions, input_ids, layout or None)`` of a forward the runner replayed as one
    full graph (:func:`wrap_forward_calls`): V1 from ``_model_forward``'s arguments (the padded
    inputs; the runner's ``input_batch`` says the rows), V2 from the step's batch stashed by
    :func:`track_batch_requests` and the replayed descriptor's ``num_tokens``."""
    from harness.engines.graph_capture import tokens_of

    if kind == "v1":
        return tokens_of(args, kwargs), kwargs.get("positions"), kwargs.get("input_ids"), None
    desc = args[0] if args else kwargs.get("desc")
    batch = getattr(runner, "_vp_batch", None)
    tokens = getattr(desc, "num_tokens", None)
    if batch is None:
        return tokens, None, None, None
    layout = {"req_ids": list(batch.req_ids),
              "query_start_loc": [int(x) for x in batch.query_start_loc_np[: len(batch.req_ids) + 1]]}
    return tokens, getattr(batch, "positions", None), getattr(batch, "input_ids", None), layout
