"""HF's own attention scores and pattern, read at its eager softmax (harness.references.reference
._attention_softmax_hooks): what counts as the layer's attention softmax, and that the function is restored."""
import pytest
import torch

from harness.references import reference as R


class _Layer(torch.nn.Module):
    """A stand-in layer calling softmax as HF's eager attention does (by attribute), plus a router's 2-D softmax
    and, optionally, a sink column or a second attention softmax."""

    def __init__(self, sink: bool = False, twice: bool = False, fail: bool = False):
        super().__init__()
        self.sink, self.twice, self.fail = sink, twice, fail

    def forward(self, scores):
        torch.nn.functional.softmax(scores[0, 0], dim=-1)  # a router's: 2-D
        x = torch.cat([scores, scores[..., :1]], dim=-1) if self.sink else scores
        out = torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32)
        if self.twice:
            torch.nn.functional.softmax(scores, dim=-1)
        if self.fail:
            raise RuntimeError("boom")
        return out


def _run(layer, t=4):
    caps = {}
    handles = R._attention_softmax_hooks(layer, 0, caps, t)
    scores = torch.randn(1, 2, t, t).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), torch.finfo(torch.float32).min)
    try:
        layer(scores)
    finally:
        for h in handles:
            h.remove()
    return caps, scores


def test_the_attention_softmax_input_and_output_are_recorded():
    caps, scores = _run(_Layer())
    assert torch.equal(caps["blocks.0.attn.hook_attn_scores"], scores)
    assert torch.equal(caps["blocks.0.attn.hook_pattern"], torch.softmax(scores, dim=-1))
    assert torch.nn.functional.softmax is R._SOFTMAX


@pytest.mark.parametrize("layer", [_Layer(sink=True), _Layer(twice=True)], ids=["sink-column", "two-softmaxes"])
def test_no_single_square_softmax_records_nothing(layer):
    caps, _ = _run(layer)
    assert caps == {}
    assert torch.nn.functional.softmax is R._SOFTMAX


def test_the_softmax_is_restored_when_the_layer_raises():
    with pytest.raises(RuntimeError, match="boom"):
        _run(_Layer(fail=True))
    assert torch.nn.functional.softmax is R._SOFTMAX
