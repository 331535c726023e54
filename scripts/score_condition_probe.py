"""How well-conditioned is one attention score?  HF's own value of q_i . k_j * scale in the run dtype, fp32 and fp64.

Usage (CPU, the project's venv)::

    python scripts/score_condition_probe.py CHECKPOINT --layer 3 --prompt-from REPORT.json --prompt 3 \
        [--query 0 --key 0]

Loads the checkpoint with HF in bfloat16 (its weights rounded to bf16), then runs it in bfloat16, float32 and float64
on the prompt's token ids (``REPORT.json``: a parity report, its ``prompts``), captures layer ``--layer``'s rotated q
and k (transformers' ``apply_rotary_pos_emb`` of that model's module, wrapped while the layer runs) and prints, per
head, the score at (query, key), ``|q| |k| scale`` and their ratio: the score's condition number.  A bf16 relative
error of ``e`` on q and k moves a score by up to about ``e`` times ``|q| |k| scale``; where that ratio is large, the
score's own relative error between two correct bf16 implementations is large too.

Contract: a diagnosis tool, not a test.  Trap: the model's module must call ``apply_rotary_pos_emb`` by its module-level
name (transformers 5's Qwen3-Next, Llama-likes do); a model that does not is refused by name.
"""
from __future__ import annotations

import argparse
import importlib
import json

import torch


def rotated_qk(model, layer: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    module = importlib.import_module(type(model).__module__)
    if not hasattr(module, "apply_rotary_pos_emb"):
        raise SystemExit(f"score_condition_probe: {module.__name__} has no apply_rotary_pos_emb to wrap")
    original, seen = module.apply_rotary_pos_emb, []
    attn = model.model.layers[layer].self_attn

    def wrapped(q, k, *args, **kwargs):
        rq, rk = original(q, k, *args, **kwargs)
        if inside:
            seen.append((rq.detach().double(), rk.detach().double()))
        return rq, rk

    inside = False

    def enter(*_):
        nonlocal inside
        inside = True

    def leave(*_):
        nonlocal inside
        inside = False

    module.apply_rotary_pos_emb = wrapped
    handles = [attn.register_forward_pre_hook(enter), attn.register_forward_hook(leave)]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        module.apply_rotary_pos_emb = original
        for h in handles:
            h.remove()
    if not seen:
        raise SystemExit(f"score_condition_probe: layer {layer} called no apply_rotary_pos_emb")
    return seen[0]


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--layer", type=int, required=True)
    ap.add_argument("--prompt-from", required=True, help="a parity report (JSON): its prompts' token ids")
    ap.add_argument("--prompt", type=int, default=0)
    ap.add_argument("--query", type=int, default=0)
    ap.add_argument("--key", type=int, default=0)
    args = ap.parse_args(argv)
    ids = torch.tensor([json.load(open(args.prompt_from))["prompts"][args.prompt]])
    values = {}
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.bfloat16).to(dtype).eval()
        if dtype == torch.float64 and hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")  # HF's grouped experts take no float64
        q, k = rotated_qk(model, args.layer, ids)
        values[dtype] = (q, k, model.model.layers[args.layer].self_attn.scaling)
    for dtype, (q, k, scale) in values.items():
        heads, kv_heads = q.shape[1], k.shape[1]
        for h in range(heads):
            qi, kj = q[0, h, args.query], k[0, h // (heads // kv_heads), args.key]
            score, bound = float(qi @ kj * scale), float(qi.norm() * kj.norm() * scale)
            print(f"{str(dtype)[6:]} head {h}: score {score:.5f}  |q||k| scale {bound:.4f}  condition "
                  f"{bound / abs(score):.1f}")
    (qb, kb, _), (qt, kt, _) = values[torch.bfloat16], values[torch.float64]
    print(f"bf16 vs fp64, query {args.query} / key {args.key}, every head: q rel err "
          f"{float((qb[0, :, args.query] - qt[0, :, args.query]).norm() / qt[0, :, args.query].norm()):.4f}, "
          f"k rel err {float((kb[0, :, args.key] - kt[0, :, args.key]).norm() / kt[0, :, args.key].norm()):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
