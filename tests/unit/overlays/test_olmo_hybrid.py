"""OLMo-Hybrid's overlay (overlays/olmo_hybrid.py; GdnMixer.norms / residual in overlays/tree.py), engine-free: vLLM
0.20.2 runs it on CUDA only, so its specs are checked against the family's config, vLLM 0.20.2's source (unpacked at
/tmp/vllm020), HF's modules and TransformerLens's bridge built on CPU from the family's synthetic checkpoint; the HF
reference's GDN hooks (harness.references.reference._gdn_mixer_hooks) and the checkpoint's norm names
(ModelSpec.released_weight_names), which the H200 run needs outside the overlay."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from harness.comparison.conversions import convert
from harness.comparison.shapes import unflatten_rows
from harness.models.families import FAMILIES
from overlays.base import expand_layers, hook_kind
from overlays.olmo_hybrid import OLMO_HYBRID, OlmoHybridOverlay

VLLM020 = Path("/tmp/vllm020/vllm")
SOURCE = VLLM020 / "model_executor/models/olmo_hybrid.py"
GDN_INNER = ("hook_q_pre_conv", "hook_k_pre_conv", "hook_v_pre_conv", "hook_beta_logit", "hook_recurrence_out",
             "hook_gate_input")
LINEAR, ATTENTION = (0, 2), (1,)
TOKENS = list(range(5, 21))


@pytest.fixture(scope="module")
def checkpoint():
    from harness.models.checkpoints import checkpoint_dir

    return checkpoint_dir(FAMILIES["olmo_hybrid"])


@pytest.fixture(scope="module")
def cfg(checkpoint):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def specs(cfg):
    return OlmoHybridOverlay().hook_specs(cfg)


@pytest.fixture(scope="module")
def hf_model(checkpoint):
    from harness.references.reference import _load_hf

    return _load_hf(checkpoint, torch.float32, "cpu")


@pytest.fixture(scope="module")
def bridge_caches(checkpoint):
    """TransformerBridge's cache on the family's checkpoint, plain and in compatibility mode (no processing)."""
    from harness.references.reference import _boot_bridge

    bridge = _boot_bridge(checkpoint, torch.float32, "cpu")
    with torch.no_grad():
        _, plain = bridge.run_with_cache(torch.tensor([TOKENS]))
        bridge.enable_compatibility_mode(no_processing=True)
        _, compat = bridge.run_with_cache(torch.tensor([TOKENS]))
    return plain, compat


def test_config_is_the_rows_and_the_layers_alternate(cfg):
    assert cfg.architectures == ["OlmoHybridForCausalLM"]
    assert list(cfg.layer_types) == ["linear_attention", "full_attention", "linear_attention"]
    assert cfg.rope_parameters["rope_theta"] is not None  # vLLM builds rotary_emb: hook_rot_q / hook_rot_k exist
    assert cfg.linear_allow_neg_eigval and OLMO_HYBRID.gdn_mixer.layout == "flat"


def test_linear_layers_are_pre_norm_with_the_gdn_mixer(specs):
    for i in LINEAR:
        L, b = f"model.layers.{i}", f"blocks.{i}"
        assert specs[f"{b}.ln1.hook_normalized"].module == f"{L}.input_layernorm"
        assert specs[f"{b}.ln2.hook_normalized"].module == f"{L}.post_attention_layernorm"  # pre-MLP on this layer
        assert (specs[f"{b}.hook_resid_mid"].module, specs[f"{b}.hook_resid_mid"].read) == (
            f"{L}.post_attention_layernorm", "in[0]")
        assert specs[f"{b}.hook_out"].read == "out" and specs[f"{b}.hook_in"].read == "in.hidden_states"
        assert not any(h.startswith((f"{b}.attn.", f"{b}.ln1_post.", f"{b}.ln2_post.")) for h in specs)
        G = f"{L}.linear_attn"
        assert specs[f"{b}.linear_attn.hook_in"].module == G
        for h in ("q", "k", "v"):
            assert specs[f"{b}.linear_attn.hook_{h}_pre_conv"].module == f"{G}.in_proj_qkvg"
        assert specs[f"{b}.linear_attn.hook_beta_logit"].module == f"{G}.b_proj"
        for h, read in (("hook_recurrence_out", "in[0]"), ("hook_gate_input", "in[1]")):
            s = specs[f"{b}.linear_attn.{h}"]
            assert (s.module, s.read, s.flat_rows) == (f"{G}.o_norm", read, 4)
        out = specs[f"{b}.linear_attn.hook_out"]
        assert (out.module, out.read) == (f"{G}.o_proj", "out[0]")  # the mixer returns None, o_proj fills output
        assert out.reference_name("compat", None) == f"{b}.hook_attn_out"  # TL's alias on a linear layer
        assert specs[f"{b}.mlp.hook_out"].reference_name("compat", "default") == "default"  # = hook_mlp_out
        for h in GDN_INNER:
            assert dict(specs[f"{b}.linear_attn.{h}"].references) == {"bridge": None, "hf": f"{b}.linear_attn.{h}"}


def test_attention_layers_are_olmo2_post_norm(specs):
    for i in ATTENTION:
        L, b = f"model.layers.{i}", f"blocks.{i}"
        assert not any(h.startswith((f"{b}.linear_attn.", f"{b}.ln1.", f"{b}.ln2.")) for h in specs)
        assert specs[f"{b}.ln1_post.hook_out"].module == f"{L}.post_attention_layernorm"
        assert specs[f"{b}.ln1_post.hook_out"].reference_name("compat", None) == f"{b}.hook_attn_out"
        assert specs[f"{b}.ln2_post.hook_out"].module == f"{L}.post_feedforward_layernorm"
        assert (specs[f"{b}.hook_resid_mid"].module, specs[f"{b}.hook_resid_mid"].read) == (f"{L}.mlp", "in[0]")
        assert specs[f"{b}.attn.hook_q"].module == f"{L}.self_attn.qkv_proj"
        assert specs[f"{b}.attn.hook_q_normed"].reference_name("bridge", None) == f"{b}.attn.q_norm.hook_out"
        assert specs[f"{b}.attn.hook_rot_q"].module == f"{L}.self_attn.rotary_emb"
        assert specs[f"{b}.attn.hook_rot_q"].reference_name("bridge", "x") is None  # derived scores' input only
        assert specs[f"{b}.attn.hook_out"].reference_name("compat", "x") is None  # the legacy name is post-normed


def test_nonfiring_by_layer_type(cfg, specs):
    ov = OlmoHybridOverlay()
    nf = {n.template: n.reason for n in ov.nonfiring_for(cfg)}
    n = cfg.num_hidden_layers
    assert not {h for t in nf for h in expand_layers(t, n)} & set(specs), "offered and non-firing"
    assert set(ov.derived_specs(cfg)) == {"blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern"}
    for i in LINEAR:
        for h in ("hook_q", "hook_k", "hook_v", "hook_beta", "hook_log_decay", "hook_ssm_state"):
            assert "olmo_hybrid_gdn_full_forward" in nf[f"blocks.{i}.linear_attn.{h}"]
        assert "Gated DeltaNet mixer in attention's place" in nf[f"blocks.{i}.attn.hook_pattern"]
        assert {f"blocks.{i}.attn.hook_q", f"blocks.{i}.attn.hook_rot_q", f"blocks.{i}.attn.hook_z"} <= set(nf)
    assert {f"blocks.1.linear_attn.{h}" for h in (*GDN_INNER, "hook_in", "hook_out", "hook_beta")} <= set(nf)
    assert all(nf.values())


def _source(rel: str = "") -> str:
    path = VLLM020 / rel if rel else SOURCE
    if not path.exists():
        pytest.skip(f"vLLM 0.20.2's source is not unpacked at {VLLM020} (needed: {path})")
    return path.read_text()


def test_every_module_the_overlay_reads_is_vllm_020s(specs):
    src = _source()
    attrs = {part for s in specs.values() for part in s.module.split(".")[2:] if not part.isdigit()}
    attrs |= {"embed_tokens", "norm"}
    assert attrs >= {"input_layernorm", "linear_attn", "in_proj_qkvg", "b_proj", "o_norm", "o_proj", "self_attn",
                     "qkv_proj", "q_norm", "k_norm", "rotary_emb", "post_feedforward_layernorm", "gate_up_proj"}
    for attr in sorted(attrs):
        assert re.search(rf"self\.{attr} = ", src), attr
    assert "self.logits_processor = LogitsProcessor(config.vocab_size)" in src  # no logit scale
    # the traps the docstring names, as vLLM 0.20.2 writes them
    assert "output[:num_tokens], _ = self.o_proj(core_attn_out)" in src  # hook_out at o_proj's out[0]
    assert "gate = gate.view(num_tokens, self.num_v_heads // self.tp_size, self.head_v_dim)" in src
    assert "self.o_norm(core_attn_out_flat, gate_flat)" in src  # [T x v_heads, d_v] both: flat_rows
    assert "output_sizes=[self.key_dim, self.key_dim, self.value_dim, self.value_dim]" in src  # flat [q|k|v|g]
    assert "self.linear_attn(\n                hidden_states=hidden_states," in src  # in.hidden_states by keyword
    assert "hidden_states = self.post_attention_layernorm(hidden_states)\n            hidden_states = self.mlp" in src
    assert "return output\n" in src and "q, k = self.rotary_emb(positions, q, k)" in src
    # the whole mixer is a splitting op: its submodules run eagerly (their hooks fire) between compiled pieces too
    assert '"vllm::olmo_hybrid_gdn_full_forward"' in _source("config/compilation.py")


def test_gdn_reads_equal_hfs_own_projections(hf_model, specs, cfg):
    """vLLM's in_proj_qkvg is HF's q / k / v / g_proj stacked (its loader's shards 0-3): the overlay's conversions of
    that output are HF's per-head projections, b_proj's output HF's beta logit, and o_norm's flat gate HF's g."""
    mixer = hf_model.model.layers[0].linear_attn
    x = torch.randn(1, 5, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        q, k, v, g, b = (getattr(mixer, f"{p}_proj")(x)[0] for p in "qkvgb")
    qkvg = torch.cat([q, k, v, g], dim=-1)
    nk, nv, hk, hv = OLMO_HYBRID.gdn_mixer.sizes(cfg)
    for name, want in (("q", q.view(5, nk, hk)), ("k", k.view(5, nk, hk)), ("v", v.view(5, nv, hv))):
        assert torch.equal(convert(specs[f"blocks.0.linear_attn.hook_{name}_pre_conv"], qkvg, {}), want), name
    assert torch.equal(convert(specs["blocks.0.linear_attn.hook_beta_logit"], b, {}), b)
    vllm_gate = qkvg[:, -nv * hv:].view(5, nv, hv).reshape(-1, hv)  # as _full_forward hands it to o_norm
    spec = specs["blocks.0.linear_attn.hook_gate_input"]
    assert torch.equal(unflatten_rows(spec.flat_rows, vllm_gate), g.view(5, nv, hv))


def test_hf_mixer_calls_its_projections_before_b_proj_and_o_norm_flat(hf_model):
    """What a reference-side hook can rely on: q / k / v_proj run before b_proj, o_norm gets ([B T v_heads, d_v]) x 2."""
    mixer, order, norm_in = hf_model.model.layers[0].linear_attn, [], []
    handles = [getattr(mixer, f"{p}_proj").register_forward_hook(lambda m, a, o, _p=p: order.append(_p)) for p in "qkvbg"]
    handles.append(mixer.o_norm.register_forward_hook(lambda m, a, o: norm_in.append([t.shape for t in a])))
    try:
        with torch.no_grad():
            hf_model(torch.tensor([TOKENS]))
    finally:
        for h in handles:
            h.remove()
    assert order[:4] == ["q", "k", "v", "b"] and not hasattr(mixer, "norm")
    assert norm_in[0] == [torch.Size([len(TOKENS) * mixer.num_v_heads, mixer.head_v_dim])] * 2


def test_hf_reference_captures_the_gdn_hooks_the_overlay_names(hf_model, specs):
    from harness.references.reference import _gdn_mixer_hooks

    caps: dict[str, torch.Tensor] = {}
    handles = _gdn_mixer_hooks(hf_model.model.layers[0], 0, caps)
    with torch.no_grad():
        hf_model(torch.tensor([TOKENS]))
    for h in handles:
        h.remove()
    want = {s.reference_name("hf", None) for h, s in specs.items() if h.startswith("blocks.0.linear_attn.")}
    assert want <= set(caps)


def test_tl_and_compat_names_exist_on_the_bridge(specs, cfg, bridge_caches):
    from harness.values.plan import bridge_name, compat_name

    plain, compat = bridge_caches
    for hook, spec in specs.items():
        name = bridge_name(hook, spec)
        assert name is None or name in plain, (hook, name)
        alias = compat_name(hook, spec)
        assert alias is None or alias in compat, (hook, alias)
    for hook in OlmoHybridOverlay().derived_specs(cfg):
        assert hook in plain and hook in compat
    # what the references say of the rows the overlay declares not compared
    assert "blocks.1.attn.hook_rot_q" not in plain and "blocks.1.attn.hook_q_normed" not in plain
    assert not any(".linear_attn.hook_" in k and hook_kind(k).split(".")[-1] in GDN_INNER for k in plain)
    assert torch.equal(compat["blocks.0.hook_attn_out"], compat["blocks.0.linear_attn.hook_out"])
    assert torch.equal(compat["blocks.1.hook_attn_out"], compat["blocks.1.ln1_post.hook_out"])
    # the OPT-style TransformerLens bug (harness/comparison/known_issues.py signature scores_equal_pattern)
    assert torch.equal(plain["blocks.1.attn.hook_attn_scores"], plain["blocks.1.attn.hook_pattern"])


def test_vllm_020_maps_every_norm_name_of_the_synthetic_checkpoint(checkpoint):
    from safetensors import safe_open

    src = _source()
    with safe_open(str(Path(checkpoint) / "model.safetensors"), "pt") as f:
        norms = {k.split(".")[-2] for k in f.keys() if "norm" in k.split(".")[-2]}
    assert {n for n in norms if not re.search(rf"self\.{n} = ", src) and f'"{n}"' not in src} == set()
