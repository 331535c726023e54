"""harness.comparison.known_issues: documented bugs of a reference engine, as data.

Contracts checked: known_issue(architecture, reference, hook) matches on the architecture, the
references of the entry and the hook template (any layer, literal otherwise) and returns None
otherwise; KnownIssue.holds applies the documented signature to this run's captures -- for OPT and
BERT, the reference's own scores equal its own pattern (torch.equal) on every prompt -- and is False
where captures are missing, differ, or nothing was captured.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.comparison.known_issues import KNOWN_ISSUES, SIGNATURES, known_issue

SCORES = "blocks.2.attn.hook_attn_scores"


def test_the_opt_bert_and_gptj_entries():
    assert [i.architecture for i in KNOWN_ISSUES] == ["OPTForCausalLM", "BertForMaskedLM", "GPTJForCausalLM",
                                                      "PhiMoEForCausalLM", "AfmoeForCausalLM", "Gemma4ForCausalLM",
                                                      "Llama4ForCausalLM", "LagunaForCausalLM", "RobertaForMaskedLM",
                                                      "JambaForCausalLM", "OlmoHybridForCausalLM"]
    for issue in KNOWN_ISSUES:  # TL's generic AttentionBridge fires the post-softmax weights as scores
        assert (issue.references, issue.template, issue.signature) == (
            ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores", "scores_equal_pattern")
        assert issue.signature in SIGNATURES
        assert "TransformerLens 4.3.0" in issue.reason  # the version it was measured with


@pytest.mark.parametrize("ref, hook, found", [
    ("bridge", SCORES, True), ("compat", "blocks.0.attn.hook_attn_scores", True), ("hf", SCORES, False),
    ("bridge", "blocks.2.attn.hook_pattern", False),
])
def test_bert_lookup(ref, hook, found):
    assert (known_issue("BertForMaskedLM", ref, hook) is KNOWN_ISSUES[1]) is found


@pytest.mark.parametrize("arch, ref, hook, found", [
    ("OPTForCausalLM", "bridge", SCORES, True),
    ("OPTForCausalLM", "compat", "blocks.0.attn.hook_attn_scores", True),
    ("OPTForCausalLM", "hf", SCORES, False),
    ("OPTForCausalLM", "bridge~hf", SCORES, False),
    ("OPTForCausalLM", "bridge", "blocks.2.attn.hook_pattern", False),
    ("OPTForCausalLM", "bridge", "blocks.2.attn.hook_attn_scores.x", False),
    ("LlamaForCausalLM", "bridge", SCORES, False),
])
def test_known_issue_lookup(arch, ref, hook, found):
    assert (known_issue(arch, ref, hook) is KNOWN_ISSUES[0]) is found
    if not found:
        assert known_issue(arch, ref, hook) is None


def _refs(per_prompt):
    return SimpleNamespace(bridge=per_prompt, compat={})


def _caps(equal=True):
    s = torch.rand(2, 3, 3)
    return {SCORES: s, "blocks.2.attn.hook_pattern": s.clone() if equal else s + 1e-3}


def test_holds_when_scores_equal_pattern_on_every_prompt():
    issue = KNOWN_ISSUES[0]
    assert issue.holds(_refs({0: _caps(), 1: _caps()}), "bridge", SCORES)


def test_does_not_hold_when_one_prompt_differs():
    assert not KNOWN_ISSUES[0].holds(_refs({0: _caps(), 1: _caps(equal=False)}), "bridge", SCORES)


def test_does_not_hold_on_missing_or_empty_captures():
    issue = KNOWN_ISSUES[0]
    assert not issue.holds(_refs({}), "bridge", SCORES)
    assert not issue.holds(_refs({0: {SCORES: torch.zeros(1)}}), "bridge", SCORES)  # no pattern
    assert not issue.holds(SimpleNamespace(bridge={0: _caps()}, compat={}), "compat", SCORES)  # compat empty
    assert not issue.holds(SimpleNamespace(bridge=None, compat=None), "bridge", SCORES)


def test_holds_reads_the_asked_references_store():
    refs = SimpleNamespace(bridge={0: _caps(equal=False)}, compat={0: _caps(equal=True)})
    assert KNOWN_ISSUES[0].holds(refs, "compat", SCORES)
    assert not KNOWN_ISSUES[0].holds(refs, "bridge", SCORES)
