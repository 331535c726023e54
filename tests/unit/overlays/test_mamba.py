"""The Mamba-1 overlay (overlays/mamba.py), engine-free: vLLM runs Mamba-1 on CUDA only, so on CPU these
are its checks: the specs on vLLM 0.20.2's tree in forward order, widths from the config, non-firing
hooks with reasons, the plan's rows, and -- on the family's own checkpoint -- that HF's forward hooks
(harness/references/reference.py) and TransformerBridge hold the same tensor for every hook offered."""
import pytest
import torch

from harness.models.families import FAMILIES
from overlays import get_overlay, norm_weight_offset
from overlays.base import UnfoldNorm, expand_layers
from overlays.mamba import MambaOverlay

PER_LAYER = ("hook_in", "norm.hook_normalized", "mixer.hook_in", "mixer.in_proj.hook_out", "mixer.x_proj.hook_in",
             "mixer.x_proj.hook_out", "mixer.out_proj.hook_in", "mixer.hook_out", "hook_out")


@pytest.fixture(scope="module")
def target():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["mamba"])


@pytest.fixture(scope="module")
def specs(target):
    return target.overlay.hook_specs(target.hf_config)


def test_registered_as_its_own_overlay_with_plain_rms_norms(target):
    assert isinstance(get_overlay("MambaForCausalLM"), MambaOverlay) and target.architecture == "MambaForCausalLM"
    assert norm_weight_offset("MambaForCausalLM") == 0.0


def test_hooks_in_forward_order_on_vllms_tree(specs, target):
    n = target.hf_config.num_hidden_layers
    assert list(specs) == (["embed.hook_out"] + [f"blocks.{i}.{k}" for i in range(n) for k in PER_LAYER]
                           + ["ln_final.hook_normalized", "unembed.hook_out"])
    assert (specs["blocks.1.hook_out"].module, specs["blocks.1.hook_out"].read) == ("backbone.layers.1", "out[0]+out[1]")
    assert specs["blocks.0.norm.hook_normalized"].convert == (UnfoldNorm("backbone.layers.0.norm.weight"),)
    # the mixer returns None (it fills `output` in place): its output is out_proj's
    out = specs["blocks.0.mixer.hook_out"]
    assert (out.module, out.read) == ("backbone.layers.0.mixer.out_proj", "out[0]")
    assert specs["blocks.0.mixer.hook_in"].read == "in.hidden_states"
    assert specs["unembed.hook_out"].calls == "all"


def test_widths_follow_the_config(specs, target):
    cfg = target.hf_config
    inner, rank = cfg.intermediate_size, cfg.time_step_rank
    assert (inner, rank) == (2 * cfg.hidden_size, -(-cfg.hidden_size // 16))
    assert specs["blocks.0.mixer.in_proj.hook_out"].width == 2 * inner
    assert specs["blocks.0.mixer.x_proj.hook_in"].width == inner == specs["blocks.0.mixer.out_proj.hook_in"].width
    assert specs["blocks.0.mixer.x_proj.hook_out"].width == rank + 2 * cfg.state_size
    assert specs["blocks.0.mixer.hook_out"].width == cfg.hidden_size


def test_nonfiring_hooks_carry_reasons_and_none_is_offered(specs, target):
    n = target.hf_config.num_hidden_layers
    nonfiring = {h: nf.reason for nf in target.overlay.nonfiring() for h in expand_layers(nf.template, n)}
    assert not set(nonfiring) & set(specs)
    assert "conv1d" in nonfiring["blocks.0.mixer.conv1d.hook_out"]
    assert "dt_proj.weight" in nonfiring["blocks.1.mixer.dt_proj.hook_out"]
    assert "mamba_mixer" in nonfiring["blocks.1.mixer.hook_ssm_state"]
    assert all(r for r in nonfiring.values())
    assert target.overlay.derived_specs(target.hf_config) == {}


def test_plan_compares_the_mixer_with_both_references(target):
    from harness.values.plan import build_plan
    from harness.values.variant import Variant

    plan = build_plan(target, Variant.make("float32", "cpu"))
    by_hook: dict[str, set[str]] = {}
    for c in plan.cases:
        by_hook.setdefault(c.hook, set()).add(c.reference)
    assert {"bridge", "hf"} <= by_hook["blocks.1.mixer.x_proj.hook_in"]
    assert {"bridge", "hf"} <= by_hook["blocks.0.mixer.out_proj.hook_in"]
    assert not any(c.derived for c in plan.cases)


def test_hf_hooks_and_the_bridge_hold_the_same_tensors(target, specs):
    """Every offered hook that both references hold: equal (fp32, the same HF forward underneath)."""
    from harness.references.reference import _boot_bridge, _hf_run, _load_hf

    tokens = list(range(5, 21))
    caps, _ = _hf_run(_load_hf(target.checkpoint, torch.float32, "cpu"), tokens, "cpu",
                      target.hf_config.num_hidden_layers)
    _, cache = _boot_bridge(target.checkpoint, torch.float32, "cpu").run_with_cache(torch.tensor([tokens]))
    mixer = [n for n in specs if ".mixer." in n]
    assert len(mixer) == 6 * target.hf_config.num_hidden_layers
    for name in mixer:
        hf, bridge = caps[specs[name].reference_name("hf", name)], cache[specs[name].reference_name("bridge", name)][0]
        assert hf.shape == (len(tokens), specs[name].width), name
        torch.testing.assert_close(hf, bridge, rtol=0, atol=0, msg=name)


def test_reference_mixer_hooks_skip_layers_without_a_mamba1_mixer():
    from harness.references.reference import _mamba1_mixer_hooks

    layer = torch.nn.Module()
    layer.mixer = torch.nn.Linear(2, 2)
    assert _mamba1_mixer_hooks(layer, 0, {}) == [] == _mamba1_mixer_hooks(torch.nn.Linear(2, 2), 0, {})
