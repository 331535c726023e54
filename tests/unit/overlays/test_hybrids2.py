"""The second hybrids group (overlays/falcon_h1.py; SsmMixer.hook / parallel / input_scale and the lm_head_multiplier
un-scale in overlays/tree.py), engine-free: attention and a Mamba-2 mixer on every layer under TL's ``mamba`` names,
the HF rows kept on the harness's ``mixer`` names, the multipliers the overlay divides out, the non-firing hooks, the
refused processed compatibility mode, and the HF reference's mixer hooks on Falcon-H1's ``mamba``."""
import pytest
import torch

from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.base import Cols, Mul
from overlays.falcon_h1 import FALCON_H1, FalconH1Overlay
from overlays.granitemoehybrid import GRANITEMOEHYBRID

ARCH = "FalconH1ForCausalLM"


@pytest.fixture(scope="module")
def target():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["falcon_h1"])


@pytest.fixture(scope="module")
def specs(target):
    return target.overlay.hook_specs(target.hf_config)


def test_registered_and_every_multiplier_is_off_one(target):
    assert isinstance(get_overlay(ARCH), FalconH1Overlay) and target.architecture == ARCH
    cfg = target.hf_config
    assert cfg.mamba_n_groups == 1 and cfg.mamba_rms_norm and not cfg.mamba_norm_before_gate
    for key in ("embedding_multiplier", "lm_head_multiplier", "key_multiplier", "attention_in_multiplier",
                "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier"):
        assert getattr(cfg, key) != 1, key
    assert all(m != 1 for m in (*cfg.ssm_multipliers, *cfg.mlp_multipliers))
    assert len(set(cfg.ssm_multipliers)) == 5 and cfg.mamba_d_ssm == cfg.mamba_n_heads * cfg.mamba_d_head


def test_every_layer_runs_attention_then_the_mixer(specs, target):
    inner, conv_dim, heads = FALCON_H1.ssm_mixer.sizes(target.hf_config)
    assert (inner, conv_dim, heads) == (256, 256 + 2 * 16, 8)
    for i in range(3):
        b, L = f"blocks.{i}", f"model.layers.{i}"
        assert specs[f"{b}.attn.hook_q"].module == f"{L}.self_attn.qkv_proj"
        assert specs[f"{b}.attn.hook_out"].read == "out[0]"  # FalconH1AttentionDecoderLayer: (out, residual)
        assert specs[f"{b}.mamba.hook_in"].module == f"{L}.mamba.mamba"
        assert specs[f"{b}.mamba.in_proj.hook_dt"].convert == (Cols(inner + conv_dim, inner + conv_dim + heads),)
        assert specs[f"{b}.mamba.inner_norm.hook_gate"].module == f"{L}.mamba.mamba.norm"
        assert not any(k.startswith(f"{b}.mixer.") for k in specs)
        keys = [k for k in specs if k.startswith(f"{b}.")]
        assert keys.index(f"{b}.attn.hook_out") < keys.index(f"{b}.mamba.hook_in") < \
            keys.index(f"{b}.mamba.hook_out") < keys.index(f"{b}.hook_resid_mid")
    assert set(target.overlay.derived_specs(target.hf_config)) == {
        f"blocks.{i}.attn.hook_{h}" for i in range(3) for h in ("attn_scores", "pattern")}


def test_hf_rows_keep_the_harness_mixer_names(specs):
    assert specs["blocks.1.mamba.hook_in"].reference_name("hf", None) == "blocks.1.mixer.hook_in"
    assert specs["blocks.1.mamba.inner_norm.hook_out"].reference_name("hf", None) == "blocks.1.mixer.inner_norm.hook_out"
    assert specs["blocks.1.mamba.in_proj.hook_xBC"].reference_name("bridge", "x") is None
    assert specs["blocks.1.mamba.in_proj.hook_out"].reference_name("bridge", "own") == "own"  # TL's own name


