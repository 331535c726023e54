"""harness.values.plan for an encoder (the family's overlay declares overlays.base.Encoder), engine-free:
the plan carries the declaration and each prompt's token types; processed compatibility-mode rows follow
the overlay's ("compat-processed", None); a causal LM's plan has no encoder and no token types."""
from __future__ import annotations

import pytest

from harness.models.families import FAMILIES
from harness.values.plan import build_plan
from harness.values.variant import Variant


def _plan(family):
    from harness.models.targets import target_for_family

    return build_plan(target_for_family(FAMILIES[family]), Variant.make("float32", "cpu"))


@pytest.fixture(scope="module")
def bert():
    return _plan("bert")


def test_an_encoders_plan_carries_its_declaration_and_token_types(bert):
    assert bert.encoder is not None and bert.encoder.pooling_task == "token_classify"
    assert bert.token_types([[4] * 7, [4] * 2]) == [[0, 0, 0, 1, 1, 1, 1], [0, 1]]


def test_a_causal_lms_plan_has_none():
    plan = _plan("qwen3")
    assert plan.encoder is None and plan.token_types([[4] * 7]) is None


def test_processed_rows_only_where_processing_centres_the_value(bert):
    processed = {c.hook for c in bert.cases if c.reference == "compat-processed"}
    assert processed == {f"blocks.{i}.mlp.hook_out" for i in range(3)}
    assert set(bert.processed_names) == {f"blocks.{i}.hook_mlp_out" for i in range(3)}
    compat = {c.hook for c in bert.cases if c.reference == "compat"}
    assert "blocks.0.hook_out" in compat and "embed.hook_out" not in compat  # hook_embed is embed_ln's output


def test_the_logit_rows_and_the_derived_rows_are_planned(bert):
    assert [c.hook for c in bert.cases[-2:]] == ["logprobs", "argmax"]
    assert all(not d.causal for d in bert.derived.values())


def test_derived_scores_get_an_hf_row_unless_hf_holds_no_score_tensor(bert):
    """HF's own scores / pattern (read at its eager softmax) gate the derived hooks; GPT-OSS's sinks join HF's
    softmax after a row-max shift (Tree.scores_not_in_hf), so its derived scores have TransformerLens's rows only."""
    hf_derived = {c.hook for c in bert.cases if c.reference == "hf" and c.derived}
    assert hf_derived == set(bert.derived) and hf_derived
    gpt_oss = _plan("gpt_oss")
    assert gpt_oss.derived and not any(c.reference == "hf" and c.derived for c in gpt_oss.cases)
    assert {c.reference for c in gpt_oss.cases if c.derived} == {"bridge", "compat"}
