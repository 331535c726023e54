"""A module boundary for a mixture-of-experts router's choice: which experts each token runs, with
what weights.

Contract: vLLM computes the choice in ``router.select_experts(...) -> (topk_weights, topk_ids)``, a
method of a plain (non-module) router object that the MoE runner calls (where the runner and its router
sit, per vLLM line: harness.engines.vllm_compat.router).  :func:`install` gives such a runner a child module
:data:`TAP` (``<moe block>.experts.vp_route``) and wraps its router's ``select_experts`` so that every
call also calls the tap with the choice; the tap's output is then an ordinary module output that
the worker's hooks read (overlays: ``mlp.gate.hook_expert_weights`` is ``out[0]``,
``mlp.gate.hook_expert_indices`` ``out[1]``).  The tap returns

* ``out[0]``: the weights as TransformerLens's router bridge holds them, ``[T, n_experts]``: each
  chosen expert's weight at its id -- the factor its output is multiplied by, so times the runner's
  ``routed_scaling_factor`` where vLLM applies that to the routed output rather than to the weights
  (GLM-4-MoE, DeepSeek; which object holds that factor moved between vLLM lines:
  harness.engines.vllm_compat.routed_output_scale) -- and 0 elsewhere;
* ``out[1]``: the chosen ids, ``[T, k]``, sorted ascending per token -- the canonical order
  (harness.vocab.hook_rules.SORTED_KINDS): which experts, not in which order the kernel listed them.

Traps:

- Only runners whose router has ``select_experts`` (the modular path) can be tapped; a monolithic
  kernel routes inside its own op, and :func:`install` returns False there (the hooks never fire and
  say so).
- The tap computes its two outputs on every routed forward once installed; it is installed only
  when a read names it (harness.engines.vllm_worker.CaptureExtension.vp_install), never otherwise.
- ``select_experts`` is wrapped on the router *instance*: the class, and every other runner, are
  untouched; installing twice is a no-op.
"""
from __future__ import annotations

import torch

from harness.engines.vllm_compat.router import after_select_experts, num_experts, routed_output_scale, router_of

TAP = "vp_route"


class RouteTap(torch.nn.Module):
    """Identity-like module whose output is the router's choice in canonical form (module doc)."""

    def __init__(self, n_experts: int, output_scale: float = 1.0) -> None:
        super().__init__()
        self.n_experts, self.output_scale = n_experts, float(output_scale)

    def forward(self, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids = topk_ids.long()
        dense = torch.zeros(ids.shape[0], self.n_experts, dtype=topk_weights.dtype, device=topk_weights.device)
        dense.scatter_(1, ids, topk_weights * self.output_scale if self.output_scale != 1.0 else topk_weights)
        return dense, ids.sort(dim=-1).values


def install(runner: torch.nn.Module) -> bool:
    """Give ``runner`` its :data:`TAP` child and route its router's choice through it; False where the
    runner has no tappable router."""
    if isinstance(getattr(runner, TAP, None), RouteTap):
        return True
    router = router_of(runner)
    if router is None:
        return False
    n_experts = num_experts(runner, router)
    if n_experts <= 0:
        return False
    # where the runner scales the routed output instead of the weights (vLLM's routed_scaling_factor with
    # apply_routed_scale_to_output: GLM-4-MoE, DeepSeek), the weight each expert's output is multiplied by is
    # both; which object holds that scale is a fact of the vLLM line (vllm_compat.router.routed_output_scale)
    tap = RouteTap(n_experts, routed_output_scale(runner))
    runner.add_module(TAP, tap)
    after_select_experts(router, tap)
    return True


def install_for(model: torch.nn.Module, paths: list[str]) -> None:
    """Install the tap on every runner a module path of ``paths`` names as ``<runner>.vp_route``."""
    from harness.engines.reads import resolve_module

    for path in paths:
        parent, _, leaf = path.rpartition(".")
        if leaf == TAP and parent:
            runner = resolve_module(model, parent)
            if runner is not None:
                install(runner)
