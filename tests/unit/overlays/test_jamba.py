"""Jamba's overlay (overlays/jamba.py) and family row, engine-free: the CPU refusal stays as declared, the synthetic
config runs every (mixer, feed-forward) pair, each layer kind offers its hooks at vLLM 0.20.2's module paths (the
family's config and a released-like Jamba-v0.1 pattern), the other kind's hooks are non-firing per layer, and HF's
Mamba-1 hooks find Jamba's ``mamba`` mixer and un-weight its dt / B / C norms."""
import pytest
import torch
from transformers import AutoConfig

from harness.models.families import FAMILIES
from overlays import get_overlay, norm_weight_offset
from overlays.base import Cols, Heads, UnfoldNorm, expand_layers
from overlays.jamba import NORMS, JambaOverlay, block_types, moe_layers

MIXER = ["mixer.hook_in", "mixer.in_proj.hook_out", "mixer.x_proj.hook_in", "mixer.x_proj.hook_out",
         *(f"mixer.{n}.hook_normalized" for n in NORMS), "mixer.out_proj.hook_in", "mixer.hook_out"]
ATTN = ["attn.hook_in", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z", "attn.hook_out"]
DENSE = ["mlp.hook_in", "mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post", "mlp.hook_out"]
MOE = ["mlp.hook_in", "mlp.gate.hook_out", "mlp.hook_out"]


def _expected(kind: str, moe: bool) -> list[str]:
    return ["hook_in", "ln1.hook_normalized", *(MIXER if kind == "mamba" else ATTN), "hook_resid_mid",
            "ln2.hook_normalized", *(MOE if moe else DENSE), "hook_out"]


def _family_cfg():
    spec = FAMILIES["jamba"]
    return AutoConfig.for_model(spec.model_type, **spec.hf_config_kwargs())


# Jamba-v0.1's shape (config.json): 32 layers, attention every 8th from 4, MoE every 2nd from 1, 16 experts top-2
RELEASED = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, num_experts=16, num_experts_per_tok=2, attn_layer_period=8, attn_layer_offset=4,
                expert_layer_period=2, expert_layer_offset=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                mamba_dt_rank=256, vocab_size=65536)


def test_the_family_row_keeps_its_cpu_refusal_and_runs_every_pair():
    spec = FAMILIES["jamba"]
    assert spec.refused.probe == "op:selective_scan_fwd" and spec.refused.devices == ("cpu",)
    assert "selective_scan_fwd" in spec.refused.reason
    assert FAMILIES["mamba"].refused.devices == ("cpu",)  # the row above, unchanged
    cfg = _family_cfg()
    pairs = set(zip(block_types(cfg), moe_layers(cfg)))
    assert pairs == {("mamba", True), ("mamba", False), ("attention", True), ("attention", False)}
    assert cfg.hidden_size // cfg.num_attention_heads == 32 and cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.mamba_proj_bias and cfg.mamba_conv_bias and cfg.num_experts_per_tok == 2


def test_registered_with_plain_rms_norms():
    assert isinstance(get_overlay("JambaForCausalLM"), JambaOverlay)
    assert norm_weight_offset("JambaForCausalLM") == 0.0 == FAMILIES["jamba"].norm_weight_offset


