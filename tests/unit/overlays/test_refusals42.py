"""The refusals42 rows (harness/models/families.py: falcon_mamba, glm_moe_dsa, deepseek_v4) and FalconMamba's overlay
(overlays/falcon_mamba.py), engine-free: the refusals are declared with their probes and vLLM's words (the words
found in the installed vLLM), FalconMamba's specs are Mamba-1's plus the dt / B / C norms, and HF's hooks on the
family's own checkpoint hold those norms' outputs; DeepSeek-V4's hash-routing table is randomized."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.base import expand_layers
from overlays.falcon_mamba import NORMS, FalconMambaOverlay
from overlays.mamba import NONFIRING as MAMBA_NONFIRING


def _vllm_source(module: str) -> str:
    return Path(importlib.util.find_spec(module).origin).read_text()


def test_rows_are_cpu_refusals_with_their_probes():
    fm, dsa, v4 = FAMILIES["falcon_mamba"], FAMILIES["glm_moe_dsa"], FAMILIES["deepseek_v4"]
    assert (fm.refused.probe, fm.refused.devices) == ("op:selective_scan_fwd", ("cpu",))
    assert (dsa.refused.probe, dsa.refused.devices, dsa.refused.says) == (
        "boot", ("cpu",), "Sparse Attention is not supported on CPU")
    v4_cpu, v4_cuda = v4.refusal_on("cpu"), v4.refusal_on("cuda")
    assert (v4_cpu.probe, v4_cpu.devices, v4_cpu.says) == ("boot", ("cpu",), "The `mlp_layer_types` entries must be in")
    assert (v4_cuda.probe, v4_cuda.devices, v4_cuda.says) == ("boot", ("cuda",), "")
    assert (fm.architecture, dsa.architecture, v4.architecture) == (
        "FalconMambaForCausalLM", "GlmMoeDsaForCausalLM", "DeepseekV4ForCausalLM")
    for spec in (fm, dsa, v4):
        assert spec.builds_checkpoint and not spec.held_out


def test_refusal_words_are_vllms_own():
    words = "Sparse Attention is not supported on CPU."
    assert words in FAMILIES["glm_moe_dsa"].refused.reason
    assert f'raise NotImplementedError("{words}")' in _vllm_source("vllm.platforms.cpu")
    registry = _vllm_source("vllm.model_executor.models.registry")
    assert '"FalconMambaForCausalLM": ("mamba", "MambaForCausalLM")' in registry
    mamba = _vllm_source("vllm.model_executor.models.mamba")
    assert 'config.model_type == "falcon_mamba"' in mamba and "config.mixer_rms_eps" in mamba


def test_transformers_deepseek_v4_config_is_what_vllms_config_class_refuses():
    from transformers import AutoConfig
    from vllm.transformers_utils.configs.deepseek_v4 import DeepseekV4Config

    spec = FAMILIES["deepseek_v4"]
    written = AutoConfig.for_model(spec.model_type, **spec.hf_config_kwargs()).to_dict()
    with pytest.raises(Exception, match="mlp_layer_types.*hash_moe"):
        DeepseekV4Config(**written)


def test_deepseek_v4_hash_table_is_randomized():
    import transformers
    from transformers import AutoConfig

    from harness.models.checkpoints import randomize_

    spec = FAMILIES["deepseek_v4"]
    model = transformers.AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.model_type,
                                                                               **spec.hf_config_kwargs()))
    randomize_(model, spec)
    (table,) = [b for n, b in model.named_buffers() if n.endswith("tid2eid")]
    experts = model.config.n_routed_experts
    assert table.shape == (model.config.vocab_size, model.config.num_experts_per_tok)
    assert int(table.min()) >= 0 and int(table.max()) < experts and len(table.unique()) == experts
    assert bool((table[:, 0] != table[:, 1]).all())  # distinct experts per token


# ---- FalconMamba's overlay (run on CUDA only; checked here without an engine)

@pytest.fixture(scope="module")
def target():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["falcon_mamba"])


@pytest.fixture(scope="module")
def specs(target):
    return target.overlay.hook_specs(target.hf_config)


def test_registered_and_mamba1_plus_the_norms(target, specs):
    from overlays.mamba import MambaOverlay

    assert isinstance(get_overlay("FalconMambaForCausalLM"), FalconMambaOverlay)
    n, cfg = target.hf_config.num_hidden_layers, target.hf_config
    mamba = list(MambaOverlay().hook_specs(cfg))
    assert [h for h in specs if not any(f".{norm}." in h for norm in NORMS)] == mamba
    for i in range(n):
        names = list(specs)
        at = names.index(f"blocks.{i}.mixer.x_proj.hook_out")
        assert names[at + 1: at + 5] == [*(f"blocks.{i}.mixer.{norm}.hook_normalized" for norm in NORMS),
                                         f"blocks.{i}.mixer.out_proj.hook_in"]
    rank = -(-cfg.hidden_size // 16)
    for norm, width in zip(NORMS, (rank, cfg.state_size, cfg.state_size)):
        s = specs[f"blocks.1.mixer.{norm}.hook_normalized"]
        assert (s.module, s.read, s.convert, s.width) == (f"backbone.layers.1.mixer.{norm}", "out", (), width)
        assert s.reference_name("bridge", "x") is None and s.reference_name("compat", "x") is None
        assert s.reference_name("hf", None) == f"blocks.1.mixer.{norm}.hook_normalized"
    nonfiring = {h for nf in target.overlay.nonfiring() for h in expand_layers(nf.template, n)}
    assert nonfiring == {h for nf in MAMBA_NONFIRING for h in expand_layers(nf.template, n)}
    assert not nonfiring & set(specs)


def test_hf_hooks_hold_the_weightless_norms_and_match_the_bridge(target, specs):
    """HF's hooks (harness/references/reference.py) hold each norm's output, which is the weightless RMS norm of
    x_proj's dt / B / C split with the config's mixer_rms_eps; the Mamba-1 hooks equal TransformerBridge's."""
    from harness.references.reference import _boot_bridge, _hf_run, _load_hf

    cfg = target.hf_config
    tokens = list(range(5, 21))
    caps, _ = _hf_run(_load_hf(target.checkpoint, torch.float32, "cpu"), tokens, "cpu", cfg.num_hidden_layers)
    rank = -(-cfg.hidden_size // 16)
    for i in range(cfg.num_hidden_layers):
        parts = caps[f"blocks.{i}.mixer.x_proj.hook_out"].split([rank, cfg.state_size, cfg.state_size], dim=-1)
        for norm, x in zip(NORMS, parts):
            want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.mixer_rms_eps)
            got = caps[specs[f"blocks.{i}.mixer.{norm}.hook_normalized"].reference_name("hf", None)]
            assert got.shape == (len(tokens), specs[f"blocks.{i}.mixer.{norm}.hook_normalized"].width)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    _, cache = _boot_bridge(target.checkpoint, torch.float32, "cpu").run_with_cache(torch.tensor([tokens]))
    bridged = [n for n in specs if ".mixer." in n and not any(f".{norm}." in n for norm in NORMS)]
    assert len(bridged) == 6 * cfg.num_hidden_layers
    for name in bridged:
        hf = caps[specs[name].reference_name("hf", name)]
        torch.testing.assert_close(hf, cache[specs[name].reference_name("bridge", name)][0], rtol=0, atol=0, msg=name)


def test_plain_mamba_layers_get_no_norm_hooks():
    from harness.references.reference import _mamba1_mixer_hooks

    layer = torch.nn.Module()
    layer.mixer = torch.nn.Module()
    for name in ("in_proj", "x_proj", "dt_proj", "out_proj"):
        setattr(layer.mixer, name, torch.nn.Linear(2, 2))
    handles = _mamba1_mixer_hooks(layer, 0, {})
    assert len(handles) == 5
    for h in handles:
        h.remove()
