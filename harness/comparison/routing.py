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

The router-logit hooks themselves (``mlp.gate.hook_out``) are always compared.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from harness.vocab.hooks import split_layer

# hooks of the routing layer that do not depend on its expert choice
_BEFORE_ROUTING_IN_LAYER = ("mlp.hook_in", "mlp.gate.hook_out")


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

    @property
    def explained(self) -> bool:
        """Rounding explains the flip only where the router logits are right *and* their own row is
        gated: an inconclusive router row (tolerance above the ceiling) explains nothing."""
        return self.gated and self.rel_err <= self.tolerance

    why = "expert routing flipped at a near-tie upstream"

    def upstream_of(self, hook: str) -> bool:
        return after_routing(hook, self.layer)

    def describe(self) -> str:
        return (f"prompt {self.prompt}, layer {self.layer}, token {self.token}: reference top-k gap "
                f"{self.gap:.2e}, max router-logit difference {self.noise:.2e}, router rel err "
                f"{self.rel_err:.1e} (tolerance {self.tolerance:.1e}{'' if self.gated else ', above the ceiling'}): "
                f"{'explained by rounding' if self.explained else 'NOT explained'}")

    def to_dict(self) -> dict:
        return {**asdict(self), "explained": self.explained}


def find_flips(subject: torch.Tensor, reference: torch.Tensor, k: int, prompt: int, layer: int,
               tolerance: float, gated: bool = True) -> list[Flip]:
    """Tokens of one prompt whose top-``k`` expert set differs; router logits ``[T, n_experts]``;
    ``tolerance``: the router hook's calibrated tolerance (row-wise relative error)."""
    s, r = subject.double(), reference.double()
    if s.shape != r.shape or s.ndim != 2 or not 0 < k < s.shape[-1]:
        return []
    s_set = torch.zeros_like(s, dtype=torch.bool).scatter_(-1, s.topk(k, dim=-1).indices, True)
    r_set = torch.zeros_like(r, dtype=torch.bool).scatter_(-1, r.topk(k, dim=-1).indices, True)
    ranked = r.sort(dim=-1, descending=True).values
    gap = ranked[:, k - 1] - ranked[:, k]
    noise = (s - r).abs().amax(dim=-1)
    rel = (s - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
    return [Flip(prompt, layer, int(t), float(gap[t]), float(noise[t]), float(rel[t]), float(tolerance), gated)
            for t in torch.nonzero((s_set != r_set).any(-1)).flatten().tolist()]


def after_routing(hook: str, layer: int) -> bool:
    """Whether ``hook`` (a canonical name, or ``logprobs`` / ``argmax``) depends on layer ``layer``'s routing."""
    i, kind = split_layer(hook)
    if i is None:
        return not hook.startswith("embed.")  # ln_final, unembed, logits
    if i != layer:
        return i > layer
    return kind in ("hook_out", "mlp.hook_out") or (kind.startswith("mlp.") and kind not in _BEFORE_ROUTING_IN_LAYER)
