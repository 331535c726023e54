"""Unit tests of the worker's capture path (harness.engines.vllm_worker) on a toy model built
like vLLM's: fused add-norm and rotary kernels that work in place, one rotary module shared by
every layer, decoder layers returning ``(delta, residual)``.  No engine boots."""
from __future__ import annotations

import types

import pytest
import torch

from harness.engines.reads import sum_terms
from harness.engines.vllm_worker import CaptureExtension


class AddNorm(torch.nn.Module):
    """vLLM's fused add-norm: ``residual += x`` and ``x = norm(residual)``, both in place."""

    def forward(self, x, residual=None):
        if residual is None:
            return x * 2
        residual.add_(x)
        x.copy_(residual * 3)
        return x, residual


class Rotary(torch.nn.Module):
    """Rotates q and k in place inside the qkv output (vLLM's CPU/GPU rotary kernels do)."""

    def forward(self, positions, q, k):
        q.mul_(-1)
        k.add_(1)
        return q, k


class Layer(torch.nn.Module):
    def __init__(self, rotary):
        super().__init__()
        self.input_layernorm = AddNorm()
        self.qkv = torch.nn.Linear(4, 8)
        self.rotary_emb = rotary
        self.o = torch.nn.Linear(4, 4)

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states.clone()
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        qkv = self.qkv(hidden_states)
        q, k = qkv[:, :4], qkv[:, 4:]
        q, k = self.rotary_emb(positions, q, k)
        return self.o(q + k), residual


class Toy(torch.nn.Module):
    def __init__(self, n=3):
        super().__init__()
        rotary = Rotary()
        self.layers = torch.nn.ModuleList([Layer(rotary) for _ in range(n)])

    def forward(self, x):
        r = None
        for layer in self.layers:
            x, r = layer(None, x, r)
        return x + r


def _ext(model, reads):
    ext = CaptureExtension()
    ext.model_runner = types.SimpleNamespace(model=model)
    assert ext.vp_install(reads) == []
    return ext


def _reference(model, x):
    """Every read of ``READS`` taken by hand, copied at the moment it happens."""
    seen: dict[str, list] = {}
    orig = {}
    for i, layer in enumerate(model.layers):
        def norm_pre(mod, args, i=i):
            if len(args) > 1:
                seen.setdefault(f"layers.{i}.input_layernorm|in[0]+in[1]", []).append(args[0].clone() + args[1])

        def qkv_post(mod, args, out, i=i):
            seen.setdefault(f"layers.{i}.qkv|out", []).append(out.clone())

        def layer_post(mod, args, out, i=i):
            seen.setdefault(f"layers.{i}|out[0]+out[1]", []).append(out[0].clone() + out[1])
        orig[i] = [layer.input_layernorm.register_forward_pre_hook(norm_pre), layer.qkv.register_forward_hook(qkv_post),
                   layer.register_forward_hook(layer_post)]
    calls = []
    rot = model.layers[0].rotary_emb.register_forward_hook(lambda m, a, o: calls.append((o[0].clone(), o[1].clone())))
    with torch.no_grad():
        model(x)
    for handles in orig.values():
        for h in handles:
            h.remove()
    rot.remove()
    for i, (q, k) in enumerate(calls):
        seen[f"layers.{i}.rotary_emb|out[0]"] = [q]
        seen[f"layers.{i}.rotary_emb|out[1]"] = [k]
    return seen


READS = [[f"layers.{i}", "out[0]+out[1]"] for i in range(3)] + \
        [[f"layers.{i}.input_layernorm", "in[0]+in[1]"] for i in range(1, 3)] + \
        [[f"layers.{i}.qkv", "out"] for i in range(3)] + \
        [[f"layers.{i}.rotary_emb", r] for i in range(3) for r in ("out[0]", "out[1]")]


def _records(ext):
    return {k: [t.clone() for t in v] for k, v in ext._vp_records.items()}


def test_every_read_is_the_value_at_its_moment_not_after_the_in_place_kernels():
    torch.manual_seed(0)
    model, x = Toy(), torch.randn(5, 4)
    want = _reference(model, x)
    ext = _ext(model, READS)
    with torch.inference_mode():
        model(x)
    got = _records(ext)
    assert got.keys() == want.keys()
    for key in want:
        assert len(got[key]) == len(want[key]) == 1, key
        assert torch.equal(got[key][0], want[key][0]), key  # bitwise


