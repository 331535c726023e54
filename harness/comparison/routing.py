"""Expert-routing flips at near-ties (mixture-of-experts models), as pure functions.

A router picks each token's top-k experts from its logits.  Where the reference's
k-th and (k+1)-th logits nearly tie, any rounding difference (TF32 matmuls, bf16)
can swap the chosen experts, and everything downstream of that choice -- the
layer's MLP output, the stream after it, every later layer through attention,
the logits -- then differs by O(1) although both engines are right.  A constant
tolerance cannot tell that from a mapping bug; this rule can:

* :func:`find_flips` compares vLLM's and the reference's top-k expert *sets* token by
  token.  A flip is **explained** when vLLM's router logits at that token are
  right: their row's relative error is within the router hook's own calibrated
  tolerance.  (A swap needs a router-logit difference of at least half the
  reference's k-th vs (k+1)-th gap, so an in-tolerance router can only swap
  near-ties; the report shows each gap.)  An unexplained flip -- router logits
  outside their tolerance, as a mapping bug makes them -- stays a failure:
  nothing is set aside for it, and the router row fails too.
* :func:`after_routing` says which hooks lie downstream of layer ``l``'s
  routing; a flip is an event of :mod:`harness.comparison.set_aside`, so the
  evaluation compares those without the *tokens at and after* an
  explained flip at or before their layer (a causal model's earlier tokens are
  untouched; a flip at token 0 sets the whole prompt aside), says so in each row,
  and a row left with nothing to compare is *inconclusive*, never *pass*.
* A flip is explained only where the router row itself is gated (its calibrated
  tolerance at or below the dtype's ceiling): an uncapped bf16 router tolerance
  (1.3-2.6 measured on Mixtral) would explain almost any flip.

* The choice is the model's own rule (:func:`chosen`, the router hook's ``overlays.base.Routing``):
  the top-k logits (Mixtral, Qwen3-MoE), or sigmoid scores plus a correction bias over expert groups
  (GLM-4-MoE, DeepSeek-V3), which can flip a whole group where raw logits show no near-tie.  Each
  side's choice uses its own bias (vLLM's parameter, the checkpoint's), and a flip is explained only
  where the two biases agree within the router's tolerance: a wrong bias is a routing bug.

The router-logit hooks themselves (``mlp.gate.hook_out``) are always compared.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from harness.vocab.hooks import split_layer

# hooks of the routing layer that do not depend on its expert choice
_BEFORE_ROUTING_IN_LAYER = ("mlp.hook_in", "mlp.gate.hook_out")
# the sublayers whose router a flip can come from: the MLP's (every MoE but one), or the mixer's where the MoE is the
# layer's one sublayer (Nemotron-H: blocks.{i}.mixer.gate.hook_out); a hybrid layer's Mamba mixer runs *before* its MoE
# MLP, so which one routed decides whether the layer's mixer hooks are downstream
ROUTING_MODULES = ("mlp", "mixer")


@dataclass(frozen=True)
class Flip:
    prompt: int
    layer: int
    token: int
    gap: float  # reference's k-th minus (k+1)-th router logit at that token
    noise: float  # max |vLLM - reference| over that token's router logits
    rel_err: float  # ||vLLM - reference|| / ||reference|| of that token's router logits
    tolerance: float  # the router hook's calibrated tolerance
    gated: bool = True  # that tolerance is at or below the dtype's ceiling: the router row itself is gated
    bias_rel_err: float = 0.0  # ||vLLM bias - checkpoint bias|| / ||checkpoint bias|| (0: no bias in the rule)
    module: str = "mlp"  # the sublayer that routed (ROUTING_MODULES)

    @property
    def explained(self) -> bool:
        """Rounding explains the flip only where the router logits are right *and* their own row is
        gated (an inconclusive router row, tolerance above the ceiling, explains nothing) *and* both
        sides chose with the same correction bias."""
        return self.gated and self.rel_err <= self.tolerance and self.bias_rel_err <= self.tolerance

    why = "expert routing flipped at a near-tie upstream"

    def upstream_of(self, hook: str) -> bool:
        return after_routing(hook, self.layer, self.module)

    def describe(self) -> str:
        bias = f", correction-bias rel err {self.bias_rel_err:.1e}" if self.bias_rel_err else ""
        return (f"prompt {self.prompt}, layer {self.layer}, token {self.token}: reference top-k gap "
                f"{self.gap:.2e}, max router-logit difference {self.noise:.2e}, router rel err "
                f"{self.rel_err:.1e} (tolerance {self.tolerance:.1e}{'' if self.gated else ', above the ceiling'}){bias}: "
                f"{'explained by rounding' if self.explained else 'NOT explained'}")

    def to_dict(self) -> dict:
        return {**asdict(self), "explained": self.explained}


def chosen(logits: torch.Tensor, k: int, routing=None, bias: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts each token's router chooses, ``[T, n_experts]`` booleans, and how near the choice is
    to a tie (``[T]``, in the rule's score space: the smallest gap between a chosen group and the best
    group left out, or a chosen expert and the best allowed expert left out).  ``routing``: the router
    hook's ``overlays.base.Routing`` (None: the top-k logits); ``bias``: its correction bias."""
    x = logits.double()
    if routing is not None and routing.scoring == "sparsemixer":
        return _sparsemixer_chosen(x, float(routing.jitter_eps))
    if routing is None:
        ranked = x.sort(dim=-1, descending=True).values
        mask = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, x.topk(k, dim=-1).indices, True)
        return mask, ranked[:, k - 1] - ranked[:, k]
    scores = x.sigmoid() if routing.scoring == "sigmoid" else x.softmax(dim=-1)
    if bias is not None:
        scores = scores + bias.double().reshape(1, -1)
    t, groups = scores.shape[0], routing.n_group
    per_group = scores.view(t, groups, -1)
    group_scores = per_group.topk(2, dim=-1).values.sum(-1) if bias is not None else per_group.amax(-1)
    inf = torch.full((t,), math.inf, dtype=x.dtype)
    ranked_groups = group_scores.sort(dim=-1, descending=True).values
    group_gap = (ranked_groups[:, routing.topk_group - 1] - ranked_groups[:, routing.topk_group]
                 if routing.topk_group < groups else inf)
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(
        -1, group_scores.topk(routing.topk_group, dim=-1).indices, True)
    allowed = scores.masked_fill(~keep.repeat_interleave(scores.shape[-1] // groups, dim=-1), -math.inf)
    ranked = allowed.sort(dim=-1, descending=True).values
    expert_gap = ranked[:, k - 1] - ranked[:, k] if k < allowed.shape[-1] else inf
    expert_gap = torch.where(torch.isfinite(expert_gap), expert_gap, inf)
    mask = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, allowed.topk(k, dim=-1).indices, True)
    return mask, torch.minimum(group_gap, expert_gap)


def _sparsemixer_chosen(x: torch.Tensor, jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi-3.5-MoE's sparsemixer (top-2, inference), as HF's ``sparsemixer`` and vLLM's ``phimoe_routing_function``
    compute it: expert 1 is the arg-max logit and its weight a softmax over the logits whose relative distance
    ``(max - s) / max(|s|, max)`` is within ``2 * jitter_eps``; expert 2 the arg-max of the others, likewise.  The
    choice is ``[chosen ids | stage-1 members | stage-2 members]`` (``[T, 3 n_experts]``): a member crossing the
    threshold changes a weight as a swapped id changes the output.  The gap: the smaller of the top-3 logits'
    gaps and each expert's distance from a threshold (in logit units)."""
    thr, t = 2.0 * jitter_eps, x.shape[0]
    rows = torch.arange(t)
    top1 = x.argmax(dim=-1)
    m1 = x[rows, top1][:, None]
    d1 = (m1 - x) / x.abs().clamp(min=m1)
    masked = x.clone()
    masked[rows, top1] = -math.inf
    top2 = masked.argmax(dim=-1)
    m2 = x[rows, top2][:, None]
    d2 = (m2 - x) / x.abs().clamp(min=m2)
    in1, in2 = d1 <= thr, (d2 <= thr) & torch.isfinite(masked)
    chosen_ids = torch.zeros_like(x, dtype=torch.bool)
    chosen_ids[rows, top1] = True
    chosen_ids[rows, top2] = True
    ranked = x.sort(dim=-1, descending=True).values
    id_gap = (ranked[:, :2] - ranked[:, 1:3]).amin(-1) if x.shape[-1] > 2 else ranked[:, 0] - ranked[:, 1]
    edge1 = ((d1 - thr).abs() * x.abs().clamp(min=m1)).amin(-1)
    edge2 = ((d2 - thr).abs() * x.abs().clamp(min=m2)).masked_fill(~torch.isfinite(masked), math.inf).amin(-1)
    return torch.cat([chosen_ids, in1, in2], dim=-1), torch.minimum(id_gap, torch.minimum(edge1, edge2))


def find_flips(subject: torch.Tensor, reference: torch.Tensor, k: int, prompt: int, layer: int,
               tolerance: float, gated: bool = True, routing=None, subject_bias: torch.Tensor | None = None,
               reference_bias: torch.Tensor | None = None, module: str = "mlp") -> list[Flip]:
    """Tokens of one prompt whose chosen expert set differs; router logits ``[T, n_experts]``;
    ``tolerance``: the router hook's calibrated tolerance (row-wise relative error); ``routing``,
    ``subject_bias``, ``reference_bias``: the choice rule and each side's correction bias (:func:`chosen`);
    ``module``: the sublayer that routed (:func:`routing_module` of the router hook)."""
    s, r = subject.double(), reference.double()
    if s.shape != r.shape or s.ndim != 2 or not 0 < k < s.shape[-1]:
        return []
    s_set, _ = chosen(s, k, routing, subject_bias)
    r_set, gap = chosen(r, k, routing, reference_bias)
    noise = (s - r).abs().amax(dim=-1)
    rel = (s - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
    bias_err = 0.0
    if routing is not None and routing.bias:
        if subject_bias is None or reference_bias is None or subject_bias.shape != reference_bias.shape:
            bias_err = math.inf  # one side's bias unknown: nothing is explained
        else:
            sb, rb = subject_bias.double(), reference_bias.double()
            bias_err = float((sb - rb).norm() / rb.norm().clamp_min(torch.finfo(torch.float64).tiny))
    return [Flip(prompt, layer, int(t), float(gap[t]), float(noise[t]), float(rel[t]), float(tolerance), gated,
                 bias_err, module)
            for t in torch.nonzero((s_set != r_set).any(-1)).flatten().tolist()]


def routing_module(router_hook: str) -> str:
    """The sublayer (:data:`ROUTING_MODULES`) whose router ``router_hook`` (a router-logit or expert-choice hook)
    reads: ``mixer`` for ``blocks.{i}.mixer.gate.*``, else ``mlp``."""
    _, kind = split_layer(router_hook)
    return "mixer" if (kind or "").startswith("mixer.") else "mlp"


def after_routing(hook: str, layer: int, module: str = "mlp") -> bool:
    """Whether ``hook`` (a canonical name, or ``logprobs`` / ``argmax``) depends on layer ``layer``'s routing, done
    by its ``module`` (:data:`ROUTING_MODULES`)."""
    if module not in ROUTING_MODULES:
        raise ValueError(f"after_routing: module {module!r} is none of {ROUTING_MODULES}")
    i, kind = split_layer(hook)
    if i is None:
        return not hook.startswith("embed.")  # ln_final, unembed, logits
    if i != layer:
        return i > layer
    if module == "mixer":  # the MoE is the layer's one sublayer: its output and the layer's, not its input or logits
        return kind in ("hook_out", "mixer.hook_out") or (
            kind.startswith("mixer.") and kind not in ("mixer.hook_in", "mixer.gate.hook_out"))
    return (kind in ("hook_out", "mlp.hook_out", "hook_mlp_out") or kind.startswith("ln2_post.")  # a post-MLP norm
            or (kind.startswith("mlp.") and kind not in _BEFORE_ROUTING_IN_LAYER))