@pytest.mark.parametrize("config", ["family", "released"])
def test_each_layer_kind_offers_its_hooks_in_forward_order(config):
    cfg = _family_cfg() if config == "family" else AutoConfig.for_model("jamba", **RELEASED)
    ov = JambaOverlay()
    specs = ov.hook_specs(cfg)
    kinds, moe = block_types(cfg), moe_layers(cfg)
    assert kinds == list(cfg.layers_block_type) and moe == [e > 1 for e in cfg.layers_num_experts]
    if config == "released":
        assert [i for i, k in enumerate(kinds) if k == "attention"] == [4, 12, 20, 28]
        assert [i for i, m in enumerate(moe) if m] == list(range(1, 32, 2))
    want = ["embed.hook_out", *(f"blocks.{i}.{h}" for i in range(cfg.num_hidden_layers)
                                for h in _expected(kinds[i], moe[i])), "ln_final.hook_normalized", "unembed.hook_out"]
    assert list(specs) == want
    n = cfg.num_hidden_layers
    nonfiring = [h for nf in ov.nonfiring_for(cfg) for h in expand_layers(nf.template, n)]
    assert len(nonfiring) == len(set(nonfiring)) and not set(nonfiring) & set(specs)
    assert all(nf.reason for nf in ov.nonfiring_for(cfg))
    for i in range(n):  # the other kinds' hooks are declared, per layer
        other = ATTN + ["attn.hook_attn_scores", "attn.hook_pattern"] if kinds[i] == "mamba" else MIXER
        assert {f"blocks.{i}.{h}" for h in other} <= set(nonfiring)
        assert {f"blocks.{i}.mixer.{h}" for h in ("conv1d.hook_out", "dt_proj.hook_out", "hook_ssm_state")} <= (
            set(nonfiring))
        assert (f"blocks.{i}.mlp.gate.hook_expert_indices" in nonfiring) == moe[i]
        assert (f"blocks.{i}.mlp.hook_pre" in nonfiring) == moe[i]
        assert (f"blocks.{i}.mlp.gate.hook_out" in nonfiring) == (not moe[i])
    derived = ov.derived_specs(cfg)
    assert set(derived) == {f"blocks.{i}.attn.{h}" for i in range(n) if kinds[i] == "attention"
                            for h in ("hook_attn_scores", "hook_pattern")}
    d_head = cfg.hidden_size // cfg.num_attention_heads
    assert {(d.scale, d.causal, d.window) for d in derived.values()} == {(d_head ** -0.5, True, None)}


def test_module_paths_are_vllm_0_20_2s():
    cfg = _family_cfg()  # layers: 0 mamba + MoE, 1 attention + dense, 2 mamba + dense, 3 attention + MoE
    specs = JambaOverlay().hook_specs(cfg)
    D, I, rank, state = 128, 256, 8, 16

    def at(hook):
        s = specs[hook]
        return s.module, s.read, s.convert, s.width

    assert at("embed.hook_out") == ("model.embed_tokens", "out", (), D)
    assert at("blocks.0.hook_in") == ("model.layers.0", "in.hidden_states+in.residual", (), D)
    assert at("blocks.0.ln1.hook_normalized") == ("model.layers.0.input_layernorm", "out[0]",
                                                  (UnfoldNorm("model.layers.0.input_layernorm.weight"),), D)
    assert at("blocks.0.mixer.hook_in") == ("model.layers.0.mamba", "in.hidden_states", (), D)
    assert at("blocks.0.mixer.in_proj.hook_out") == ("model.layers.0.mamba.in_proj", "out[0]", (), 2 * I)
    assert at("blocks.0.mixer.x_proj.hook_in") == ("model.layers.0.mamba.x_proj", "in[0]", (), I)
    assert at("blocks.0.mixer.x_proj.hook_out") == ("model.layers.0.mamba.x_proj", "out[0]", (), rank + 2 * state)
    for norm, width in zip(NORMS, (rank, state, state)):
        path = f"model.layers.2.mamba.{norm}"
        assert at(f"blocks.2.mixer.{norm}.hook_normalized") == (path, "out", (UnfoldNorm(f"{path}.weight"),), width)
        assert specs[f"blocks.2.mixer.{norm}.hook_normalized"].reference_name("hf", None) == (
            f"blocks.2.mixer.{norm}.hook_normalized")
    assert at("blocks.0.mixer.out_proj.hook_in") == ("model.layers.0.mamba.out_proj", "in[0]", (), I)
    assert at("blocks.0.mixer.hook_out") == ("model.layers.0.mamba.out_proj", "out[0]", (), D)
    assert at("blocks.1.attn.hook_in") == ("model.layers.1.qkv_proj", "in[0]", (), D)
    assert at("blocks.1.attn.hook_q") == ("model.layers.1.qkv_proj", "out[0]", (Cols(0, 128), Heads(4, 32)), 128)
    assert at("blocks.1.attn.hook_k") == ("model.layers.1.qkv_proj", "out[0]", (Cols(128, 192), Heads(2, 32)), 64)
    assert at("blocks.1.attn.hook_v") == ("model.layers.1.qkv_proj", "out[0]", (Cols(192, 256), Heads(2, 32)), 64)
    assert at("blocks.1.attn.hook_z") == ("model.layers.1.o_proj", "in[0]", (Heads(4, 32),), 128)
    assert at("blocks.1.attn.hook_out") == ("model.layers.1.o_proj", "out[0]", (), D)
    assert at("blocks.1.hook_resid_mid") == ("model.layers.1.pre_ff_layernorm", "in[0]+in[1]", (), D)
    assert at("blocks.1.mlp.hook_pre") == ("model.layers.1.feed_forward.gate_up_proj", "out[0]", (Cols(0, 256),), 256)
    assert at("blocks.1.mlp.hook_pre_linear") == ("model.layers.1.feed_forward.gate_up_proj", "out[0]",
                                                  (Cols(256, 512),), 256)
    assert at("blocks.1.mlp.hook_post") == ("model.layers.1.feed_forward.down_proj", "in[0]", (), 256)
    assert at("blocks.3.mlp.gate.hook_out") == ("model.layers.3.feed_forward.router", "out[0]", (), 4)
    router = specs["blocks.3.mlp.gate.hook_out"]
    assert router.reference_name("bridge", None) == router.reference_name("compat", None) == (
        "blocks.3.mlp.router.hook_out")  # TL's Jamba adapter names the router mlp.router
    assert router.routing is None  # softmax top-k without bias or groups: the top-k logits
    assert at("blocks.3.mlp.hook_out") == ("model.layers.3.feed_forward", "out", (), D)
    assert at("blocks.3.hook_out") == ("model.layers.3", "out[0]+out[1]", (), D)
    assert at("ln_final.hook_normalized") == ("model.final_layernorm", "out[0]",
                                              (UnfoldNorm("model.final_layernorm.weight"),), D)
    assert specs["unembed.hook_out"].module == "logits_processor" and specs["unembed.hook_out"].calls == "all"