def test_multipliers_vllm_applies_outside_where_tl_reads_before(specs, target):
    cfg = target.hf_config
    assert specs["blocks.0.mamba.hook_in"].convert == (Mul(1.0 / cfg.ssm_in_multiplier),)
    assert specs["unembed.hook_out"].convert == (Mul(1.0 / cfg.lm_head_multiplier),)
    assert specs["embed.hook_out"].module == "model.embed_tokens"  # unscaled on every side
    assert specs["blocks.0.hook_in"].read == "in.hidden_states" and specs["blocks.0.hook_out"].read == "out"
    assert specs["blocks.0.hook_resid_mid"].module == "model.layers.0.pre_ff_layernorm"
    assert specs["blocks.0.mlp.hook_pre"].module == "model.layers.0.feed_forward.gate_up_proj"
    assert "blocks.0.hook_attn_out" not in specs and "blocks.0.hook_mlp_out" not in specs


def test_nonfiring_and_refused_processed_compat(specs, target):
    nf = {n.template: n.reason for n in target.overlay.nonfiring_for(target.hf_config)}
    assert set(nf) == {f"blocks.{i}.mamba.{h}" for i in range(3)
                       for h in ("conv1d.hook_out", "hook_ssm_state", "hook_ssm_write")}
    assert all(spec.reference_name("compat-processed", "x") is None for k, spec in specs.items() if k != "unembed.hook_out")


def test_mamba_rms_norm_off_offers_no_inner_norm_hooks():
    """Released Falcon-H1 configs have mamba_rms_norm false: HF's norm is an nn.Identity it never calls and TL offers no
    inner_norm hook, so the overlay offers none (SsmMixer.norm_key) and lists them non-firing; on, as the row, offered."""
    from types import SimpleNamespace

    from overlays.tree import NORM_OFF

    overlay = FalconH1Overlay()
    on = SimpleNamespace(**FAMILIES["falcon_h1"].config)
    off = SimpleNamespace(**{**FAMILIES["falcon_h1"].config, "mamba_rms_norm": False})
    assert FALCON_H1.ssm_mixer.norm_key == "mamba_rms_norm"
    assert FALCON_H1.ssm_mixer.has_norm(on) and not FALCON_H1.ssm_mixer.has_norm(off)
    specs_on, specs_off = overlay.hook_specs(on), overlay.hook_specs(off)
    norm = {f"blocks.{i}.mamba.inner_norm.{h}" for i in range(3) for h in ("hook_in", "hook_gate", "hook_out")}
    assert norm <= set(specs_on) and not norm & set(specs_off)
    assert set(specs_on) - set(specs_off) == norm
    nf = {n.template: n.reason for n in overlay.nonfiring_for(off)}
    assert norm <= set(nf) and nf["blocks.2.mamba.inner_norm.hook_out"] == NORM_OFF.format(key="mamba_rms_norm")
    assert not norm & {n.template for n in overlay.nonfiring_for(on)}
    assert GRANITEMOEHYBRID.ssm_mixer.norm_key is None and GRANITEMOEHYBRID.ssm_mixer.has_norm(off)


def test_granite_h_moe_configs_offer_no_mlp_contribution():
    """Granite-4.0-H-Tiny / H-Small (num_local_experts > 0): the MLP's contribution is block_sparse_moe + shared_mlp
    summed inline, no module's output and no TransformerLens hook, so hook_mlp_out is not offered and is non-firing
    with the reason; everything else is the dense config's (the shared MLP's hooks under TL's shared_mlp names)."""
    from types import SimpleNamespace

    from overlays.granitemoehybrid import MOE_MLP_OUT, GraniteMoeHybridOverlay, has_experts

    overlay = GraniteMoeHybridOverlay()
    dense = SimpleNamespace(**FAMILIES["granitemoehybrid"].config)
    moe = SimpleNamespace(**{**FAMILIES["granitemoehybrid"].config, "num_local_experts": 4, "num_experts_per_tok": 2})
    assert not has_experts(dense) and has_experts(moe)
    d, m = overlay.hook_specs(dense), overlay.hook_specs(moe)
    mlp_out = {h for h in d if h.endswith(".hook_mlp_out")}
    assert mlp_out and set(d) - set(m) == mlp_out and set(m) <= set(d)
    assert MOE_MLP_OUT in overlay.nonfiring_for(moe) and MOE_MLP_OUT not in overlay.nonfiring_for(dense)
    assert m["blocks.0.shared_mlp.hook_out"] == d["blocks.0.shared_mlp.hook_out"]


