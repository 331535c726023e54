"""Known bugs in a *reference* engine, as data -- never in vLLM or in our overlays.

Contract: :func:`known_issue(architecture, reference, hook)` returns the
:class:`KnownIssue` that may cover that parity row, or ``None``.  It covers the
row only when the row *failed* and the issue's documented signature holds in
this run's reference captures (:meth:`KnownIssue.holds`, applied by
harness.comparison.gate.Gate.finalize): a name match alone explains nothing,
and an error row is never explained.  The parity test xfails a covered row and
fails a row whose issue no longer reproduces (the row passed), so a stale entry
cannot linger.  Reports keep the row's real numbers and status, add the
reason, and count it apart from unexplained failures.  Each entry names the
version it was measured with and the evidence.

Retired: "TransformerLens 4.3.0's default weight processing raises
``RuntimeError: shape '[4, 32]' is invalid for input of size 64`` for OLMo-2"
held for a checkpoint with ``attention_bias=True`` only.  The synthetic OLMo-2
lost its attention biases (vLLM 0.20 drops them, and no released OLMo-2 has
any: harness/models/families.py); processed compatibility mode then matches vLLM on
every residual hook, so the entry went (a strict xfail would have failed).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.vocab.hooks import matches


def _scores_equal_pattern(refs, reference: str, reference_hook: str) -> bool:
    """The reference's own attention scores equal its own pattern (bitwise), on every prompt."""
    store = {"bridge": refs.bridge, "compat": refs.compat}.get(reference) or {}
    pattern = reference_hook.replace("hook_attn_scores", "hook_pattern")
    pairs = [(caps.get(reference_hook), caps.get(pattern)) for caps in store.values()]
    return bool(pairs) and all(s is not None and p is not None and torch.equal(s, p) for s, p in pairs)


# signature name -> check(refs, reference, reference_hook): does the documented bug show in this run?
SIGNATURES = {"scores_equal_pattern": _scores_equal_pattern}


@dataclass(frozen=True)
class KnownIssue:
    architecture: str
    references: tuple[str, ...]
    template: str  # "blocks.{i}.attn.hook_attn_scores", or "*" for every hook of those references
    reason: str
    signature: str  # a key of SIGNATURES: the bug's observable fingerprint, checked on every run

    def holds(self, refs, reference: str, reference_hook: str) -> bool:
        return SIGNATURES[self.signature](refs, reference, reference_hook)


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        "OPTForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug: for OPT the generic AttentionBridge.forward fires hook_attn_scores with "
        "HF's post-softmax attention weights (transformer_lens/model_bridge/generalized_components/"
        "attention.py, 'Most HF implementations return post-softmax weights'), so the bridge's "
        "hook_attn_scores equals its hook_pattern (torch.equal is True) and holds 0 where vLLM's scores "
        "are -inf. vLLM's hook_pattern derived from the same q and k passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "BertForMaskedLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its BERT adapter wraps HF's BertAttention in the generic "
        "AttentionBridge, which fires hook_attn_scores with HF's post-softmax attention weights, so the "
        "bridge's hook_attn_scores equals its hook_pattern (torch.equal is True; measured on the synthetic "
        "bert checkpoint, where q @ k^T / sqrt(d_head) is not the pattern). vLLM's hook_pattern derived from "
        "the same q and k (bidirectional, no mask) passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "GPTJForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its GPT-J adapter (GptjArchitectureAdapter) wraps HF's "
        "GPTJAttention in the generic AttentionBridge, which fires hook_attn_scores with HF's post-softmax "
        "attention weights, so the bridge's hook_attn_scores equals its hook_pattern (torch.equal is True on every "
        "layer of the synthetic gptj checkpoint, values in [0, 1]) and holds 0 where vLLM's scores are -inf. "
        "vLLM's hook_pattern derived from the same rotated q and k passes against both references.",
        signature="scores_equal_pattern",
    ),
)


