"""The vLLM subject, run as its own process: ``python -m harness.subject_vllm REQUEST.json``.

Contract: reads a request (checkpoint, dtype, prompts as token ids, the
``[module, read]`` pairs to record, parameter names to export), boots one vLLM
engine, and writes into the request's ``out_dir``:

* ``raw.safetensors``      -- ``"{prompt}:{module}|{read}#{call}" -> tensor``;
* ``params.safetensors``   -- the parameters the host-side conversions need;
* ``logprobs.safetensors`` -- ``"{prompt}" -> [T, V]`` log-probs: row ``t`` is
  vLLM's distribution after token ``t`` (prompt log-probs for rows < T-1, the
  sampler's log-probs for the last row); entries vLLM did not return are NaN;
* ``meta.json``            -- versions, boot time, forward latency, top kernels,
  call counts, missing modules.

One process per model: vLLM keeps process-global state, and a crash here
costs this model only.  The engine core stays in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the profiler sees the forward.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path


def _env_defaults() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # A compiled graph cached without our hooks must never be reused.
    os.environ.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _logprob_matrix(out, vocab: int, n_tokens: int):
    import torch

    mat = torch.full((n_tokens, vocab), float("nan"), dtype=torch.float64)
    rows = list(out.prompt_logprobs or [])[1:] + [out.outputs[0].logprobs[0]]
    for t, row in enumerate(rows):
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


def main(request_path: str) -> int:
    _env_defaults()
    req = json.loads(Path(request_path).read_text())
    out_dir = Path(req["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    from safetensors.torch import load_file, save_file

    t_import = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams

    meta: dict = {"vllm_version": vllm.__version__, "torch_version": torch.__version__,
                  "import_s": time.perf_counter() - t_import}
    # Hooks go in before vLLM compiles the model (harness.vllm_plugin), in every mode.
    reads_path = out_dir / "reads.json"
    reads_path.write_text(json.dumps(req["reads"]))
    os.environ["VLLM_PARITY_READS"] = str(reads_path)
    t_boot = time.perf_counter()
    llm = LLM(
        model=req["checkpoint"],
        dtype=req["dtype"],
        enforce_eager=req.get("enforce_eager", True),
        worker_extension_cls="harness.vllm_worker.CaptureExtension",
        max_model_len=req["max_model_len"],
        max_logprobs=-1,
        seed=0,
        tensor_parallel_size=req.get("tp", 1),
        enable_prefix_caching=False,  # a cached prefix would skip the hooks for those tokens
        skip_tokenizer_init=False,
    )
    meta["boot_s"] = time.perf_counter() - t_boot
    meta["device_info"] = _device_info()
    meta["missing_modules"] = llm.collective_rpc("vp_missing")[0]
    if meta["missing_modules"] is None:
        raise RuntimeError("capture hooks were not installed before compilation: the vllm_parity "
                           "vllm.general_plugins entry point did not run; reinstall with `pip install -e .`")
    meta["enforce_eager"] = req.get("enforce_eager", True)
    meta["missing_params"] = llm.collective_rpc(
        "vp_dump_params", args=(req["params"], str(out_dir / "params.safetensors")))[0]

    vocab = int(req["vocab_size"])
    k = -1 if req.get("full_logprobs", True) else 20
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, logprobs=k, detokenize=False)

    raw, logprobs, calls = {}, {}, {}
    for p, tokens in enumerate(req["prompts"]):
        llm.collective_rpc("vp_reset")
        out = llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)[0]
        dump = llm.collective_rpc("vp_dump", args=(str(out_dir / f"raw{p}.safetensors"),))[0]
        if len(dump["forward_s"]) != 1:
            raise RuntimeError(f"prompt {p}: expected one model forward, saw {len(dump['forward_s'])}")
        for key, tensor in load_file(dump["path"]).items():
            raw[f"{p}:{key}"] = tensor
        os.remove(dump["path"])
        calls[p] = dump["calls"]
        logprobs[str(p)] = _logprob_matrix(out, vocab, len(tokens))
    if req.get("ragged") and len(req["prompts"]) > 1:
        # All prompts in one generate call: vLLM flattens them into one forward
        # (or several, under chunked prefill); the layout says which rows are whose.
        llm.collective_rpc("vp_reset")
        batch = [{"prompt_token_ids": t} for t in req["prompts"]]
        llm.generate(batch, SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), use_tqdm=False)
        dump = llm.collective_rpc("vp_dump", args=(str(out_dir / "ragged.safetensors"),))[0]
        for key, tensor in load_file(dump["path"]).items():
            raw[f"ragged:{key}"] = tensor
        os.remove(dump["path"])
        meta["ragged_batches"] = dump["batches"]
    save_file(raw, str(out_dir / "raw.safetensors"))
    save_file(logprobs, str(out_dir / "logprobs.safetensors"))
    meta["calls"] = calls

    # Timing: forward latency with capture off, then one profiled forward.
    tokens = req["prompts"][0]
    plain = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    llm.collective_rpc("vp_set_enabled", args=(False,))
    llm.collective_rpc("vp_reset")
    for _ in range(int(req.get("timing_repeats", 5))):
        llm.generate([{"prompt_token_ids": tokens}], plain, use_tqdm=False)
    fwd = llm.collective_rpc("vp_dump", args=(str(out_dir / "timing.safetensors"),))[0]["forward_s"]
    os.remove(out_dir / "timing.safetensors")
    meta["forward_ms_median"] = statistics.median(fwd) * 1e3 if fwd else math.nan
    meta["forward_ms_all"] = [f * 1e3 for f in fwd]
    llm.collective_rpc("vp_profile", args=("start",))
    llm.generate([{"prompt_token_ids": tokens}], plain, use_tqdm=False)
    meta["top_ops"] = llm.collective_rpc("vp_profile", args=("stop",))[0]
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
