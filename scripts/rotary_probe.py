"""Does vLLM's rotary kernel on this device rotate a family's q / k as its PyTorch-native path does?

Usage (a host with vLLM on the path)::

    python scripts/rotary_probe.py --model minimax_m2 [--dtype float32] [--tokens 248]

Builds ``get_rope`` from the family's config as vLLM's model code does (head_dim, the config's ``rope_parameters``,
``partial_rotary_factor`` from ``rotary_dim`` where the config has one, NeoX style), feeds one random q / k of
``[tokens, heads x head_dim]`` at positions 0 .. tokens-1 through the device's path (``forward_cuda`` on a GPU,
``forward_cpu`` on a CPU) and through ``forward_native``, and prints the relative error of each, per head, plus the
first position where they part.

Contract: a diagnosis tool, not a test; nothing of the harness's capture is involved (no engine boots).
Trap: the device path rotates in place, so each path gets its own clone of the inputs.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="a family of harness/models/families.py")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=248)
    args = ap.parse_args()
    import torch
    from transformers import AutoConfig
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from harness.models.checkpoints import checkpoint_dir
    from harness.models.families import FAMILIES

    cfg = AutoConfig.from_pretrained(checkpoint_dir(FAMILIES[args.model]))
    head_dim = cfg.head_dim
    rope = dict(cfg.rope_parameters)
    if getattr(cfg, "rotary_dim", None) and "partial_rotary_factor" not in rope:
        rope["partial_rotary_factor"] = cfg.rotary_dim / head_dim
    dtype = getattr(torch, args.dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        torch.set_default_dtype(dtype)
        emb = get_rope(head_dim, max_position=cfg.max_position_embeddings, rope_parameters=rope).to(device)
        torch.set_default_dtype(torch.float32)
    t, hq, hk = args.tokens, cfg.num_attention_heads, cfg.num_key_value_heads
    pos = torch.arange(t, device=device)
    q = torch.randn(t, hq * head_dim, device=device, dtype=dtype)
    k = torch.randn(t, hk * head_dim, device=device, dtype=dtype)
    fast = emb.forward_cuda if device == "cuda" else emb.forward_cpu
    qd, kd = fast(pos, q.clone(), k.clone())
    qn, kn = emb.forward_native(pos, q.clone(), k.clone())
    print(f"{args.model}: head_dim {head_dim}, rotary_dim {emb.rotary_dim}, neox {emb.is_neox_style}, "
          f"cache {tuple(emb.cos_sin_cache.shape)} {emb.cos_sin_cache.dtype}, {type(emb).__name__}, {device}")
    for name, a, b, heads in (("q", qd, qn, hq), ("k", kd, kn, hk)):
        a, b = a.float().view(t, heads, head_dim), b.float().view(t, heads, head_dim)
        rel = ((a - b).norm(dim=-1) / b.norm(dim=-1))
        bad = (rel > 1e-3).any(dim=-1).nonzero()
        print(f"  {name}: worst rel {rel.max().item():.3e}, median {rel.median().item():.3e}, first position off "
              f"{bad[0].item() if len(bad) else None}; rotated dims differ: "
              f"{(a - b)[..., :emb.rotary_dim].abs().max().item():.3e}, pass dims: "
              f"{(a - b)[..., emb.rotary_dim:].abs().max().item():.3e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
