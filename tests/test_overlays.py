"""Overlays are data: check the registry and every family's specs without booting an engine."""
import pytest

from harness.models.families import FAMILIES
from harness.vocab.hook_names import compat_alias
from overlays import OVERLAYS, NoOverlayError, get_overlay
from overlays.base import READ_GRAMMAR, Mul, UnfoldNorm, expand_layers, hook_kind, layer_of


def test_unknown_architecture_names_known_ones():
    with pytest.raises(NoOverlayError, match="LlamaForCausalLM"):
        get_overlay("NoSuchForCausalLM")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_has_a_registered_overlay_with_valid_specs(family):
    from harness.models.targets import target_for_family

    target = target_for_family(FAMILIES[family])
    assert target.architecture in OVERLAYS
    specs = target.overlay.hook_specs(target.hf_config)
    n_layers = target.hf_config.num_hidden_layers
    assert "embed.hook_out" in specs and "ln_final.hook_normalized" in specs
    for i in range(n_layers):
        assert f"blocks.{i}.hook_out" in specs, f"{family}: layer {i} not covered"
    for hook, spec in specs.items():
        assert READ_GRAMMAR.match(spec.read), (hook, spec.read)
        assert spec.module, hook
    nonfiring = {h for nf in target.overlay.nonfiring() for h in expand_layers(nf.template, n_layers)}
    assert not nonfiring & set(specs), "a hook cannot be both offered and non-firing"
    assert all(nf.reason for nf in target.overlay.nonfiring())


def test_seed_contract_is_derived():
    from harness.models.targets import target_for_family

    t = target_for_family(FAMILIES["qwen3"])
    cap = t.overlay.capture_specs(t.hf_config)
    assert cap["blocks.0.hook_out"] == ("model.layers.0", 128)
    assert isinstance(t.overlay.nonfiring_hooks(), list)


def test_gemma_declares_embedding_scale_and_offset_norms():
    from harness.models.targets import target_for_family

    t = target_for_family(FAMILIES["gemma"])
    specs = t.overlay.hook_specs(t.hf_config)
    (mul,) = specs["embed.hook_out"].convert
    assert isinstance(mul, Mul) and mul.factor == pytest.approx(128 ** 0.5)
    (unfold,) = specs["ln_final.hook_normalized"].convert
    assert isinstance(unfold, UnfoldNorm) and unfold.offset == 1.0


def test_hook_name_helpers():
    assert layer_of("blocks.12.attn.hook_q") == 12 and layer_of("embed.hook_out") is None
    assert hook_kind("blocks.3.mlp.hook_out") == "mlp.hook_out"
    assert compat_alias("blocks.2.hook_out") == "blocks.2.hook_resid_post"
    assert compat_alias("blocks.2.ln1.hook_normalized") is None


# -- one overlay per vLLM implementation (native model vs Transformers backend) -----------------------
_VARIANT_FAMILIES = {"gpt_neox": "gpt_neox", "olmo2": "model", "starcoder2": "model"}


@pytest.mark.parametrize("family", sorted(_VARIANT_FAMILIES))
def test_native_and_transformers_backend_variants_differ_where_the_trees_do(family):
    from harness.models.targets import target_for_family
    from overlays import VARIANTS
    from overlays.base import DropBatch

    t = target_for_family(FAMILIES[family])
    native, hf = VARIANTS[t.architecture]["native"], VARIANTS[t.architecture]["transformers"]
    ns, hs = native.hook_specs(t.hf_config), hf.hook_specs(t.hf_config)
    # native vLLM models see [T, d]; the Transformers backend runs HF modules on [1, T, d]
    assert not any(isinstance(c, DropBatch) for s in ns.values() for c in s.convert)
    assert all(isinstance(s.convert[0], DropBatch) for h, s in hs.items() if h != "unembed.hook_out")
    assert ns["embed.hook_out"].module.startswith(_VARIANT_FAMILIES[family] + ".")
    # the native rotary embedding is a module: rotated q/k captured, scores / pattern derived from them
    assert ns["blocks.0.attn.hook_rot_q"].module.endswith("self_attn.rotary_emb" if family != "gpt_neox"
                                                          else "attention.rotary_emb")
    assert "blocks.0.attn.hook_pattern" in native.derived_specs(t.hf_config)
    assert "blocks.0.attn.hook_rot_q" not in hs and not hf.derived_specs(t.hf_config)
    # the Transformers-backend variant says why its scores / pattern are missing; the native one needs not
    n_layers = t.hf_config.num_hidden_layers
    hf_nonfiring = {h for nf in hf.nonfiring_for(t.hf_config) for h in expand_layers(nf.template, n_layers)}
    assert "blocks.0.attn.hook_pattern" in hf_nonfiring
    assert not {h for nf in native.nonfiring_for(t.hf_config) for h in expand_layers(nf.template, n_layers)} & {
        "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_rot_q"}


