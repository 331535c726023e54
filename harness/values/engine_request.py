"""A run's engine request, built once from what the run is: the target, the variant, the plan, the prompts.

Contract: :func:`run_request(target, variant, plan, prompts)` is the
:class:`~harness.engines.engine_request.EngineRequest` (re-exported here) a run's subject is launched with
(harness.pipeline.runner); :func:`boot_request(target, variant)` is its part that needs no plan -- the
checkpoint and how vLLM runs it -- which the refusal probe derives its two-token boot from
(harness.pipeline.refusals) before any plan exists.  Anything else that boots an engine for a run
(a GGUF file's run, harness.quantized.gguf_parity) takes one of these and changes what differs with
``dataclasses.replace``.  What each field means and how it crosses into the engine process:
harness.engines.engine_request.

The plan decides the subject's group of fields (its specs are the subject's: harness.values.plan):
the default subject's reads, parameters, token dims and folded heads; any other subject's, its registry row's
``request`` function (harness.engines.subjects: TransformerLens's backend's hook -> raw key, vLLM's
hidden-state export's layer ids, vllm-lens's layers).  An encoder's plan adds its pooling task and token types.

Traps:

- ``full_logprobs`` follows the vocabulary (harness.logprob_request): a large one gets the top-k rows only,
  and its references measure the floor on the same entries.
- ``llm_overrides`` here are the MLA backend's (harness.engines.mla_backends: none for a model without
  MLA); a caller that needs other ``LLM(...)`` arguments replaces them whole (the GGUF run does).
- ``row_dims`` name only reads whose token dim is not 0 (``[1, T, ...]`` reads of vLLM's Transformers
  backend): the engine's stitcher takes 0 for every other.
- ``flat_rows`` name only reads some vLLM line passes with heads folded into the token rows (``HookSpec.flat_rows``:
  qwen3_next's gated-norm inputs on vLLM 0.20.2 CUDA, ``[T x heads, d]``): the serving stitcher cuts their rows in
  units of the heads, so a prompt's rows are whole tokens; where the line passes ``[T, heads, d]`` it cuts as usual.
"""
from __future__ import annotations

from dataclasses import replace

from harness.engines import mla_backends
from harness.engines.engine_request import EngineRequest, Pooling
from harness.engines.subjects import SUBJECTS
from harness.logprob_request import logprob_k
from harness.models.targets import Target
from harness.values.plan import Plan
from harness.values.variant import Variant


def boot_request(target: Target, variant: Variant) -> EngineRequest:
    """``target`` under ``variant``, before a plan: no prompts, nothing recorded."""
    return EngineRequest(
        checkpoint=str(target.checkpoint), dtype=variant.dtype, prompts=(), vocab_size=target.vocab_size,
        max_model_len=target.max_model_len, device=variant.device, enforce_eager=not variant.compiled,
        tp=variant.tp, executor=variant.executor, serving=variant.serving,
        full_logprobs=logprob_k(target.vocab_size) is None,
        llm_overrides=mla_backends.llm_overrides(target.hf_config, variant.mla_backend))


def run_request(target: Target, variant: Variant, plan: Plan, prompts: list[list[int]]) -> EngineRequest:
    """The request of the run of ``plan`` (built for ``variant``'s subject) on ``prompts``."""
    request = replace(boot_request(target, variant), prompts=prompts, pooling=pooling(plan, prompts, target))
    if plan.encoder is not None and plan.encoder.output == "hidden":
        # served as an embedding model (overlays.base.Encoder.output): its default task is the pooled "embed", and
        # vLLM's pooling runner then builds its scoring IO processor, which reads the tokenizer's pad id
        # (vllm/entrypoints/pooling/scoring/io_processor.py: "Tokenizer not available when `skip_tokenizer_init=True`")
        request = replace(request, llm_overrides={**request.llm_overrides, "skip_tokenizer_init": False,
                                                  "pooler_config": {"task": plan.encoder.pooling_task}})
    subject_request = SUBJECTS[variant.subject].request_fn()  # harness.engines.subjects; None: the overlay's reads
    if subject_request is not None:
        return subject_request(request, plan.specs)
    # each read and its unfused alternative (overlays.base.HookSpec.unfused): the plan keeps the one the tree has
    specs = [r for s in plan.specs.values() for r in s.engine_reads()]
    return replace(request, reads=[(s.module, s.read) for s in specs], params=[p for s in specs for p in s.params()],
                   row_dims={s.raw_key: s.raw_token_dim for s in specs if s.raw_token_dim},
                   flat_rows={s.raw_key: s.flat_rows for s in specs if s.flat_rows})


def pooling(plan: Plan, prompts: list[list[int]], target: Target | None = None) -> Pooling | None:
    """An encoder's engine inputs (overlays.base.Encoder): vLLM's pooling task and each prompt's token types
    (and, where ``encode`` returns the last hidden state, its width: ``target``'s hidden size); None for a causal
    LM, whose engine runs ``generate``."""
    if plan.encoder is None:
        return None
    width = (int(target.hf_config.hidden_size) if plan.encoder.output == "hidden" and target is not None else None)
    return Pooling(task=plan.encoder.pooling_task, token_types=plan.token_types(prompts), width=width)


__all__ = ["EngineRequest", "Pooling", "boot_request", "pooling", "run_request"]
