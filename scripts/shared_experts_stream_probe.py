"""Does vLLM's shared-expert side stream change what a MoE model serves?  No capture hooks involved.

Usage (CUDA host, vLLM on the path)::

    python scripts/shared_experts_stream_probe.py [--model nemotron_h_moe] [--dtype bfloat16]

vLLM (0.20.2, ``fused_moe/runner/shared_experts.py``) runs a MoE layer's shared expert on a second CUDA stream when a
step has at most ``VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`` (256) tokens, and on the main stream otherwise or when
``VLLM_DISABLE_SHARED_EXPERTS_STREAM=1``.  This boots the family's synthetic checkpoint three times, each in its own
process with every vLLM plugin off (``VLLM_PLUGINS=""``: not this harness's capture hooks either), eager: side stream
on, off, and on again.  Each of the harness's prompts (harness/models/prompts.py: 7 to 248 tokens, all under the
threshold) is sent alone, and vLLM's log-probability of every prompt token is kept.  The parent computes the same in
HF transformers, float32 and the run's dtype, on the same GPU.  One JSON line per (run, prompt): the largest and median
absolute log-prob difference against HF float32 and against the first side-stream run.

Contract: a diagnosis tool, not a test; it reads what vLLM returns to a user.  Traps: a difference between the two
side-stream runs means the result is not deterministic (a race), one between side stream on and off with the two on
runs equal means the side stream computes something else; HF's bf16 against its float32 is the scale of rounding.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RUNS = (("side-stream", {}), ("main-stream", {"VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1"}), ("side-stream-again", {}))


def _prompts(target):
    from harness.models.prompts import default_prompts
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(target.checkpoint))
    return default_prompts(int(cfg.vocab_size), getattr(cfg, "bos_token_id", None))


def _serve(model: str, dtype: str) -> None:
    """Child: vLLM's log-prob of each prompt token, each prompt alone; one JSON object on stdout's last line."""
    from harness.models.targets import targets_from_options

    target = targets_from_options(model, None)[0]
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(target.checkpoint), dtype=dtype, max_model_len=256, seed=0, enforce_eager=True,
              gpu_memory_utilization=0.2, enable_prefix_caching=False)
    out = {}
    for name, ids in _prompts(target).items():
        got = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
        out[name] = [None] + [float(pos[tok].logprob) for pos, tok in zip(got.prompt_logprobs[1:], ids[1:])]
    print(json.dumps(out))


def _hf(target, dtype):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(target.checkpoint), dtype=getattr(torch, dtype)).cuda().eval()
    out = {}
    with torch.no_grad():
        for name, ids in _prompts(target).items():
            t = torch.tensor([ids], device="cuda")
            lp = m(t).logits.float().log_softmax(-1)[0, :-1].gather(-1, t[0, 1:, None])[:, 0]
            out[name] = [None] + lp.cpu().tolist()
    del m
    torch.cuda.empty_cache()
    return out


def _diff(a: list, b: list) -> dict:
    import torch

    d = (torch.tensor(a[1:]) - torch.tensor(b[1:])).abs()
    return {"max_abs": round(float(d.max()), 5), "median_abs": round(float(d.median()), 5)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nemotron_h_moe")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        _serve(args.model, args.dtype)
        return 0
    from harness.models.targets import targets_from_options

    target = targets_from_options(args.model, None)[0]
    served = {}
    for run, env in RUNS:
        proc = subprocess.run([sys.executable, __file__, "--serve", "--model", args.model, "--dtype", args.dtype],
                              env={**os.environ, "VLLM_PLUGINS": "", **env}, capture_output=True, text=True)
        if proc.returncode:
            print(json.dumps({"run": run, "error": proc.stderr[-2000:]}))
            return 1
        served[run] = json.loads(proc.stdout.strip().splitlines()[-1])
    hf32, hf_low = _hf(target, "float32"), _hf(target, args.dtype)
    for name in hf32:
        print(json.dumps({"run": f"hf-{args.dtype}", "prompt": name, "tokens": len(hf32[name]),
                          "vs_hf_float32": _diff(hf_low[name], hf32[name])}))
        for run, _ in RUNS:
            print(json.dumps({"run": run, "prompt": name, "tokens": len(hf32[name]),
                              "vs_hf_float32": _diff(served[run][name], hf32[name]),
                              "vs_side-stream": _diff(served[run][name], served["side-stream"][name])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
