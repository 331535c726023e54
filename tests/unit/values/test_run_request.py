"""harness.values.engine_request: a run's engine request is built from the target, the variant, the plan and
the prompts -- each subject gets its own group of fields from its plan -- and the refusal probe's is the run's
boot with what the probe changes."""
from __future__ import annotations

from harness.engines.engine_request import EngineRequest
from harness.engines.subject_hidden_states import raw_module
from harness.logprob_request import logprob_k
from harness.models.families import FAMILIES
from harness.models.targets import target_for_family
from harness.pipeline.refusals import probe_request
from harness.values.engine_request import boot_request, run_request
from harness.values.plan import build_plan
from harness.values.variant import Variant

PROMPTS = [[1, 5, 17, 42], [7, 8, 9]]


def _target(family):
    return target_for_family(FAMILIES[family])


def test_the_default_subject_gets_the_plans_reads_params_and_token_dims():
    target, variant = _target("qwen3"), Variant.make("bfloat16", "cpu", serving="chunked")
    plan = build_plan(target, variant)
    request = run_request(target, variant, plan, PROMPTS)
    specs = plan.specs.values()
    assert request.reads == tuple(sorted({(s.module, s.read) for s in specs}))
    assert request.params == tuple(sorted({p for s in specs for p in s.params()}))
    assert dict(request.row_dims) == {s.raw_key: s.raw_token_dim for s in specs if s.raw_token_dim}
    assert (request.checkpoint, request.dtype, request.prompts) == (str(target.checkpoint), "bfloat16",
                                                                     ((1, 5, 17, 42), (7, 8, 9)))
    assert (request.vocab_size, request.max_model_len) == (target.vocab_size, target.max_model_len)
    assert (request.serving, request.device, request.enforce_eager, request.tp, request.executor) == (
        "chunked", "cpu", True, 1, "mp")
    assert request.full_logprobs == (logprob_k(target.vocab_size) is None) and request.ragged
    assert request.pooling is None and request.subject_args is None
    assert request.out_dir == ""  # each launch sets its own
    assert EngineRequest.from_json(request.to_json()) == request


def test_a_serving_run_is_told_which_reads_fold_heads_into_their_rows():
    # qwen3_next's two gated-delta-net norm inputs: vLLM 0.20.2 CUDA passes them [T x v_heads, d_v]
    # (HookSpec.flat_rows); the serving stitcher must cut their rows in units of the heads (harness.engines.stitch)
    target, variant = _target("qwen3_next"), Variant.make("bfloat16", "cpu", serving="decode")
    plan = build_plan(target, variant)
    request = run_request(target, variant, plan, PROMPTS)
    folded = {s.raw_key: s.flat_rows for s in plan.specs.values() if s.flat_rows}
    v_heads = target.hf_config.linear_num_value_heads
    assert dict(request.flat_rows) == folded and set(folded.values()) == {v_heads}
    assert {h.split(".", 2)[-1] for h, s in plan.specs.items() if s.flat_rows} == {
        "linear_attn.hook_recurrence_out", "linear_attn.hook_gate_input"}
    assert EngineRequest.from_json(request.to_json()) == request
    assert not run_request(_target("qwen3"), variant, build_plan(_target("qwen3"), variant), PROMPTS).flat_rows


def test_tl_vllm_gets_its_hooks_and_raw_keys_only():
    target, variant = _target("llama"), Variant.make("float32", "cpu", subject="tl-vllm")
    plan = build_plan(target, variant)
    request = run_request(target, variant, plan, PROMPTS)
    hooks = request.subject_args.hooks
    assert dict(hooks) == {hook: spec.raw_key for hook, spec in plan.specs.items()} and hooks
    assert not request.reads and not request.params


def test_the_hidden_state_export_gets_every_layer_id_and_the_width():
    target, variant = _target("llama"), Variant.make("float32", "cpu", subject="vllm-hidden-states")
    plan = build_plan(target, variant)
    request = run_request(target, variant, plan, PROMPTS)
    n_layers = target.hf_config.num_hidden_layers
    export = request.subject_args
    assert export.layer_ids == tuple(range(n_layers + 1))
    assert export.hidden_size == target.hf_config.hidden_size
    assert export.connector is None  # the device's, chosen in the engine
    assert {s.module for s in plan.specs.values()} == {raw_module(k) for k in range(n_layers + 1)}
    assert not request.reads


def test_an_encoder_gets_its_pooling_task_and_token_types():
    target, variant = _target("bert"), Variant.make("float32", "cpu")
    request = run_request(target, variant, build_plan(target, variant), [[4, 5, 6, 7]])
    assert request.pooling.task == "token_classify" and request.pooling.token_types == ((0, 0, 1, 1),)


def test_the_refusal_probe_is_the_runs_boot_with_a_two_token_prompt_and_nothing_recorded():
    target, variant = _target("deepseek_v3"), Variant.make("float32", "cpu", serving="decode")
    probe, boot = probe_request(target, variant), boot_request(target, variant)
    assert probe.prompts == ((1, 2),) and not probe.reads and not probe.params
    assert (probe.full_logprobs, probe.ragged, probe.enforce_eager, probe.serving, probe.executor) == (
        False, False, True, "single", "mp")
    assert probe.llm_overrides == boot.llm_overrides and probe.llm_overrides  # the MLA backend, as the run's
    assert (probe.checkpoint, probe.dtype, probe.device, probe.tp) == (boot.checkpoint, "float32", "cpu", 1)
