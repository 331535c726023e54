"""harness.engines.route_tap: the router's choice as a module output.

Contracts checked: the tap's out[0] scatters each chosen expert's weight to its id (0 elsewhere),
times the runner's output scale where vLLM scales the routed output instead of the weights; out[1]
is the ids sorted ascending; install wraps select_experts on the router instance only (the choice
itself returned unchanged, the tap's forward hooks see it), is idempotent, and refuses a runner
without a tappable router; install_for taps only runners named as <runner>.vp_route.
"""
from __future__ import annotations

import torch

from harness.engines import route_tap


class _Router:
    global_num_experts = 4

    def select_experts(self, hidden_states, router_logits):
        w, ids = router_logits.softmax(-1).topk(2, dim=-1)
        return w, ids.to(torch.int32)


class _Runner(torch.nn.Module):
    def __init__(self, scale=1.0):
        super().__init__()
        self.router, self.routed_scaling_factor = _Router(), scale


def test_tap_scatters_weights_and_sorts_ids():
    tap = route_tap.RouteTap(4, output_scale=2.5)
    dense, ids = tap(torch.tensor([[0.7, 0.3]]), torch.tensor([[3, 1]], dtype=torch.int32))
    assert torch.allclose(dense, torch.tensor([[0.0, 0.75, 0.0, 1.75]])) and ids.tolist() == [[1, 3]]


def test_install_routes_the_choice_through_the_tap_once():
    runner, seen = _Runner(), []
    assert route_tap.install(runner) and route_tap.install(runner)  # the second is a no-op
    runner.vp_route.register_forward_hook(lambda mod, args, out: seen.append(out))
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.0]])
    w, ids = runner.router.select_experts(None, logits)
    assert ids.tolist() == [[1, 3]] and ids.dtype == torch.int32  # the engine's own result, unchanged
    (dense, sorted_ids), = seen  # one call, one record
    assert sorted_ids.tolist() == [[1, 3]] and torch.equal(dense[0, [1, 3]], w[0]) and dense[0, 0] == 0
    assert _Router.select_experts is not runner.router.select_experts  # the instance is wrapped, not the class


def test_a_runner_without_a_router_is_not_tapped():
    assert not route_tap.install(torch.nn.Linear(2, 2))


def test_install_for_taps_only_named_runners():
    model = torch.nn.Module()
    model.a, model.b = _Runner(), _Runner()
    route_tap.install_for(model, ["a.vp_route", "b.gate"])
    assert isinstance(model.a.vp_route, route_tap.RouteTap) and not hasattr(model.b, "vp_route")