@dataclass(frozen=True)
class LayoutBug:
    """A reference that holds a hook's numbers in a wrong head layout: the same values per token, split into
    other heads.  The row is compared after regrouping the reference into vLLM's layout (a reshape of each
    token's row: the same numbers, in the same order), the note naming the bug.  Its signature, checked on every
    row it covers: the reference's shape differs from the subject's with the same token count and the same
    numbers per token.  Where the shapes agree the bug is gone and the row is an error saying to retire the
    entry; where they differ otherwise the shape mismatch stands."""

    architectures: tuple[str, ...]
    references: tuple[str, ...]
    template: str
    reason: str
    # the two HF config keys whose values must differ for the bug to show (equal: the wrong split is the right
    # one, and the row is compared as it is)
    shows_when_differ: tuple[str, str] | None = None

    def covers(self, architecture: str, reference: str, hook: str) -> bool:
        return architecture in self.architectures and reference in self.references and matches(self.template, hook)

    def shows(self, config: dict | None) -> bool | None:
        """Whether the bug can show for a model with these config values (None: not known -- a stored
        reference captured before the values were recorded)."""
        if self.shows_when_differ is None:
            return True
        a, b = (config or {}).get(self.shows_when_differ[0]), (config or {}).get(self.shows_when_differ[1])
        return None if a is None or b is None else a != b


def _regroupable(subject: torch.Tensor, reference: torch.Tensor) -> bool:
    return (subject.shape != reference.shape and subject.dim() >= 1 and reference.dim() >= 1
            and subject.shape[0] == reference.shape[0] and subject.numel() == reference.numel())


LAYOUT_BUGS: tuple[LayoutBug, ...] = (
    LayoutBug(
        ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"), ("bridge", "compat", "bridge-ragged"),
        "blocks.{i}.attn.hook_z",
        "TransformerLens 4.3.0 bug: its DeepSeek attention bridge splits o_proj's input into heads of the config's "
        "head_dim, which HF sets to qk_rope_head_dim, instead of v_head_dim (n_heads x v_head_dim columns), so its "
        "hook_z has the wrong head count wherever the two differ (every released DeepSeek-V2/V3 and Kimi-K2: 64 "
        "against 128); regrouped per token into vLLM's n_heads x v_head_dim",
        shows_when_differ=("v_head_dim", "qk_rope_head_dim"),
    ),
)


def layout_config(cfg) -> dict:
    """The HF config values the :data:`LAYOUT_BUGS` depend on (recorded by the reference side)."""
    keys = {k for bug in LAYOUT_BUGS if bug.shows_when_differ for k in bug.shows_when_differ}
    return {k: getattr(cfg, k) for k in sorted(keys) if isinstance(getattr(cfg, k, None), (int, float, str))}


def regroup_layout(architecture: str, reference: str, hook: str, pairs, config: dict | None = None):
    """``(pairs, note, stale)`` for a row a :class:`LayoutBug` covers: the pairs with each reference regrouped
    into its subject's shape and the note that says so, where the signature holds on every pair; ``stale``
    (an error message) where the bug should show for this model (``config``: :func:`layout_config`) and the
    reference already has the subject's shape.  Unchanged pairs and empty strings where no entry covers the
    row, the model cannot show the bug, or the shapes differ some other way."""
    bug = next((b for b in LAYOUT_BUGS if b.covers(architecture, reference, hook)), None)
    shows = bug.shows(config) if bug is not None else False
    if bug is None or not pairs or shows is False:
        return pairs, "", ""
    if all(s.shape == r.shape for s, r in pairs):
        if shows is None:  # the model's values are unknown: nothing to say either way
            return pairs, "", ""
        return pairs, "", (f"{hook} vs {reference}: documented reference layout bug no longer reproduces (the "
                           f"reference's shape {tuple(pairs[0][1].shape)} is vLLM's): retire it from "
                           f"harness/comparison/known_issues.py LAYOUT_BUGS ({bug.reason[:80]}...)")
    if not all(_regroupable(s, r) for s, r in pairs):
        return pairs, "", ""
    shapes = f"{tuple(pairs[0][1].shape)} -> {tuple(pairs[0][0].shape)}"
    return ([(s, r.reshape(s.shape)) for s, r in pairs],
            f"[reference layout bug, its signature holds ({shapes}): {bug.reason}]", "")


def known_issue(architecture: str, reference: str, hook: str) -> KnownIssue | None:
    for issue in KNOWN_ISSUES:
        if issue.architecture == architecture and reference in issue.references and matches(issue.template, hook):
            return issue
    return None
