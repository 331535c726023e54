"""Known bugs in a *reference* engine, as data -- never in vLLM or in our overlays.

Contract: :func:`known_issue(architecture, reference, hook)` returns the
:class:`KnownIssue` covering that parity row, or ``None``.  The pytest plugin
marks a covered test ``xfail(strict=True)``: it passes while the bug is there
and fails the day the reference is fixed (strict XPASS), so a stale entry
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

from harness.vocab.hooks import matches


@dataclass(frozen=True)
class KnownIssue:
    architecture: str
    references: tuple[str, ...]
    template: str  # "blocks.{i}.attn.hook_attn_scores", or "*" for every hook of those references
    reason: str


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        "OPTForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug: for OPT the generic AttentionBridge.forward fires hook_attn_scores with "
        "HF's post-softmax attention weights (transformer_lens/model_bridge/generalized_components/"
        "attention.py, 'Most HF implementations return post-softmax weights'), so the bridge's "
        "hook_attn_scores equals its hook_pattern (torch.equal is True) and holds 0 where vLLM's scores "
        "are -inf. vLLM's hook_pattern derived from the same q and k passes against both references.",
    ),
)


def known_issue(architecture: str, reference: str, hook: str) -> KnownIssue | None:
    for issue in KNOWN_ISSUES:
        if issue.architecture == architecture and reference in issue.references and matches(issue.template, hook):
            return issue
    return None