def test_a_config_json_mapping_gives_the_configs_layer_kinds():
    cfg = _family_cfg()
    plain = {k: v for k, v in cfg.to_dict().items() if k not in ("layers_block_type", "layers_num_experts")}
    assert block_types(plain) == list(cfg.layers_block_type)
    assert moe_layers(plain) == [e > 1 for e in cfg.layers_num_experts]


def _mamba_layer(weight_kind):
    layer, mixer = torch.nn.Module(), torch.nn.Module()
    layer.mamba = mixer
    for name in ("in_proj", "x_proj", "dt_proj", "out_proj"):
        setattr(mixer, name, torch.nn.Linear(2, 2))

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            if weight_kind == "parameter":
                self.weight = torch.nn.Parameter(torch.tensor([2.0, 4.0]))
            else:
                self.register_buffer("weight", torch.ones(2), persistent=False)

        def forward(self, x):
            return x * self.weight
    for name in NORMS:
        setattr(mixer, name, Norm())
    return layer


@pytest.mark.parametrize("weight_kind", ["parameter", "buffer"])
def test_hf_hooks_find_jambas_mamba_mixer_and_unweight_learned_norms(weight_kind):
    from harness.references.reference import _mamba1_mixer_hooks

    layer, caps = _mamba_layer(weight_kind), {}
    handles = _mamba1_mixer_hooks(layer, 3, caps)
    assert len(handles) == 8  # the mixer's pre / post, in_proj, x_proj, three norms, out_proj
    x = torch.tensor([[1.0, 1.0]])
    layer.mamba.dt_layernorm(x)
    for h in handles:
        h.remove()
    torch.testing.assert_close(caps["blocks.3.mixer.dt_layernorm.hook_normalized"], x)  # w * x / w, or x * 1
