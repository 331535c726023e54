"""The Mamba-2 overlay (overlays/mamba2.py), engine-free: its specs, widths and column split, its
non-firing hooks and their reasons, the plan's rows, and the HF reference's mixer hooks it is
compared with (harness/references/reference.py), on the family's own checkpoint."""
import pytest
import torch

from harness.models.families import FAMILIES
from overlays import get_overlay, norm_weight_offset
from overlays.base import Cols, UnfoldNorm, expand_layers
from overlays.mamba2 import Mamba2Overlay, ssm_sizes


@pytest.fixture(scope="module")
def target():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["mamba2"])


@pytest.fixture(scope="module")
def specs(target):
    return target.overlay.hook_specs(target.hf_config)


PER_LAYER = ("hook_in", "norm.hook_normalized", "mixer.hook_in", "mixer.in_proj.hook_out", "mixer.in_proj.hook_xBC",
             "mixer.in_proj.hook_dt", "mixer.inner_norm.hook_in", "mixer.inner_norm.hook_gate",
             "mixer.inner_norm.hook_out", "mixer.hook_out", "hook_out")


def test_registered_as_its_own_overlay_with_plain_rms_norms(target):
    assert isinstance(get_overlay("Mamba2ForCausalLM"), Mamba2Overlay) and target.architecture == "Mamba2ForCausalLM"
    assert norm_weight_offset("Mamba2ForCausalLM") == 0.0 == FAMILIES["mamba2"].norm_weight_offset


def test_hooks_in_forward_order_on_vllms_tree(specs, target):
    n = target.hf_config.num_hidden_layers
    assert list(specs) == (["embed.hook_out"] + [f"blocks.{i}.{k}" for i in range(n) for k in PER_LAYER]
                           + ["ln_final.hook_normalized", "unembed.hook_out"])
    s = specs["blocks.1.hook_out"]
    assert (s.module, s.read) == ("backbone.layers.1", "out[0]+out[1]")
    assert specs["blocks.0.hook_in"].read == "in.hidden_states+in.residual"
    assert specs["blocks.2.norm.hook_normalized"].convert == (UnfoldNorm("backbone.layers.2.norm.weight"),)
    assert specs["ln_final.hook_normalized"].convert == (UnfoldNorm("backbone.norm_f.weight"),)
    # the gated norm is a CustomOp with forward(*args): positional reads only
    assert [specs[f"blocks.0.mixer.inner_norm.{k}"].read for k in ("hook_in", "hook_gate", "hook_out")] == \
        ["in[0]", "in[1]", "out"]
    assert {specs[f"blocks.0.mixer.{k}"].module for k in ("inner_norm.hook_in", "inner_norm.hook_gate")} == \
        {"backbone.layers.0.mixer.norm"}
    assert specs["unembed.hook_out"].calls == "all"


def test_widths_and_the_in_proj_split_cover_every_column(specs, target):
    cfg = target.hf_config
    inner, conv_dim, heads = ssm_sizes(cfg)
    assert (inner, conv_dim, heads) == (256, 256 + 2 * 16, 8)
    whole = specs["blocks.0.mixer.in_proj.hook_out"]
    assert whole.width == 2 * inner + 2 * cfg.n_groups * cfg.state_size + heads == 552 and whole.convert == ()
    (xbc,), (dt,) = specs["blocks.0.mixer.in_proj.hook_xBC"].convert, specs["blocks.0.mixer.in_proj.hook_dt"].convert
    # z = [0, I) (read at the gated norm), xBC, dt: adjacent, in order, ending at the last column
    assert (xbc, dt) == (Cols(inner, inner + conv_dim), Cols(inner + conv_dim, whole.width))
    assert specs["blocks.0.mixer.inner_norm.hook_gate"].width == inner == specs["blocks.0.mixer.inner_norm.hook_in"].width
    assert specs["blocks.0.mixer.hook_out"].width == cfg.hidden_size


def test_nonfiring_hooks_carry_reasons_and_none_is_offered(specs, target):
    n = target.hf_config.num_hidden_layers
    nonfiring = {h: nf.reason for nf in target.overlay.nonfiring() for h in expand_layers(nf.template, n)}
    assert not set(nonfiring) & set(specs)
    assert "mamba_mixer2" in nonfiring["blocks.1.mixer.hook_ssm_state"]
    assert "conv1d" in nonfiring["blocks.0.mixer.conv1d.hook_out"]
    assert all("attention-free" in nonfiring[f"blocks.2.attn.{k}"] for k in ("hook_q", "hook_pattern"))
    assert all(r for r in nonfiring.values())
    assert target.overlay.derived_specs(target.hf_config) == {}


def test_plan_rows_split_columns_against_hf_only(target):
    from harness.values.plan import build_plan
    from harness.values.variant import Variant

    plan = build_plan(target, Variant.make("float32", "cpu"))
    by_hook: dict[str, set[str]] = {}
    for c in plan.cases:
        by_hook.setdefault(c.hook, set()).add(c.reference)
    # TL has no hook for the xBC / dt columns: HF's forward hooks alone (no bridge, bridge~hf or ragged row)
    assert by_hook["blocks.1.mixer.in_proj.hook_dt"] == {"hf"} == by_hook["blocks.1.mixer.in_proj.hook_xBC"]
    assert by_hook["blocks.1.mixer.inner_norm.hook_gate"] == {"bridge", "hf", "bridge~hf", "bridge-ragged"}
    assert {"compat", "compat-processed"} <= by_hook["blocks.1.hook_out"]
    assert not any(c.derived for c in plan.cases)


def test_hf_reference_mixer_hooks_match_the_overlays_split(target, specs):
    """HF's own mixer (the family checkpoint): its in_proj output holds the gate at columns [0, I) -- the
    z the gated norm receives -- and the reference's xBC / dt captures are the overlay's Cols of it."""
    from transformers import AutoModelForCausalLM

    from harness.comparison.conversions import convert
    from harness.references.reference import _hf_run

    model = AutoModelForCausalLM.from_pretrained(str(target.checkpoint), dtype=torch.float32).eval()
    caps, logprobs = _hf_run(model, list(range(5, 21)), "cpu", target.hf_config.num_hidden_layers)
    inner = ssm_sizes(target.hf_config)[0]
    for i in range(target.hf_config.num_hidden_layers):
        b = f"blocks.{i}.mixer"
        whole = caps[f"{b}.in_proj.hook_out"]
        assert whole.shape == (16, specs[f"{b}.in_proj.hook_out"].width)
        assert torch.equal(caps[f"{b}.inner_norm.hook_gate"], whole[:, :inner])
        for k in ("hook_xBC", "hook_dt"):
            assert torch.equal(caps[f"{b}.in_proj.{k}"], convert(specs[f"{b}.in_proj.{k}"], whole, {}))
        # the block is residual + mixer output (fp32 run: exact up to the add)
        torch.testing.assert_close(caps[f"blocks.{i}.hook_out"], caps[f"blocks.{i}.hook_in"] + caps[f"{b}.hook_out"])
        assert caps[f"{b}.inner_norm.hook_in"].shape == (16, inner)
    assert logprobs.shape == (16, target.vocab_size)


def test_reference_mixer_hooks_skip_layers_without_a_mixer():
    from harness.references.reference import _ssm_mixer_hooks

    layer = torch.nn.Module()
    layer.mixer = torch.nn.Linear(2, 2)  # a "mixer" that is no Mamba-2 mixer: nothing hooked
    assert _ssm_mixer_hooks(layer, 0, {}) == [] == _ssm_mixer_hooks(torch.nn.Linear(2, 2), 0, {})
