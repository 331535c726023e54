"""What does vLLM's Nemotron-H MoE layer compute, against the same layer computed in float32 from its own weights?

Usage (CUDA host, vLLM on the path)::

    python scripts/nemotron_moe_probe.py [--model nemotron_h_moe] [--dtype bfloat16|float32]

Boots the family's synthetic checkpoint in-process (eager), wraps vLLM's ``NemotronHMoE.forward`` at class level
before the engine is built, and takes the layer's input and output on every prefill.  From the module's own tensors
(router weight and its fp32 ``e_score_correction_bias``, the experts' ``w13_weight`` / ``w2_weight``, the shared
expert's ``up_proj`` / ``down_proj``) it computes in float32 what HF's ``NemotronHMoE`` computes: sigmoid scores,
top-k by score plus bias, weights renormalized and scaled by ``routed_scaling_factor``, relu² experts, plus the shared
expert (checked against HF's module on the CPU: 6e-8).  Each prompt length of :data:`LENGTHS` runs alone, then some
together; one JSON line per (layer, tokens in the step): the worst and median row's relative error against that
reference, and the error against the reference without the routed scale (a scale applied twice or not at all shows
there).

Contract: a diagnosis tool, not a test.  Traps: the reference is computed from vLLM's own input to the layer, so an
error here is the layer's, not the layers before it; each new token count may compile another Triton MoE kernel
(docs/gpu/evidence/breadth-2026-12-05: the first single prompt had not returned within about 90 s), so give it time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _reference(mod, x):
    """(total, routed, routed_unscaled, shared, ids) in float32 from the module's own tensors."""
    import torch

    xf = x.float()
    logits = xf @ mod.gate.weight.float().T
    scores = logits.sigmoid()
    k = int(mod.experts.top_k)
    ids = (scores + mod.gate.e_score_correction_bias.float()).topk(k, -1).indices
    w = scores.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w13, w2 = mod.experts.w13_weight.float(), mod.experts.w2_weight.float()
    routed = torch.zeros_like(xf)
    for e in range(w13.shape[0]):
        rows, slot = (ids == e).nonzero(as_tuple=True)
        if rows.numel():
            h = torch.relu(xf[rows] @ w13[e].T) ** 2
            routed.index_add_(0, rows, (h @ w2[e].T) * w[rows, slot, None])
    shared = torch.zeros_like(xf)
    if mod.shared_experts is not None:
        se = mod.shared_experts
        shared = (torch.relu(xf @ se.up_proj.weight.float().T) ** 2) @ se.down_proj.weight.float().T
    rsf = float(mod.routed_scaling_factor)
    return shared + rsf * routed, rsf * routed, routed, shared, ids, logits


LENGTHS = (7, 16, 29, 33, 64, 65, 100, 248)  # tokens per prompt, each prompt alone; then some together


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nemotron_h_moe")
    ap.add_argument("--dtype", default="bfloat16",
                    help="float32 or bfloat16, one per process (a second in-process engine is not built cleanly)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")
    from harness.models.targets import targets_from_options

    target = targets_from_options(args.model, None)[0]
    from vllm import LLM, SamplingParams
    from vllm.model_executor.models import nemotron_h

    calls: list = []
    original = nemotron_h.NemotronHMoE.forward

    def forward(self, hidden_states):
        out = original(self, hidden_states)
        calls.append((self, hidden_states.detach().clone(), out.detach().clone()))
        return out

    nemotron_h.NemotronHMoE.forward = forward
    dtype = args.dtype
    llm = LLM(model=str(target.checkpoint), dtype=dtype, max_model_len=256, seed=0, enforce_eager=True,
              gpu_memory_utilization=0.2, enable_prefix_caching=False)
    calls.clear()  # the boot's dummy and warm-up runs
    rows: dict = {}
    for lengths in [(n,) for n in LENGTHS] + [LENGTHS[:5], (248, 52)]:
        calls.clear()
        llm.generate([{"prompt_token_ids": [1] + list(range(4, 3 + n))} for n in lengths],
                     SamplingParams(max_tokens=1, temperature=0.0))
        for mod, x, out in calls:
            if x.shape[0] == len(lengths):
                continue  # the decode step after the prefill
            total, routed, unscaled, shared, ids, logits = _reference(mod, x)
            per_row = ((out.float() - total).norm(dim=-1) / total.norm(dim=-1).clamp_min(1e-30))
            key = (getattr(mod.experts, "layer_name", str(id(mod))), int(x.shape[0]))
            row = rows.setdefault(key, {"dtype": dtype, "layer": key[0], "tokens": key[1], "prompts": list(lengths)})
            row["rel_worst_row"] = max(row.get("rel_worst_row", 0.0), float(per_row.max()))
            row["rel_median_row"] = max(row.get("rel_median_row", 0.0), float(per_row.median()))
            row["vs_routed_only"] = _rel(out, routed)
            row["vs_shared_plus_unscaled_routed"] = _rel(out, shared + unscaled)
    for row in rows.values():
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
