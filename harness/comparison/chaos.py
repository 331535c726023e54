"""Chaotic tokens: where the reference's own low-precision run leaves the truth (pure).

A few tokens of a real model carry "massive activations": on SmolLM2-135M in bf16 the token
after BOS of the 7-token prompt sits 0.32 from the fp32 truth at ``blocks.11.hook_out`` and up
to 0.62 deeper, while every other token of every prompt stays below the 0.25 ceiling (the
reference's bf16 run against its fp32 run on the bf16-rounded weights).  Two valid bf16 implementations diverge at such a
token by no multiple of one's own error (vLLM's sat 0.87 where the reference's sat 0.32), and
attention carries the divergence to every later query: ``attn.hook_pattern`` / ``hook_z`` /
``hook_out`` of *every* later row of that prompt moved by 6-21 % (median row) in vLLM, which
failed the median-row gate although the mapping is right (fp32 passes the same hooks at 1e-4).

Contract: :func:`find_chaotic(run, truth, ceiling)` takes one reference engine's captures in
the run dtype and in the truth dtype (``[prompt][hook]``, canonical ``[T, d]`` residual
stream ``blocks.{i}.hook_out``) and returns a :class:`ChaoticToken` for each token whose own
run-dtype row error first exceeds the dtype's ceiling, at the first layer where it does.
A chaotic token is an event for :mod:`harness.comparison.set_aside`: rows at that layer and
after (and the final norm, unembed and logits) leave out that prompt's tokens at and after it;
the floors are computed without them too (harness.references.reference), so the rows that
remain gate on their worst row as well.

Traps:
- Decided from the reference's own floor run only, never from vLLM's values: a mapping bug in
  vLLM cannot make a token chaotic, so it cannot hide itself.  A wrong reference (NaN) is the
  non-finite check's business, not this one's: a NaN row error is not "above the ceiling".
- The whole layer where the token first exceeds the ceiling is set aside from it (its attention
  and MLP hooks come before its ``hook_out``), and every later layer, since attention carries the
  token to every later query.
- The same test between the two references (against the smaller of the ceiling and that residual
  hook's own tolerance, since vLLM cannot sit within tolerance of both where they disagree by
  more) sets tokens aside for ``compat-processed`` rows only:
  HookedTransformer's weight processing rounds a MoE router's weights differently in bf16, so it
  can flip an expert choice the bridge and vLLM agree on (measured: qwen3_moe bf16 on an H200,
  token 24 of the long prompt).  It never touches the rows against the other references.
- A prompt whose chaotic token is at position 0 is set aside whole; a row left with no prompt is
  inconclusive, never pass (harness.comparison.rows).

Own routing flips (:func:`find_own_flips`, :class:`OwnFlip`): a mixture-of-experts reference's own run-dtype
run can choose another expert set than its truth-dtype run at a near-tie (measured: GPT-OSS at odd shapes in
bf16, layer 0 of the long prompt, tokens 27, 93, 123, 160, 182).  Downstream of that choice the reference's
run sits O(1) from its truth although the residual row error there can stay just under the ceiling (0.21), so
the chaos test above does not catch it -- and each such token inflated the floor of every later hook (a router
row's tolerance 1.73, far above the ceiling, so no vLLM flip downstream could be explained).  Such a token is an
event like a chaotic token, with the scope of an expert-routing flip (harness.comparison.routing): the hooks
downstream of that layer's routing (its MLP output and ``hook_out``, every later layer, the final norm, unembed
and logits; not the router logits, not the layer's attention), at that token and after it (attention carries
it to every later query of the prompt; an encoder's whole prompt).  It leaves the floors, and it leaves the
rows against vLLM too: the reference's own run in this dtype lands on either side of the tie, so its value
downstream pins nothing there -- vLLM choosing either expert set is right, and a tolerance calibrated on a run
that chose the other set would be O(1) wide.  Decided from the references' own expert indices alone (each
engine's run-dtype choice vs its own truth-dtype choice: the ``hook_expert_indices`` they capture, compared as
sets, and the choice the router's own rule makes from the router logits they capture -- a sparsemixer's threshold
members move its weights while its ids stay: Phi-3.5-MoE), never from vLLM's values: a vLLM bug cannot make one.  vLLM's own flips stay the business of
harness.comparison.routing, explained only where its router row is gated.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

import torch

from harness.comparison.routing import after_routing, chosen, routing_module
from harness.vocab.hooks import layer_of

RESIDUAL_OUT = re.compile(r"^blocks\.(\d+)\.hook_out$")
# a router's chosen expert ids, [T, k], under any engine's name (mlp.gate., mlp.router., feed_forward.router.)
EXPERT_INDICES = re.compile(r"^blocks\.(\d+)\.\S*hook_expert_indices$")
LAYER = re.compile(r"^blocks\.(\d+)\.")


@dataclass(frozen=True)
class ChaoticToken:
    prompt: int
    layer: int  # the first layer whose residual output carries the token above the ceiling
    token: int
    floor: float  # the reference's own row error there (run dtype vs truth dtype)
    ceiling: float
    # "floor": the reference's own run vs its truth run; "references": processed compatibility mode vs
    # the bridge, both in the run dtype (a near-tie only the processed weights flip: its own expert choice)
    source: str = "floor"

    explained = True  # decided by the references alone, with no vLLM value involved

    @property
    def why(self) -> str:
        if self.source == "references":
            return "the references disagree here (processed compatibility mode vs the bridge)"
        return "a chaotic token of the reference's own low-precision run"

    def upstream_of(self, hook: str) -> bool:
        layer = layer_of(hook)
        if layer is None:  # ln_final, unembed, logprobs, argmax; not the embeddings (any naming)
            return "embed" not in hook or "unembed" in hook
        return layer >= self.layer

    def describe(self) -> str:
        if self.source == "references":
            return (f"prompt {self.prompt}, token {self.token}: processed compatibility mode is {self.floor:.2f} from "
                    f"the bridge at blocks.{self.layer}.hook_out, above that row's tolerance {self.ceiling:.2g}")
        return (f"prompt {self.prompt}, token {self.token}: the reference's own run is {self.floor:.2f} from its "
                f"truth run at blocks.{self.layer}.hook_out, above the ceiling {self.ceiling:g}")

    def to_dict(self) -> dict:
        return asdict(self)


def row_errors(run: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """``||run - truth|| / ||truth||`` per token of ``[T, d]`` tensors."""
    a, b = run.double(), truth.double()
    return (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)


def find_chaotic(run: dict[int, dict[str, torch.Tensor]], truth: dict[int, dict[str, torch.Tensor]],
                 ceiling: float, source: str = "floor", limit: Callable[[str], float] | None = None
                 ) -> list[ChaoticToken]:
    """Every (prompt, token) whose residual-stream row error first exceeds ``ceiling`` (or, with
    ``limit``, the smaller of the ceiling and ``limit(hook)``), at that layer."""
    if not math.isfinite(ceiling):
        return []
    out: list[ChaoticToken] = []
    for p in sorted(run):
        layers = sorted((int(m.group(1)), name) for name in run[p]
                        if (m := RESIDUAL_OUT.match(name)) and name in truth.get(p, {}))
        seen: set[int] = set()
        for layer, name in layers:
            if run[p][name].shape != truth[p][name].shape:
                continue
            err = row_errors(run[p][name], truth[p][name])
            bound = ceiling if limit is None else min(ceiling, limit(name))
            for t in torch.nonzero(err > bound).flatten().tolist():
                if t not in seen:
                    seen.add(t)
                    out.append(ChaoticToken(p, layer, int(t), float(err[t]), bound, source))
    return out


@dataclass(frozen=True)
class OwnFlip:
    """A token whose expert set the reference's own run-dtype run chose other than its truth-dtype run (module doc)."""

    prompt: int
    layer: int
    token: int
    hook: str  # the reference's hook holding the choice
    run: tuple[int, ...]  # expert ids chosen in the run dtype
    truth: tuple[int, ...]  # ... and in the truth dtype
    source: str = "routing"

    explained = True  # decided by the references alone, with no vLLM value involved
    why = "an expert-routing flip of the reference's own low-precision run"

    def upstream_of(self, hook: str) -> bool:
        return after_routing(hook, self.layer, routing_module(self.hook))

    def describe(self) -> str:
        which = (f"experts {list(self.run)} where its truth run chose {list(self.truth)}" if self.run != self.truth
                 else f"experts {list(self.run)} as its truth run did, but another weighting (a threshold of the rule)")
        return (f"prompt {self.prompt}, layer {self.layer}, token {self.token}: the reference's own run chose {which} "
                f"({self.hook})")

    def to_dict(self) -> dict:
        return {**asdict(self), "run": list(self.run), "truth": list(self.truth)}


