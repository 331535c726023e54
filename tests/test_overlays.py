"""Overlays are data: check the registry and every family's specs without booting an engine."""
import pytest

from harness.families import FAMILIES
from harness.hook_names import compat_alias
from overlays import OVERLAYS, NoOverlayError, get_overlay
from overlays.base import READ_GRAMMAR, Mul, UnfoldNorm, expand_layers, hook_kind, layer_of


def test_unknown_architecture_names_known_ones():
    with pytest.raises(NoOverlayError, match="LlamaForCausalLM"):
        get_overlay("NoSuchForCausalLM")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_has_a_registered_overlay_with_valid_specs(family):
    from harness.targets import target_for_family

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
    from harness.targets import target_for_family

    t = target_for_family(FAMILIES["qwen3"])
    cap = t.overlay.capture_specs(t.hf_config)
    assert cap["blocks.0.hook_out"] == ("model.layers.0", 128)
    assert isinstance(t.overlay.nonfiring_hooks(), list)


def test_gemma_declares_embedding_scale_and_offset_norms():
    from harness.targets import target_for_family

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
