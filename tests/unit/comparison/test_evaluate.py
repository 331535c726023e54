"""evaluate(): the heart of the harness, on small synthetic captures (no engine runs).

The captures are hand-built tensors in the exact containers the engines fill
(SubjectCapture, ReferenceCapture), so each test states one rule of the evaluation:
one row per planned case in plan order, a capture that never fired is an error on
every reference, a wrong value fails with its position, the ceiling makes a row
inconclusive, and a derived hook says which input it is missing.
"""
from __future__ import annotations

import math

import pytest
import torch

from harness.comparison.evaluate import evaluate
from harness.comparison.gate import Gate, margin
from harness.engines.subject import SubjectCapture
from harness.values.plan import Plan, _cases
from harness.references.reference import ReferenceCapture
from harness.vocab.capture_keys import RAGGED, capture_key, read_key
from overlays.base import Derived, Heads, HookSpec, UnfoldNorm

T, D, H, DH = 5, 8, 2, 4
PROMPTS = [[1, 5, 6, 7, 8]]


def _specs() -> dict[str, HookSpec]:
    return {
        "embed.hook_out": HookSpec("model.embed_tokens", "out", width=D),
        "blocks.0.attn.hook_rot_q": HookSpec("model.layers.0.self_attn.rotary_emb", "out[0]", (Heads(H, DH),), D),
        "blocks.0.attn.hook_rot_k": HookSpec("model.layers.0.self_attn.rotary_emb", "out[1]", (Heads(H, DH),), D),
        "blocks.0.hook_out": HookSpec("model.layers.0", "out[0]+out[1]", width=D),
    }


def _plan(specs=None, derived=None) -> Plan:
    specs = _specs() if specs is None else specs
    derived = derived or {}
    return Plan(specs=specs, derived=derived, nonfiring=(), n_layers=1, cases=_cases(specs, derived))


def _captures(specs, values: dict[str, torch.Tensor], skip: set[str] = frozenset()):
    """A subject whose raw reads hold ``values`` (flat [T, width]) and references holding the same."""
    raw = {}
    for hook, spec in specs.items():
        if hook in skip:
            continue
        flat = values[hook].reshape(T, -1)
        raw[capture_key(0, read_key(spec.module, spec.read))] = flat
        raw[capture_key(RAGGED, read_key(spec.module, spec.read))] = flat
    subject = SubjectCapture(raw=raw, params={}, logprobs={0: torch.log_softmax(torch.ones(T, 3), -1)},
                             meta={"ragged_batches": [{"req_ids": ["0-1a2b3c4d"], "query_start_loc": [0, T]}],
                                   "ragged_request_ids": ["0"]})
    ref_vals = {h: (v.reshape(T, H, DH) if "rot_" in h else v) for h, v in values.items()}
    refs = ReferenceCapture(bridge={0: dict(ref_vals)}, compat={0: {"hook_embed": values["embed.hook_out"],
                                                                  "blocks.0.hook_resid_post": values["blocks.0.hook_out"]}},
                            logprobs={0: torch.log_softmax(torch.ones(T, 3), -1)},
                            hf={0: {"embed.hook_out": values["embed.hook_out"],
                                    "blocks.0.hook_out": values["blocks.0.hook_out"]}},
                            floors={"bridge": {}, "hf": {}}, meta={"normalization_type": "RMS"},
                            compat_processed={0: {"hook_embed": values["embed.hook_out"],
                                                     "blocks.0.hook_resid_post": values["blocks.0.hook_out"]}})
    return subject, refs