def test_one_hook_per_module_and_side_however_many_reads():
    model = Toy()
    ext = _ext(model, READS + [["layers.0.qkv", "in[0]"]])
    # layers x3, input_layernorm x2 (pre), qkv x3 (post) + 1 (pre), one shared rotary (post), two timers
    assert len(ext._vp_handles) == 3 + 2 + 4 + 1 + 2


def test_buffers_are_reused_across_forwards_and_never_shared_between_records():
    torch.manual_seed(0)
    model, x = Toy(), torch.randn(5, 4)
    ext = _ext(model, READS)
    with torch.inference_mode():
        model(x)
    first = {k: v[0].data_ptr() for k, v in ext._vp_records.items()}
    assert len(set(first.values())) == len(first)  # safetensors refuses shared storage
    ext.vp_reset()
    with torch.inference_mode():
        model(x)
    assert {k: v[0].data_ptr() for k, v in ext._vp_records.items()} == first
    with torch.inference_mode():
        model(x[:3])  # fewer tokens: a prefix of the same buffer, the right shape
    assert all(len(v) == 2 and v[1].shape[0] == 3 for v in ext._vp_records.values())


def test_dump_writes_records_as_they_are(tmp_path):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    model, x = Toy(), torch.randn(5, 4)
    ext = _ext(model, READS)
    with torch.inference_mode():
        model(x)
        model(x[:2])  # two calls per key: two buffers per key
    summary = ext.vp_dump(str(tmp_path / "raw.safetensors"))
    back = load_file(summary["path"])
    assert set(summary["calls"].values()) == {2}
    for key, records in ext._vp_records.items():
        for n, t in enumerate(records):
            assert torch.equal(back[f"{key}#{n}"], t)


def test_disabled_capture_records_nothing_and_counts_no_call():
    torch.manual_seed(0)
    model, x = Toy(), torch.randn(5, 4)
    ext = _ext(model, READS)
    ext.vp_set_enabled(False)
    with torch.inference_mode():
        model(x)
    assert ext._vp_records == {}
    ext.vp_set_enabled(True)
    with torch.inference_mode():
        model(x)
    assert all(len(v) == 1 for v in ext._vp_records.values())  # the shared rotary's layer 0 is layer 0 again


def test_selecting_one_layer_of_a_shared_module_takes_that_layers_call():
    torch.manual_seed(0)
    model, x = Toy(), torch.randn(5, 4)
    want = _reference(model, x)
    ext = _ext(model, [["layers.2.rotary_emb", "out[1]"], ["layers.1.rotary_emb", "out[0]"]])
    with torch.inference_mode():
        model(x)
    assert sorted(ext._vp_records) == ["layers.1.rotary_emb|out[0]", "layers.2.rotary_emb|out[1]"]
    for key, records in ext._vp_records.items():
        assert torch.equal(records[0], want[key][0])


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compiled_hooks_record_through_the_op_what_eager_records(backend):
    """Under torch.compile the hooks are traced and record through ``vllm_parity::tap``; terms that
    are None at trace time (layer 0's residual) ride as ``Tensor?[]``.  Inductor may reuse the
    op's inputs for later kernels: the copy happens in the op's body."""
    torch.manual_seed(0)
    model, x = Toy(), torch.randn(5, 4)
    ext = _ext(model, READS + [["layers.0", "in.hidden_states+in.residual"]])
    with torch.inference_mode():
        model(x)
    eager = _records(ext)
    ext.vp_reset()
    for handle in ext._vp_handles[-2:]:  # the timing hooks sit on vLLM's uncompiled top module
        handle.remove()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    with torch.inference_mode():
        compiled(x)
    got = _records(ext)
    assert got.keys() == eager.keys()
    for key in eager:
        # inductor may fuse the model's own arithmetic differently; the capture path itself adds no error
        assert torch.allclose(got[key][0], eager[key][0], rtol=1e-6, atol=1e-6), key


def test_sum_terms_is_bitwise_the_clone_then_add_it_replaces():
    torch.manual_seed(0)
    a, b, c = (torch.randn(7, 5) for _ in range(3))
    assert torch.equal(sum_terms([a, None, b], "r"), a.clone() + b)
    assert torch.equal(sum_terms([a, b, c], "r"), (a.clone() + b) + c)
    assert torch.equal(sum_terms([a.t()], "r"), a.t())  # a strided term is copied by value
    half = b.to(torch.bfloat16)
    assert torch.equal(sum_terms([a, half], "r"), a + half)  # promotion: torch's own rule
    with pytest.raises(RuntimeError, match="every term was None"):
        sum_terms([None], "r")
