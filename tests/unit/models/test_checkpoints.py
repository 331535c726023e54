"""Family registry and synthetic checkpoints."""
import pytest

from harness.models.checkpoints import checkpoint_dir, spec_key
from harness.models.families import DEFAULT_FAMILIES, FAMILIES, UnknownFamilyError, resolve_families


def test_default_set_and_selection():
    assert [s.name for s in resolve_families(None)] == list(DEFAULT_FAMILIES)
    assert {"qwen3", "llama", "gemma"} <= set(DEFAULT_FAMILIES)
    assert [s.name for s in resolve_families("qwen3, gemma,qwen3")] == ["qwen3", "gemma"]


def test_unknown_family_lists_known_ones():
    with pytest.raises(UnknownFamilyError) as exc:
        resolve_families("qwen3,nope")
    assert "'nope'" in str(exc.value) and "qwen3" in str(exc.value) and "gemma" in str(exc.value)


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_checkpoint_is_randomized_everywhere(family):
    from safetensors.torch import load_file

    spec = FAMILIES[family]
    weights = load_file(str(checkpoint_dir(spec) / "model.safetensors"))
    for name, w in weights.items():
        if name.endswith("norm.weight"):
            eff = w + spec.norm_weight_offset
            assert (eff - 1).abs().min() >= 0.09, f"{name}: a norm weight is ~identity"
            assert eff.abs().min() >= 0.4, f"{name}: a norm weight is near zero (un-fold would blow up)"
        elif name.endswith("bias"):
            assert (w != 0).all(), f"{name}: zero bias hides bias bugs"
        assert w.float().std() > 0, f"{name} is constant"


def test_checkpoint_is_deterministic_and_keyed():
    spec = FAMILIES["qwen3"]
    assert spec_key(spec) == spec_key(spec)
    assert checkpoint_dir(spec) == checkpoint_dir(spec)
    other = type(spec)(spec.name, spec.model_type, dict(spec.config), seed=7)
    assert spec_key(other) != spec_key(spec)


def test_packaged_rows_dispatch_to_the_gguf_builder(monkeypatch, tmp_path):
    import harness.models.gguf_checkpoint as gguf_checkpoint

    packaged = [s for s in FAMILIES.values() if s.packaged is not None]
    assert [s.name for s in packaged] == ["smollm2", "gemma3_270m"]
    assert all(s.packaged.sha256 and s.packaged.version for s in packaged)
    assert all(s.packaged is None for s in FAMILIES.values() if s.name not in ("smollm2", "gemma3_270m"))
    monkeypatch.setattr(gguf_checkpoint, "packaged_checkpoint_dir", lambda spec: tmp_path / spec.name)
    assert checkpoint_dir(packaged[0]) == tmp_path / "smollm2"


def test_the_architecture_follows_the_auto_class():
    """A family's HF architecture (and so its overlay) is the one its auto class builds: a masked LM for the
    encoder, a causal LM otherwise."""
    from harness.models.families import FAMILIES

    assert FAMILIES["bert"].auto_class == "AutoModelForMaskedLM" and FAMILIES["bert"].architecture == "BertForMaskedLM"
    assert FAMILIES["qwen3"].architecture == "Qwen3ForCausalLM" and FAMILIES["gemma"].norm_weight_offset == 1.0
    assert "bert" in __import__("harness.models.families", fromlist=["x"]).DEFAULT_FAMILIES