def _values(seed=0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {h: torch.randn(T, D, generator=g, dtype=torch.float64) for h in _specs()}


GATE32 = Gate("float32", "float32", "LlamaForCausalLM")


def test_one_row_per_case_in_plan_order_and_equal_values_pass():
    plan, values = _plan(), _values()
    subject, refs = _captures(plan.specs, values)
    rows, flips = evaluate(plan, subject, refs, PROMPTS, GATE32, "toy")
    assert [(r.reference, r.hook) for r in rows] == [(c.reference, c.hook) for c in plan.cases]
    assert flips == []
    assert {r.status for r in rows} == {"pass"}, [r.message for r in rows if r.status != "pass"]
    assert {r.reference for r in rows} >= {"bridge", "compat", "hf", "bridge~hf", "bridge-ragged", "compat-processed"}


def test_a_wrong_value_fails_at_its_position_with_both_values():
    plan, values = _plan(), _values()
    subject, refs = _captures(plan.specs, values)
    key = capture_key(0, read_key("model.layers.0", "out[0]+out[1]"))
    subject.raw[key] = subject.raw[key].clone()
    subject.raw[key][3] *= 1.01  # one token's residual 1 % off
    rows, _ = evaluate(plan, subject, refs, PROMPTS, GATE32, "toy")
    bad = [r for r in rows if r.status != "pass"]
    assert {(r.reference, r.hook) for r in bad} == {("bridge", "blocks.0.hook_out"), ("compat", "blocks.0.hook_out"),
                                                    ("compat-processed", "blocks.0.hook_out"), ("hf", "blocks.0.hook_out")}
    row = next(r for r in bad if r.reference == "bridge")
    assert row.status == "fail" and row.rel_err == pytest.approx(0.01, rel=1e-6)
    assert row.worst["prompt"] == 0 and row.worst["index"][0] == 3
    assert "worst at [prompt=0, pos=3" in row.message and "vLLM read: model.layers.0 out[0]+out[1]" in row.message
    assert row.margin == pytest.approx(0.01 / 1e-4, rel=1e-6)


def test_a_hook_that_never_fired_is_an_error_on_every_reference_and_its_derived_hooks_say_why():
    specs = _specs()
    derived = {"blocks.0.attn.hook_attn_scores": Derived("attn_scores", ("blocks.0.attn.hook_rot_q",
                                                                         "blocks.0.attn.hook_rot_k"), 0.5)}
    plan, values = _plan(specs, derived), _values()
    subject, refs = _captures(specs, values, skip={"blocks.0.attn.hook_rot_k"})
    refs.bridge[0]["blocks.0.attn.hook_attn_scores"] = torch.zeros(H, T, T, dtype=torch.float64)
    rows, _ = evaluate(plan, subject, refs, PROMPTS, GATE32, "toy")
    rot_k = [r for r in rows if r.hook == "blocks.0.attn.hook_rot_k"]
    assert rot_k and all(r.status == "error" for r in rot_k)
    assert all("never fired" in r.message for r in rot_k if r.reference != "bridge-ragged")
    scores = next(r for r in rows if r.hook == "blocks.0.attn.hook_attn_scores")
    assert scores.status == "error" and scores.derived
    assert "input blocks.0.attn.hook_rot_k" in scores.message and "never fired" in scores.message


def test_a_tolerance_above_the_ceiling_is_inconclusive_never_pass():
    plan, values = _plan(), _values()
    subject, refs = _captures(plan.specs, values)
    refs.floors["bridge"]["blocks.0.hook_out"] = 0.1  # bf16 x4 -> tolerance 0.4 > ceiling 0.25
    rows, _ = evaluate(plan, subject, refs, PROMPTS, Gate("bfloat16", "bfloat16", "LlamaForCausalLM"), "toy")
    row = next(r for r in rows if r.reference == "bridge" and r.hook == "blocks.0.hook_out")
    assert row.status == "inconclusive" and "ceiling" in row.message
    other = next(r for r in rows if r.reference == "bridge" and r.hook == "embed.hook_out")
    assert other.status == "pass" and other.tolerance == pytest.approx(2e-2)


def test_margin_conventions():
    assert margin(1e-6, 1e-4) == pytest.approx(1e-2)
    assert margin(0.0, 0.0) == 0.0 and margin(1.0, 0.0) == math.inf and math.isnan(margin(math.nan, 1.0))


def test_a_row_above_even_its_inflated_tolerance_fails_whatever_the_ceiling():
    plan, values = _plan(), _values()
    subject, refs = _captures(plan.specs, values)
    key = capture_key(0, read_key("model.layers.0", "out[0]+out[1]"))
    subject.raw[key] = subject.raw[key] * 2.0  # 100 % off, far above a 0.4 tolerance
    refs.floors["bridge"]["blocks.0.hook_out"] = 0.1
    rows, _ = evaluate(plan, subject, refs, PROMPTS, Gate("bfloat16", "bfloat16", "LlamaForCausalLM"), "toy")
    row = next(r for r in rows if r.reference == "bridge" and r.hook == "blocks.0.hook_out")
    assert row.tolerance > 0.25 and row.status == "fail"


def test_nan_is_an_error_naming_the_first_non_finite_hook_never_a_pass():
    plan, values = _plan(), _values()
    values["blocks.0.hook_out"][2, 5] = float("nan")  # both engines NaN at the same place, as a NaN weight makes
    subject, refs = _captures(plan.specs, values)
    rows, _ = evaluate(plan, subject, refs, PROMPTS, GATE32, "toy")
    bad = [r for r in rows if r.hook == "blocks.0.hook_out"]
    assert bad and all(r.status == "error" for r in bad), [(r.reference, r.status) for r in bad]
    row = next(r for r in bad if r.reference == "bridge")
    assert "NaN in vLLM's blocks.0.hook_out at prompt 0, [pos=2, d=5]" in row.message
    assert "first non-finite hook of vLLM in forward order: NaN in vLLM's blocks.0.hook_out" in row.message
    assert all(r.status == "pass" for r in rows if r.hook == "embed.hook_out")


def test_a_nan_floor_is_an_error():
    plan, values = _plan(), _values()
    subject, refs = _captures(plan.specs, values)
    refs.floors["bridge"]["embed.hook_out"] = float("nan")
    rows, _ = evaluate(plan, subject, refs, PROMPTS, GATE32, "toy")
    row = next(r for r in rows if r.reference == "bridge" and r.hook == "embed.hook_out")
    assert row.status == "error" and "noise-floor run holds non-finite" in row.message


def test_a_known_reference_bug_needs_its_signature_and_never_explains_an_error():
    from harness.comparison.known_issues import KNOWN_ISSUES

    issue = KNOWN_ISSUES[0]  # OPT: the bridge's scores equal its pattern
    scores, pattern = "blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern"
    from harness.values.results import HookResult

    def row(status):
        return HookResult("opt", "bridge", scores, scores, 0, "attn.hook_attn_scores", status, 1e-4, rel_err=1.0)

    same = torch.rand(H, T, T)
    refs_bug = ReferenceCapture(bridge={0: {scores: same, pattern: same.clone()}}, compat={}, logprobs={})
    refs_ok = ReferenceCapture(bridge={0: {scores: same * 3, pattern: same}}, compat={}, logprobs={})
    gate = Gate("float32", "float32", issue.architecture)
    r = row("fail")
    gate.finalize(r, refs_bug)
    assert r.known_issue == issue.reason
    r = row("fail")
    gate.finalize(r, refs_ok)  # a name match alone explains nothing
    assert r.known_issue is None
    r = row("error")
    gate.finalize(r, refs_bug)
    assert r.known_issue is None


def _bf16_gate_case(scale_bug: float = 1.0, chaos: bool = True):
    """A hook whose reference has a few chaotic rows in bf16 (worst-row floor 0.3, above the
    ceiling once multiplied) while its typical row sits at 1e-2, as measured on SmolLM2 bf16."""
    plan, values = _plan(), _values()
    subject, refs = _captures(plan.specs, values)
    key = capture_key(0, read_key("model.layers.0", "out[0]+out[1]"))
    noisy = subject.raw[key].clone()
    g = torch.Generator().manual_seed(1)
    noisy += 5e-3 * noisy.norm(dim=-1, keepdim=True) / D ** 0.5 * torch.randn(noisy.shape, generator=g,
                                                                              dtype=noisy.dtype)
    if chaos:
        noisy[4] += 0.3 * noisy[4].norm() / D ** 0.5  # one chaotic token
    subject.raw[key] = noisy * scale_bug
    refs.floors["bridge"]["blocks.0.hook_out"] = 0.3
    refs.floor_stats = {"median": {"bridge": {"blocks.0.hook_out": 1e-2}}, "scale": {"bridge": {"blocks.0.hook_out": 1e-4}}}
    rows, _ = evaluate(plan, subject, refs, PROMPTS, Gate("bfloat16", "bfloat16", "LlamaForCausalLM"), "toy")
    return next(r for r in rows if r.reference == "bridge" and r.hook == "blocks.0.hook_out")


def test_a_few_chaotic_rows_do_not_ungate_a_hook_the_median_row_gates():
    row = _bf16_gate_case()
    assert row.tolerance > 0.25 and row.tolerance_median == pytest.approx(0.04)
    assert row.status == "pass" and "gated by the median row" in row.message


def test_a_three_percent_scale_bug_fails_on_the_scale_statistic_where_the_worst_row_cannot_gate():
    row = _bf16_gate_case(scale_bug=1.03)
    assert row.status == "fail" and row.tolerance > 0.25
    assert "a scale error" in row.message and row.scale_median == pytest.approx(0.03, abs=5e-3)


def test_derived_scores_with_masks_on_both_sides_pass_and_are_not_taken_for_nan():
    """Masked entries are set to NaN on purpose (ignored by the comparison): the non-finite check
    looks at the captures before that, and -inf is a legitimate mask in attention scores."""
    from harness.comparison.derived import derive

    specs = _specs()
    d = Derived("attn_scores", ("blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"), 0.5)
    derived = {"blocks.0.attn.hook_attn_scores": d}
    plan, values = _plan(specs, derived), _values()
    subject, refs = _captures(specs, values)
    inputs = {h: values[h].reshape(T, H, DH) for h in d.inputs}
    scores = derive(d, inputs)
    assert torch.isinf(scores).any()  # causal mask
    refs.bridge[0]["blocks.0.attn.hook_attn_scores"] = torch.where(torch.isinf(scores),
                                                                  torch.finfo(scores.dtype).min, scores)
    rows, _ = evaluate(plan, subject, refs, PROMPTS, GATE32, "toy")
    row = next(r for r in rows if r.hook == "blocks.0.attn.hook_attn_scores")
    assert row.status == "pass", row.message


def test_log_prob_rows_vllm_returned_for_no_request_are_left_out_and_named():
    """vLLM 0.20.2's V2 runner returns no sampled-token log-probs: that row is NaN on vLLM's side.
    Declared missing by the subject, it is left out of both logit rows, and both rows say so; not
    declared, it stays a non-finite error (never a silent pass)."""
    plan, values = _plan(), _values()
    subject, refs = _captures(plan.specs, values)
    subject.logprobs[0] = subject.logprobs[0].clone()
    subject.logprobs[0][T - 1] = float("nan")
    rows, _ = evaluate(plan, subject, refs, PROMPTS, GATE32, "toy")
    assert {r.hook: r.status for r in rows if r.hook in ("logprobs", "argmax")} == {"logprobs": "error", "argmax": "error"}
    subject.meta["logprob_rows_missing"] = {0: [T - 1]}
    rows, _ = evaluate(plan, subject, refs, PROMPTS, GATE32, "toy")
    logit = [r for r in rows if r.hook in ("logprobs", "argmax")]
    assert [r.status for r in logit] == ["pass", "pass"]
    assert all(f"not compared: prompt 0 pos [{T - 1}]" in r.message for r in logit)


GATE16 = Gate("bfloat16", "bfloat16", "LlamaForCausalLM")


def test_processed_compatibility_mode_is_gated_by_its_own_floor_not_the_bridge_s():
    """Processed weights are folded, then rounded to the run dtype: a rounding vLLM does not share, so
    the compat-processed row's tolerance comes from processed mode's own floor where it is larger
    (harness.references.reference; measured on SmolLM2 bf16, AVX2: docs/numerics.md)."""
    plan, values = _plan(), _values()
    subject, refs = _captures(plan.specs, values)
    key = capture_key(0, read_key("model.layers.0", "out[0]+out[1]"))
    subject.raw[key] = subject.raw[key] + 0.08 * subject.raw[key].norm(dim=-1, keepdim=True) / D ** 0.5 \
        * torch.randn(T, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    refs.floors = {"bridge": {"blocks.0.hook_out": 0.01}, "compat": {"blocks.0.hook_resid_post": 0.01}, "hf": {}}
    before = {r.reference: r for r in evaluate(plan, subject, refs, PROMPTS, GATE16, "toy")[0]
              if r.hook == "blocks.0.hook_out"}
    assert before["compat-processed"].tolerance == pytest.approx(0.04)
    assert before["compat-processed"].status == "fail"
    refs.floors["processed"] = {"blocks.0.hook_resid_post": 0.05}
    after = {r.reference: r for r in evaluate(plan, subject, refs, PROMPTS, GATE16, "toy")[0]
             if r.hook == "blocks.0.hook_out"}
    assert after["compat-processed"].tolerance == pytest.approx(0.2)
    assert after["compat-processed"].status == "pass", after["compat-processed"].message
    assert after["bridge"].tolerance == pytest.approx(0.04) and after["bridge"].status == "fail"  # unchanged


def _norm_plan():
    specs = {"blocks.0.ln1.hook_normalized": HookSpec("model.layers.0.input_layernorm", "out",
                                                      (UnfoldNorm("model.layers.0.input_layernorm.weight", 1.0),), D)}
    return Plan(specs=specs, derived={}, nonfiring=(), n_layers=1,
                cases=[c for c in _cases(specs, {}) if c.reference == "bridge" or c.hook in ("logprobs", "argmax")])


def _norm_captures(raw_row_3: float | None = None):
    g = torch.Generator().manual_seed(3)
    x_hat = torch.randn(T, D, generator=g, dtype=torch.float64)
    w = torch.randn(D, generator=g, dtype=torch.float64)
    w[3] = -1.0  # 1 + w = 0, as in a trained Gemma-3
    raw = x_hat * (1 + w)
    if raw_row_3 is not None:
        raw[:, 3] = raw_row_3
    key = capture_key(0, read_key("model.layers.0.input_layernorm", "out"))
    lp = {0: torch.log_softmax(torch.ones(T, 3), -1)}
    subject = SubjectCapture(raw={key: raw}, params={"model.layers.0.input_layernorm.weight": w}, logprobs=lp, meta={})
    refs = ReferenceCapture(bridge={0: {"blocks.0.ln1.hook_normalized": x_hat}}, compat={}, logprobs=lp,
                            floors={"bridge": {}}, meta={})
    return subject, refs


def test_a_norm_weight_whose_divisor_is_zero_leaves_that_dim_out_and_says_so():
    subject, refs = _norm_captures()
    row = next(r for r in evaluate(_norm_plan(), subject, refs, PROMPTS, GATE32, "toy")[0] if r.kind != "logprobs"
               and r.hook.endswith("hook_normalized"))
    assert row.status == "pass", row.message
    assert "1 of 8 dims left out" in row.message and "weight + 1 = 0" in row.message and "dims [3]" in row.message


def test_a_non_finite_value_made_by_the_conversion_is_blamed_on_the_conversion_not_vllm():
    subject, refs = _norm_captures(raw_row_3=0.25)  # vLLM's own read is finite, the division makes inf
    row = next(r for r in evaluate(_norm_plan(), subject, refs, PROMPTS, GATE32, "toy")[0]
               if r.hook.endswith("hook_normalized"))
    assert row.status == "error"
    assert "NaN in vLLM's" not in row.message and "inf in vLLM's" not in row.message
    assert "vLLM's own read (model.layers.0.input_layernorm out) is finite" in row.message, row.message
    assert "the harness's conversion" in row.message and "where vLLM's value is not 0" in row.message