def event_from_dict(d: dict) -> ChaoticToken | OwnFlip:
    """The event :meth:`ChaoticToken.to_dict` / :meth:`OwnFlip.to_dict` wrote (stored references)."""
    if d.get("source") == "routing":
        return OwnFlip(**{**d, "run": tuple(d["run"]), "truth": tuple(d["truth"])})
    return ChaoticToken(**d)


def find_own_flips(run: dict[int, dict[str, torch.Tensor]], truth: dict[int, dict[str, torch.Tensor]],
                   routers: Mapping[str, tuple[int, object]] | None = None) -> list[OwnFlip]:
    """Every (prompt, layer, token) whose expert choice differs between one reference engine's run-dtype and
    truth-dtype captures: its chosen ids (``hook_expert_indices``, ``[T, k]``, compared as sets), and, for each
    router-logit hook ``routers`` names (``name -> (k, overlays.base.Routing or None)``), the choice the router's
    own rule makes from its logits (harness.comparison.routing.chosen: a sparsemixer's threshold members too,
    which move its weights while its ids stay).  A rule with a correction bias is left to the captured ids (the
    bias is the checkpoint's, not captured).  One event per (prompt, layer, token)."""
    out: dict[tuple[int, int, int], OwnFlip] = {}
    for p in sorted(run):
        for name in sorted(run[p]):
            m, rule = EXPERT_INDICES.match(name), (routers or {}).get(name)
            if (m is None and (rule is None or not LAYER.match(name))) or name not in truth.get(p, {}):
                continue
            a, b = run[p][name], truth[p][name]
            if a.shape != b.shape or a.ndim < 1 or a.is_floating_point() != b.is_floating_point():
                continue
            if m is not None:
                a, b = (x.reshape(-1, x.shape[-1]).long().sort(dim=-1).values for x in (a, b))
                ids, differ, layer = (a, b), (a != b).any(-1), int(m.group(1))
            else:
                k, routing = rule
                if getattr(routing, "bias", None) or not 0 < k < a.shape[-1]:
                    continue
                a, b = (chosen(x.reshape(-1, x.shape[-1]), k, routing)[0] for x in (a, b))
                n = run[p][name].shape[-1]  # the chosen ids lead the choice; a sparsemixer's members follow
                ids = tuple(c[:, :n].nonzero()[:, 1].reshape(c.shape[0], -1) for c in (a, b))
                differ, layer = (a != b).any(-1), int(LAYER.match(name).group(1))
            for t in torch.nonzero(differ).flatten().tolist():
                key = (p, layer, int(t))
                out.setdefault(key, OwnFlip(p, layer, int(t), name, tuple(ids[0][t].tolist()),
                                            tuple(ids[1][t].tolist())))
    return [out[k] for k in sorted(out)]
