"""Rules that sort canonical hooks into groups by name alone: which hooks hold heads-first values,
which write the residual stream (and so get a ``compat-processed`` row), which are router logits.

Contract: pure predicates on hook names and the name sets behind them, declared once here so that
the plan (harness.values.plan) and the comparisons that act on a group (harness.comparison.shapes,
harness.comparison.routing, harness.references.processing) read the same rule.  Why each group
exists is said where it is acted on; this module only names its members.

Trap: a template is matched literally except for ``{i}`` (harness.vocab.hooks), so the router
pattern ``blocks.{i}.mlp.gate.hook_out`` is not an ``mlp.hook_out``.
"""
from __future__ import annotations

import re

from harness.vocab.hooks import hook_kind, template_of

# canonical values laid out [heads, query, key]: their token axis is 1, not 0
HEADS_FIRST_KINDS = frozenset({"attn.hook_pattern", "attn.hook_attn_scores"})

# tensors written to the residual stream: what HookedTransformer's weight processing centres
RESIDUAL_WRITES: frozenset[str] = frozenset({
    "embed.hook_out", "blocks.{i}.hook_in", "blocks.{i}.hook_resid_mid", "blocks.{i}.hook_out",
    "blocks.{i}.attn.hook_out", "blocks.{i}.mlp.hook_out",
})

# expert ids chosen per token, compared as sets: canonical order ascending on every side
SORTED_KINDS = frozenset({"mlp.gate.hook_expert_indices", "mlp.hook_expert_indices",
                          "mlp.router.hook_expert_indices",  # GPT-OSS: TL names its router mlp.router
                          "mixer.gate.hook_expert_indices"})  # Nemotron-H: the MoE is the layer's mixer

# a mixture-of-experts layer's router logits, the layer in group 1: the MLP's router, or the mixer's where the MoE is
# the layer's one sublayer (Nemotron-H, overlays/nemotron_h.py)
GATE = re.compile(r"^blocks\.(\d+)\.(?:mlp|mixer)\.gate\.hook_out$")


def heads_first(hook: str) -> bool:
    """Whether ``hook``'s canonical value is ``[heads, T, T]`` (token axis 1)."""
    return hook_kind(hook) in HEADS_FIRST_KINDS


def sorted_per_token(hook: str) -> bool:
    """Whether ``hook``'s canonical value is a set per token, held sorted ascending (expert ids)."""
    return hook_kind(hook) in SORTED_KINDS


def processed_hook(hook: str) -> bool:
    """Whether ``hook`` writes the residual stream (gets a ``compat-processed`` row)."""
    return template_of(hook) in RESIDUAL_WRITES
