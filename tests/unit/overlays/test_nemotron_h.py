"""The Nemotron-H overlay (overlays/nemotron_h.py), engine-free: the layer kinds read from
hybrid_override_pattern, the per-kind mixer reads, Mamba-2's inner hooks on the Mamba layers only
(with Mamba-2's widths), HF rows for the Mamba mixers only, the non-firing reasons, and a bad
pattern refused with the fix."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.nemotron_h import NemotronHOverlay, mamba_sizes, pattern


def _target():
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES["nemotron_h"])


def test_the_row_has_a_layer_of_every_kind_the_cpu_line_runs():
    cfg = _target().hf_config
    assert pattern(cfg) == "M*-M" and get_overlay("NemotronHForCausalLM").name == "nemotron_h"
    assert mamba_sizes(cfg) == (256, 256 + 2 * 16, 8)


def test_mixer_reads_follow_the_layer_kind():
    specs = NemotronHOverlay().hook_specs(_target().hf_config)
    reads = {i: specs[f"blocks.{i}.mixer.hook_in"].read for i in range(4)}
    assert reads == {0: "in.hidden_states", 1: "in.hidden_states", 2: "in.x", 3: "in.hidden_states"}
    for i in (0, 3):  # Mamba: the in_proj split and the gated norm, with HF rows
        assert specs[f"blocks.{i}.mixer.in_proj.hook_out"].width == 256 + 288 + 8
        assert ("hf", f"blocks.{i}.mixer.inner_norm.hook_out") in specs[f"blocks.{i}.mixer.inner_norm.hook_out"].references
    for i in (1, 2):  # attention, MLP: the mixer's input and output only, no HF mixer row
        assert not [h for h in specs if h.startswith(f"blocks.{i}.mixer.") and h.count(".") > 3]
        assert specs[f"blocks.{i}.mixer.hook_out"].references == ()
    assert specs["blocks.2.hook_out"].read == "out[0]+out[1]" and specs["embed.hook_out"].module == "model.embed_tokens"


def test_attention_internals_are_non_firing_with_the_reason():
    nf = {n.template: n.reason for n in NemotronHOverlay().nonfiring()}
    assert "passthrough SSM2MixerBridge" in nf["blocks.{i}.attn.hook_q"]
    assert "vllm::mamba_mixer2" in nf["blocks.{i}.mixer.hook_ssm_state"]
    assert "one sublayer" in nf["blocks.{i}.hook_resid_mid"]


def test_a_pattern_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="one of M\\*-E per layer"):
        pattern(SimpleNamespace(hybrid_override_pattern="M*X", num_hidden_layers=3))
    with pytest.raises(ValueError, match="4 layers"):
        pattern(SimpleNamespace(hybrid_override_pattern="M*", num_hidden_layers=4))


def test_moe_layers_offer_their_router_against_hf_with_hfs_rule():
    """nemotron_h_moe ("ME*E"): the router logits of each MoE layer, compared with HF's only (TransformerLens has
    none), with a rule that chooses from HF's own logits the experts HF's router chose; the HF reference captures
    them under the overlay's name, with the chosen ids its own flips are found from."""
    import torch
    from transformers import AutoModelForCausalLM

    from harness.comparison.routing import chosen
    from harness.models.targets import target_for_family
    from harness.references.reference import _router_choice_hooks
    from harness.vocab.hook_rules import GATE

    target = target_for_family(FAMILIES["nemotron_h_moe"])
    specs = NemotronHOverlay().hook_specs(target.hf_config)
    routers = sorted(h for h in specs if GATE.match(h))
    assert routers == ["blocks.1.mixer.gate.hook_out", "blocks.3.mixer.gate.hook_out"]
    spec = specs["blocks.1.mixer.gate.hook_out"]
    assert (spec.module, spec.read, spec.width) == ("model.layers.1.mixer.gate", "out[0]", 4)
    assert dict(spec.references) == {"bridge": None, "compat": None, "hf": "blocks.1.mixer.gate.hook_out"}
    assert spec.routing.checkpoint_bias == "backbone.layers.1.mixer.gate.e_score_correction_bias"

    model = AutoModelForCausalLM.from_pretrained(str(target.checkpoint), dtype=torch.float32).eval()
    layer = model.model.layers[1]  # HF loads the checkpoint's backbone.* as model.*
    caps: dict = {}
    handles = _router_choice_hooks(layer, 1, caps)
    with torch.no_grad():
        model(torch.tensor([list(range(4, 40))]))
    for h in handles:
        h.remove()
    assert set(caps) == {f"blocks.1.mixer.gate.{h}" for h in ("hook_out", "hook_expert_weights", "hook_expert_indices")}
    mask, _ = chosen(caps["blocks.1.mixer.gate.hook_out"][0], 2, spec.routing, layer.mixer.gate.e_score_correction_bias)
    ids = caps["blocks.1.mixer.gate.hook_expert_indices"][0].long()
    assert torch.equal(mask, torch.zeros_like(mask).scatter_(1, ids, True))