def test_gpt_neox_qkv_layouts():
    """Native: the loader permutes rows to [q | k | v]; HF backend: per-head [q_h | k_h | v_h]."""
    from harness.models.targets import target_for_family
    from overlays import VARIANTS
    from overlays.base import Cols, Heads

    t = target_for_family(FAMILIES["gpt_neox"])
    d = t.hf_config.hidden_size
    hd = d // t.hf_config.num_attention_heads
    native = VARIANTS["GPTNeoXForCausalLM"]["native"].hook_specs(t.hf_config)["blocks.0.attn.hook_k"].convert
    hf = VARIANTS["GPTNeoXForCausalLM"]["transformers"].hook_specs(t.hf_config)["blocks.0.attn.hook_k"].convert
    assert native[0] == Cols(d, 2 * d) and isinstance(native[1], Heads)
    assert isinstance(hf[1], Heads) and hf[1].head_dim == 3 * hd and hf[2] == Cols(hd, 2 * hd)


def test_gpt_neox_native_rotated_qk_feed_derived_hooks_but_make_no_rows():
    """TransformerBridge has no hook_rot_q for GPT-NeoX: the native capture is a derived hook's input only."""
    from harness.pipeline.runner import planned_cases
    from harness.models.targets import target_for_family
    from overlays import VARIANTS

    t = target_for_family(FAMILIES["gpt_neox"])
    ov = VARIANTS["GPTNeoXForCausalLM"]["native"]
    specs, derived = ov.hook_specs(t.hf_config), ov.derived_specs(t.hf_config)
    cased = {h for _, h in planned_cases(specs, derived)}
    assert "blocks.0.attn.hook_rot_q" in specs and "blocks.0.attn.hook_rot_q" not in cased
    assert "blocks.0.attn.hook_attn_scores" in cased


def test_get_overlay_follows_the_implementation():
    from overlays import VARIANTS

    for arch, variants in VARIANTS.items():
        assert get_overlay(arch, "native") is variants["native"]
        assert get_overlay(arch, "transformers") is variants["transformers"]


def test_cuda_graph_nonfiring_hooks_leave_the_plan_only_under_cuda_graphs():
    """Qwen3-MoE's router runs inside vLLM 0.20's fused-MoE op: offered in eager mode, declared
    non-firing (with the reason) when vLLM runs compiled with CUDA graphs."""
    from harness.pipeline.runner import subject_plan
    from harness.models.targets import target_for_family

    t = target_for_family(FAMILIES["qwen3_moe"])
    eager, _, nf_eager = subject_plan(t)
    graphs, _, nf_graphs = subject_plan(t, cuda_graphs=True)
    assert "blocks.0.mlp.gate.hook_out" in eager and "blocks.0.mlp.gate.hook_out" not in graphs
    added = [nf for nf in nf_graphs if nf not in nf_eager]
    assert [nf.template for nf in added] == ["blocks.{i}.mlp.gate.hook_out"] and "moe_forward" in added[0].reason
    m = target_for_family(FAMILIES["mixtral"])  # Mixtral calls its router in the traced forward
    assert subject_plan(m, cuda_graphs=True)[0].keys() == subject_plan(m)[0].keys()
