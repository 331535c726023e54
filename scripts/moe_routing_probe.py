"""Where does vLLM's expert choice leave the router's own logits?  A probe of one MoE family on one device.

Usage (CUDA host, vLLM on the path, the harness's vLLM plugin registered: docs/gpu/register_plugin.sh)::

    python scripts/moe_routing_probe.py --model mixtral --dtype bfloat16 --mode eager|compiled-nographs|compiled \
        [--with-reads]

Boots the family's synthetic checkpoint in-process (harness.models.targets), wraps vLLM's
``BaseRouter.select_experts`` at class level before the engine is built, and on every call where Python runs
(eager; compiled without CUDA graphs; under graphs only the captures) records the router logits' shape,
strides, contiguity and dtype, and whether the returned expert ids equal the top-k of ``softmax(logits)``
computed from a contiguous float32 copy of the same logits (as sets per token); and wraps the MoE runner's
``_forward_impl`` to compare its output with the experts computed in float32 in Python from the same hidden states,
router logits and expert weights (softmax top-k, renormalized where the layer says so; SwiGLU experts, Mixtral's).
Prints one JSON line per distinct (shape, strides, contiguous) of the router logits (calls, tokens whose choice
differs) and of the MoE input (calls, worst relative error of the output), then each prompt's greedy tokens.

Contract: a diagnosis tool, not a test; it reads vLLM's router API of the 0.20 line (``select_experts(
hidden_states, router_logits)`` returning ``(topk_weights, topk_ids)``).  Trap: a near-tie can flip one token's
choice legitimately; a mismatch on many tokens of many calls is not a near-tie.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mixtral")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--mode", default="compiled-nographs", choices=("eager", "compiled-nographs", "compiled"))
    ap.add_argument("--with-reads", action="store_true",
                    help="install the harness's hooks for every hook the overlay offers before vLLM compiles (the "
                         "suite's way: harness.engines.vllm_plugin), recording nothing: does their presence change "
                         "what the compiled graph computes?")
    ap.add_argument("--reads-match", default="", help="with --with-reads: only reads whose module path matches "
                    "this regular expression (re.search)")
    ap.add_argument("--reads-skip", default="", help="with --with-reads: leave out reads whose module path matches")
    ap.add_argument("--inductor", default="", help="JSON object passed as compilation_config's "
                    "inductor_compile_config (e.g. '{\"shape_padding\": false}')")
    ap.add_argument("--gpu-memory", type=float, default=0.3)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    from harness.models.targets import targets_from_options

    target = targets_from_options(args.model, None)[0]
    from vllm import LLM, SamplingParams
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

    seen: dict = defaultdict(lambda: {"calls": 0, "tokens": 0, "differ": 0})
    original = BaseRouter.select_experts

    def select_experts(self, hidden_states, router_logits, **kw):
        weights, ids = original(self, hidden_states, router_logits, **kw)
        if not torch.cuda.is_current_stream_capturing():
            k = ids.shape[-1]
            want = torch.softmax(router_logits.float().contiguous(), -1).topk(k, -1).indices.sort(-1).values
            got = ids.long().sort(-1).values
            key = (tuple(router_logits.shape), tuple(router_logits.stride()), router_logits.is_contiguous(),
                   str(router_logits.dtype), type(self).__name__)
            row = seen[key]
            row["calls"] += 1
            row["tokens"] += int(ids.shape[0])
            row["differ"] += int((want != got).any(-1).sum())
        return weights, ids

    BaseRouter.select_experts = select_experts

    from vllm.model_executor.layers.fused_moe.runner import moe_runner as runner_mod

    runner_cls = next(c for c in vars(runner_mod).values() if isinstance(c, type) and "_forward_impl" in vars(c))
    forward_impl = runner_cls._forward_impl
    moe: dict = defaultdict(lambda: {"calls": 0, "worst_rel": 0.0})

    def checked(self, layer, hidden_states, router_logits, *rest, **kw):
        out = forward_impl(self, layer, hidden_states, router_logits, *rest, **kw)
        if not torch.cuda.is_current_stream_capturing() and torch.is_tensor(out):
            x, logits = hidden_states.float(), router_logits.float()
            k = int(layer.top_k)
            w, ids = torch.softmax(logits, -1).topk(k, -1)
            if getattr(layer, "renormalize", True):
                w = w / w.sum(-1, keepdim=True)
            w13, w2 = layer.w13_weight.float(), layer.w2_weight.float()
            ref = torch.zeros_like(x)
            for e in range(w13.shape[0]):
                rows, slot = (ids == e).nonzero(as_tuple=True)
                if rows.numel():
                    gate, up = (x[rows] @ w13[e].T).chunk(2, -1)
                    ref.index_add_(0, rows, (torch.nn.functional.silu(gate) * up) @ w2[e].T * w[rows, slot, None])
            rel = float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))
            key = (tuple(hidden_states.shape), tuple(hidden_states.stride()), hidden_states.is_contiguous())
            row = moe[key]
            row["calls"] += 1
            row["worst_rel"] = max(row["worst_rel"], rel)
        return out

    runner_cls._forward_impl = checked
    kw = {"enforce_eager": True} if args.mode == "eager" else {}
    if args.with_reads:
        import tempfile

        from harness.engines.boot import CAPTURE_EXTENSION
        from harness.engines.vllm_plugin import ENV

        specs = target.overlay.hook_specs(target.hf_config)
        import re

        reads = sorted({(s.module, s.read) for s in specs.values()
                        if (not args.reads_match or re.search(args.reads_match, s.module))
                        and not (args.reads_skip and re.search(args.reads_skip, s.module))})
        print(json.dumps({"mode": args.mode, "reads": len(reads), "modules": sorted({m for m, _ in reads})[:12]}))
        path = os.path.join(tempfile.mkdtemp(prefix="probe_reads_"), "reads.json")
        with open(path, "w") as f:
            json.dump([list(r) for r in reads], f)
        os.environ[ENV] = path
        kw["worker_extension_cls"] = CAPTURE_EXTENSION
    if args.mode == "compiled-nographs":
        kw["compilation_config"] = {"cudagraph_mode": "NONE"}
    if args.inductor:
        kw["compilation_config"] = {**kw.get("compilation_config", {}),
                                    "inductor_compile_config": json.loads(args.inductor)}
    llm = LLM(model=str(target.checkpoint), dtype=args.dtype, max_model_len=256, seed=0,
              gpu_memory_utilization=args.gpu_memory, **kw)
    prompts = [{"prompt_token_ids": [1] + list(range(4, 4 + n))} for n in (6, 15, 247)]
    out = llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, logprobs=1))
    for key, row in seen.items():
        print(json.dumps({"mode": args.mode, "shape": key[0], "stride": key[1], "contiguous": key[2],
                          "dtype": key[3], "router": key[4], **row}))
    for key, row in moe.items():
        print(json.dumps({"mode": args.mode, "moe_input_shape": key[0], "stride": key[1], "contiguous": key[2], **row}))
    print(json.dumps({"mode": args.mode, "tokens": [list(o.outputs[0].token_ids) for o in out]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