def test_granites_mixer_unchanged_by_the_new_fields():
    sm = GRANITEMOEHYBRID.ssm_mixer
    assert (sm.hook, sm.parallel, sm.input_scale) == ("mixer", False, None)
    assert sm.runs({"layer_types": ["linear_attention"]}, 0)
    assert not FALCON_H1.ssm_mixer.runs({"layer_types": ["linear_attention"]}, 0)  # parallel: never in attention's place


def test_hf_reference_hooks_falcon_h1s_mamba_under_mixer_names():
    from transformers import FalconH1Config, FalconH1ForCausalLM

    from harness.references.reference import _ssm_mixer_hooks

    cfg = FalconH1Config(**{k: v for k, v in FAMILIES["falcon_h1"].config.items()})
    torch.manual_seed(0)
    model = FalconH1ForCausalLM(cfg).eval()
    caps: dict[str, torch.Tensor] = {}
    handles = _ssm_mixer_hooks(model.model.layers[0], 0, caps)
    with torch.no_grad():
        model(torch.tensor([[1, 5, 9, 4]]))
    for h in handles:
        h.remove()
    assert caps["blocks.0.mixer.in_proj.hook_dt"].shape[-1] == cfg.mamba_n_heads
    assert caps["blocks.0.mixer.inner_norm.hook_gate"].shape[-1] == cfg.mamba_d_ssm
    assert {"blocks.0.mixer.hook_in", "blocks.0.mixer.hook_out", "blocks.0.mixer.inner_norm.hook_out"} <= set(caps)


# -- zamba2 ----------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zamba2():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["zamba2"])


def test_zamba2_registered_with_adapters_on(zamba2):
    from overlays.zamba2 import Zamba2Overlay, hybrid_layers, mamba_sizes

    assert isinstance(get_overlay("Zamba2ForCausalLM"), Zamba2Overlay) and zamba2.architecture == "Zamba2ForCausalLM"
    cfg = zamba2.hf_config
    assert cfg.use_shared_attention_adapter and cfg.use_mem_rope and cfg.mamba_ngroups == 1
    assert hybrid_layers(cfg) == [False, False, True]
    assert mamba_sizes(cfg) == (256, 256 + 2 * 16, 8)


def test_zamba2_offers_tls_hooks_mamba_layers_only(zamba2):
    from overlays.zamba2 import mamba_sizes

    specs = zamba2.overlay.hook_specs(zamba2.hf_config)
    inner, conv_dim, heads = mamba_sizes(zamba2.hf_config)
    for i in (0, 1):
        assert specs[f"blocks.{i}.mixer.hook_in"].module == f"model.layers.{i}.mamba"
        assert specs[f"blocks.{i}.mixer.in_proj.hook_dt"].convert == (Cols(inner + conv_dim, inner + conv_dim + heads),)
        assert specs[f"blocks.{i}.norm.hook_normalized"].module == f"model.layers.{i}.input_layernorm"
    assert {k for k in specs if k.startswith("blocks.2.")} == {"blocks.2.hook_in", "blocks.2.hook_out"}
    assert specs["blocks.2.hook_in"].read == "in.hidden_states" and specs["blocks.2.hook_out"].read == "out"
    assert specs["ln_final.hook_normalized"].module == "model.final_layernorm" and specs["unembed.hook_out"].convert == ()
    assert zamba2.overlay.derived_specs(zamba2.hf_config) == {}


def test_zamba2_nonfiring(zamba2):
    nf = {n.template: n.reason for n in zamba2.overlay.nonfiring_for(zamba2.hf_config)}
    assert "hybrid layer" in nf["blocks.2.mixer.in_proj.hook_out"] and "hybrid layer" in nf["blocks.2.norm.hook_normalized"]
    assert "blocks.2.mixer.conv1d.hook_out" in nf and "vllm::mamba_mixer2" in nf["blocks.0.mixer.hook_ssm_state"]
    assert "blocks.0.mixer.in_proj.hook_out" not in nf and "attention" in nf["blocks.{i}.attn.hook_q"]
