"""The hybrids group (overlays/granitemoehybrid.py, Tree.ssm_mixer / Tree.hook_names in overlays/tree.py, the
bamba refusal), engine-free: per-layer mixer kinds from layer_types, Mamba-2's reads on the Mamba layers, TL's
names of the dense MLP, the non-firing hooks per layer, the gated-norm reference bug's entry and correction, and
the HF reference's mixer hooks on HF's ``mamba`` attribute."""
import pytest
import torch

from harness.comparison.known_issues import gated_norm_bug
from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.base import Cols, Mul
from overlays.granitemoehybrid import GRANITEMOEHYBRID, GraniteMoeHybridOverlay
from overlays.tree import SsmMixer

ARCH = "GraniteMoeHybridForCausalLM"


@pytest.fixture(scope="module")
def target():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["granitemoehybrid"])


@pytest.fixture(scope="module")
def specs(target):
    return target.overlay.hook_specs(target.hf_config)


def test_registered_and_the_row_exercises_what_released_configs_do(target):
    assert isinstance(get_overlay(ARCH), GraniteMoeHybridOverlay) and target.architecture == ARCH
    cfg = target.hf_config
    assert list(cfg.layer_types) == ["linear_attention", "full_attention", "linear_attention"]
    assert cfg.mamba_n_groups == 2 and cfg.num_local_experts == 0 and cfg.position_embedding_type == "nope"
    assert cfg.residual_multiplier != 1 and cfg.embedding_multiplier != 1 and cfg.logits_scaling != 1


def test_mamba_layers_run_mamba2s_reads_and_attention_layers_attention(specs, target):
    inner, conv_dim, heads = SsmMixer().sizes(target.hf_config)
    assert (inner, conv_dim, heads) == (256, 256 + 2 * 2 * 16, 8)
    for i in (0, 2):
        assert f"blocks.{i}.attn.hook_q" not in specs and f"blocks.{i}.hook_attn_out" not in specs
        assert specs[f"blocks.{i}.mixer.hook_in"].module == f"model.layers.{i}.mamba"
        assert specs[f"blocks.{i}.mixer.in_proj.hook_dt"].convert == (Cols(inner + conv_dim, inner + conv_dim + heads),)
        assert specs[f"blocks.{i}.mixer.inner_norm.hook_out"].module == f"model.layers.{i}.mamba.norm"
    assert "blocks.1.mixer.hook_in" not in specs and specs["blocks.1.attn.hook_q"].module == \
        "model.layers.1.self_attn.qkv_proj"
    assert "blocks.1.attn.hook_rot_q" not in specs  # NoPE: scores derived from q / k
    assert set(target.overlay.derived_specs(target.hf_config)) == {"blocks.1.attn.hook_attn_scores",
                                                                   "blocks.1.attn.hook_pattern"}


def test_forward_order_within_a_mamba_layer(specs):
    keys = [k for k in specs if k.startswith("blocks.0.")]
    assert keys.index("blocks.0.ln1.hook_normalized") < keys.index("blocks.0.mixer.hook_in") < \
        keys.index("blocks.0.mixer.hook_out") < keys.index("blocks.0.hook_resid_mid") < keys.index("blocks.0.hook_out")


def test_stream_pair_and_granites_multipliers(specs):
    assert (specs["blocks.1.hook_out"].read, specs["blocks.1.hook_resid_mid"].read) == ("out[0]", "in[0]")
    assert specs["embed.hook_out"].read == "in.hidden_states"  # after vLLM's embedding multiplier
    assert specs["blocks.1.hook_attn_out"].convert == (Mul(0.25),)
    assert specs["unembed.hook_out"].convert == (Mul(8.0),)


def test_the_dense_mlp_is_offered_under_transformerlens_names(specs):
    for h in ("hook_in", "hook_pre", "hook_pre_linear", "hook_post", "hook_out"):
        assert f"blocks.0.mlp.{h}" not in specs
        assert specs[f"blocks.0.shared_mlp.{h}"].reference_name("compat", None) == f"blocks.0.shared_mlp.{h}"
    assert specs["blocks.0.shared_mlp.hook_pre"].module == "model.layers.0.shared_mlp.input_linear"
    assert specs["blocks.0.shared_mlp.hook_pre"].convert == (Cols(0, 256),)
    assert specs["blocks.2.hook_mlp_out"].convert == (Mul(0.25),)


def test_nonfiring_per_layer_kind(target):
    nf = {n.template: n.reason for n in target.overlay.nonfiring_for(target.hf_config)}
    assert "Mamba-2 mixer" in nf["blocks.0.attn.hook_q"] and "blocks.1.attn.hook_q" not in nf
    assert "blocks.0.hook_attn_out" in nf and "blocks.0.attn.hook_pattern" in nf
    assert "runs attention" in nf["blocks.1.mixer.in_proj.hook_out"] and "blocks.1.mixer.conv1d.hook_out" in nf
    assert "vllm::mamba_mixer2" in nf["blocks.2.mixer.hook_ssm_state"]
    offered = set(target.overlay.hook_specs(target.hf_config))
    assert not offered & set(nf)


def test_rows_without_the_field_are_unchanged():
    from overlays.granite import GRANITE
    assert GRANITE.ssm_mixer is None and GRANITE.hook_names == () and GRANITEMOEHYBRID.ssm_mixer == SsmMixer()


def test_the_gated_norm_bug_covers_granitemoehybrid_with_more_than_one_group():
    hook = "blocks.0.mixer.inner_norm.hook_out"
    assert gated_norm_bug(ARCH, "hf", hook, {"mamba_n_groups": 2, "rms_norm_eps": 1e-5}) is not None
    assert gated_norm_bug(ARCH, "hf", hook, {"mamba_n_groups": 1}) is None  # released configs: one group


def test_hf_reference_hooks_and_corrects_granites_mamba_layers(target):
    """HF's layer holds the mixer as ``mamba``: the HF hooks find it, and the group-wise correction applies."""
    from harness.references.reference import GROUP_WISE_GATED_NORM, _hf_run, group_wise_gated_norm
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target.checkpoint), dtype=torch.float32).eval()
    assert group_wise_gated_norm(model) == GROUP_WISE_GATED_NORM
    caps, _ = _hf_run(model, [1, 5, 7, 9, 11], "cpu", 3)
    assert {"blocks.0.mixer.in_proj.hook_xBC", "blocks.2.mixer.inner_norm.hook_out"} <= set(caps)
    assert "blocks.1.mixer.hook_in" not in caps


def test_bamba_is_a_refusal_in_vllms_words():
    spec = FAMILIES["bamba"]
    cpu, cuda = spec.refusal_on("cpu"), spec.refusal_on("cuda")
    assert cpu.probe == cuda.probe == "boot" and cpu.reason == cuda.reason
    assert cpu.says == "does not dispatch through the Transformers attention interface" in cpu.reason
    assert not cuda.says  # the CUDA line's words were not recorded
    olmo = FAMILIES["olmo_hybrid"].refused
    assert olmo.devices == ("cpu",) and "set_allocator" in olmo.reason and olmo.says == "has no attribute 'set_allocator'"
