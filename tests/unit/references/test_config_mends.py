"""harness.references.config_mends: a reference config the installed transformers misreads is mended only where the
loaded config shows it (MiniMax-M2's legacy ``rotary_dim``: transformers 5.17.0 ignores it, 5.18.0 on derive
``partial_rotary_factor`` from it)."""
from __future__ import annotations

import copy

import pytest

from harness.models.checkpoints import checkpoint_dir
from harness.models.families import FAMILIES
from harness.references.config_mends import CONFIG_MENDS, config_mend


@pytest.fixture(scope="module")
def minimax_cfg():
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(checkpoint_dir(FAMILIES["minimax_m2"]))


def _as_517_loads_it(cfg):
    """The config as transformers 5.17.0 loads a released MiniMax-M2 config.json: rotary_dim kept, the rope
    parameters without partial_rotary_factor."""
    old = copy.deepcopy(cfg)
    old.rope_parameters = {k: v for k, v in cfg.rope_parameters.items() if k != "partial_rotary_factor"}
    return old


def test_a_config_that_carries_the_factor_is_not_mended(minimax_cfg):
    assert minimax_cfg.rotary_dim < minimax_cfg.head_dim  # the family rotates part of each head
    if "partial_rotary_factor" not in minimax_cfg.rope_parameters:
        pytest.fail("the installed transformers drops rotary_dim: the mend below is what its references run with")
    assert config_mend(minimax_cfg) is None


def test_the_legacy_rotary_dim_alone_is_mended_to_its_factor(minimax_cfg):
    old = _as_517_loads_it(minimax_cfg)
    mend, overrides = config_mend(old)
    assert mend is CONFIG_MENDS[0] and mend.label == "partial rotary from rotary_dim"
    assert overrides == {"rope_parameters": {**old.rope_parameters,
                                             "partial_rotary_factor": old.rotary_dim / old.head_dim}}
    assert "5.17.0" in mend.reason and "5.18.0" in mend.reason


def test_the_mended_config_builds_hf_rotary_of_rotary_dim(minimax_cfg):
    from transformers import AutoModelForCausalLM

    old = _as_517_loads_it(minimax_cfg)
    for key, value in config_mend(old)[1].items():
        setattr(old, key, value)
    model = AutoModelForCausalLM.from_config(old)
    assert model.model.rotary_emb.inv_freq.numel() * 2 == old.rotary_dim


@pytest.mark.parametrize("change", [{"rotary_dim": 32}, {"model_type": "llama"}, {"rotary_dim": None}])
def test_no_mend_where_the_signature_does_not_hold(minimax_cfg, change):
    old = _as_517_loads_it(minimax_cfg)
    for key, value in change.items():
        setattr(old, key, value)
    assert config_mend(old) is None
