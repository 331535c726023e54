"""vLLM's CUDA encoder attention kernel alone, in fp32, against an fp64 reference: is its error Triton's fp32 dot
precision (TRITON_F32_DEFAULT), and does Triton's on-disk cache keep a kernel compiled under another setting?

Run on a CUDA host with vLLM installed (docs/gpu/README.md), one process per setting (Triton reads the variable
when it compiles):

    TRITON_F32_DEFAULT=ieee TRITON_CACHE_DIR=/tmp/tc_a python3 docs/gpu/probe_encoder_attention.py
    TRITON_F32_DEFAULT=tf32 TRITON_CACHE_DIR=/tmp/tc_b python3 docs/gpu/probe_encoder_attention.py

It calls ``vllm.v1.attention.ops.triton_prefill_attention.context_attention_fwd`` (the kernel vLLM 0.20.2's
TritonAttention runs for encoder-only attention) as that backend calls it: bidirectional, one sequence of 248
tokens (the harness's long prompt), 4 heads of 32 (the modernbert row), global (no window). It prints the worst
row's relative error (the harness's metric: ||out - ref|| / ||ref|| per (token, head) row) and a digest of the
output bits, so two settings that ran the same kernel print the same digest.
"""
from __future__ import annotations

import hashlib
import json
import os

import torch

from vllm.v1.attention.ops.triton_prefill_attention import context_attention_fwd


def main() -> None:
    torch.manual_seed(0)
    T, H, D = 248, 4, 32
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.float32) for _ in range(3))
    out = torch.empty_like(q)
    scale = D ** -0.5
    context_attention_fwd(q, k, v, out, torch.tensor([0], device="cuda", dtype=torch.int32),
                          torch.tensor([T], device="cuda", dtype=torch.int32), T, is_causal=False,
                          softmax_scale=scale)
    torch.cuda.synchronize()
    q64, k64, v64 = (t.double().transpose(0, 1) for t in (q, k, v))
    ref = torch.softmax(q64 @ k64.transpose(-1, -2) * scale, dim=-1) @ v64
    ref = ref.transpose(0, 1)
    rel = ((out.double() - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
    print(json.dumps({"TRITON_F32_DEFAULT": os.environ.get("TRITON_F32_DEFAULT", "(unset)"),
                      "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR", "(default)"),
                      "worst_row_rel_err": rel,
                      "out_sha256": hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest()[:16]}))


if __name__ == "__main__":
    main()
