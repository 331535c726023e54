"""Unit tests of the worker's read grammar evaluation (pure, tiny modules)."""
import pytest
import torch

from harness.engines.reads import eval_input, eval_output, natural_key, parse_read, resolve_module
from overlays.base import HookSpec


class Layer(torch.nn.Module):
    def forward(self, positions, hidden_states, residual):
        return hidden_states, residual


def test_parse_read_rejects_mixed_sides():
    with pytest.raises(ValueError, match="mixes inputs and outputs"):
        parse_read("out[0]+in.x")


def test_hookspec_rejects_bad_grammar():
    with pytest.raises(ValueError, match="read grammar"):
        HookSpec("m", "output")


def test_out_sum_treats_none_residual_as_zero():
    h = torch.ones(2, 3)
    side, terms = parse_read("out[0]+out[1]")
    assert torch.equal(eval_output((h, None), terms, "r"), h)
    assert torch.equal(eval_output((h, 2 * h), terms, "r"), 3 * h)


def test_out_index_zero_of_bare_tensor_is_the_tensor():
    h = torch.ones(2)
    assert torch.equal(eval_output(h, parse_read("out[0]")[1], "r"), h)


def test_inputs_by_name_positional_or_keyword():
    layer, h, r = Layer(), torch.ones(2, 2), torch.full((2, 2), 2.0)
    _, terms = parse_read("in.hidden_states+in.residual")
    cache: dict = {}
    assert torch.equal(eval_input(layer, (None, h, r), {}, terms, "r", cache), 3 * h)
    assert torch.equal(eval_input(layer, (None,), {"hidden_states": h, "residual": None}, terms, "r", cache), h)
    assert torch.equal(eval_input(layer, (None, h, r), {}, parse_read("in[2]")[1], "r", cache), r)


def test_read_is_a_copy_not_a_view():
    """Fused add-norm kernels update inputs in place after the pre-hook ran."""
    h = torch.ones(2)
    got = eval_output(h, parse_read("out")[1], "r")
    h.add_(1)
    assert torch.equal(got, torch.ones(2))


def test_resolve_module_and_natural_order():
    root = torch.nn.Module()
    root.layers = torch.nn.ModuleList([Layer(), Layer()])
    assert resolve_module(root, "layers.1") is root.layers[1]
    assert resolve_module(root, "layers.missing") is None
    assert sorted(["m.layers.10", "m.layers.9"], key=natural_key) == ["m.layers.9", "m.layers.10"]


def test_a_shared_module_maps_calls_to_every_layer_it_serves_not_only_the_requested_ones():
    """vLLM shares one rotary embedding across layers: selecting layer 2 alone must not take layer 0's call."""
    import torch

    from harness.engines.reads import sibling_paths

    rotary = torch.nn.Identity()

    class Layer(torch.nn.Module):
        def __init__(self, rot):
            super().__init__()
            self.self_attn = torch.nn.Module()
            self.self_attn.rotary_emb = rot

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([Layer(rotary), Layer(rotary), Layer(rotary), Layer(torch.nn.Identity())])
    assert sibling_paths(model, rotary, ["layers.2.self_attn.rotary_emb"]) == [
        "layers.0.self_attn.rotary_emb", "layers.1.self_attn.rotary_emb", "layers.2.self_attn.rotary_emb"]


def test_the_engines_own_reason_is_read_off_its_log():
    from harness.engines.subject import engine_reason

    pydantic = ["Traceback (most recent call last):", "  File \"x\", line 1",
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig",
                "  Value error, Total number of attention heads (9) must be divisible by tensor parallel size (2). "
                "[type=value_error, input_value=ArgsKwargs(())]", "    For further information visit https://x"]
    assert engine_reason(pydantic).endswith("must be divisible by tensor parallel size (2).")
    wrapped = ["ValueError: bad head size", "RuntimeError: Engine core initialization failed. See root cause above."]
    assert engine_reason(wrapped) == "ValueError: bad head size" and engine_reason(["all fine"]) is None
