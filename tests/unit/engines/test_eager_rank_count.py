"""harness.engines.vllm_compat.eager_rank_count: vLLM's sampler counts ranks eagerly on the CPU, the same integers."""
import math

import pytest
import torch

pytest.importorskip("vllm")


def test_the_eager_count_is_vllms_own_body_on_ties_and_infinities():
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than

    from harness.engines.vllm_compat import _count_at_least

    vllms = getattr(batched_count_greater_than, "_torchdynamo_orig_callable", None)
    assert vllms is not None, "vLLM's batched_count_greater_than is no longer a torch.compile'd function"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 1000, generator=g).log_softmax(-1)
    x[0, :10] = -math.inf
    x[1, 5] = x[1, 6] = x[1, 7]  # ties count as "at least"
    values = torch.stack([x[0, 3], x[1, 7], *x[2:, 0]]).unsqueeze(-1)
    assert torch.equal(_count_at_least(x, values), vllms(x, values))
    assert _count_at_least(x, values)[1] >= 3


def test_it_replaces_the_samplers_function_on_the_cpu_only(monkeypatch):
    import vllm.v1.sample.sampler as sampler

    from harness.engines.vllm_compat import _count_at_least, eager_rank_count

    monkeypatch.setattr(sampler, "batched_count_greater_than", sampler.batched_count_greater_than)
    original = sampler.batched_count_greater_than
    assert eager_rank_count("cuda") is False and sampler.batched_count_greater_than is original
    assert eager_rank_count("cpu") is True and sampler.batched_count_greater_than is _count_at_least
