"""Run a family's architecture on checkpoints of other shapes, as a user's own would be, via ``--model-path``.

``python scripts/odd_shapes.py [FAMILY ...] [--dtype float32,bfloat16] [--out DIR]``

Each family row (harness/models/families.py) is rebuilt with the overrides below -- other head counts, KV
groupings, widths, windows, multipliers, expert counts -- as a checkpoint under ``DIR/checkpoints`` (every
parameter randomized, like the rows), then run exactly as a user's checkpoint is run:
``python -m harness run --model-path <dir> --dtype ...``.  The overlay is found from the checkpoint's
``config.json`` alone, so a shape the row's overlay reads wrongly (a width taken from the wrong config key,
a head split by the wrong count) fails here even where the family row passes.  Exit status 1 if any run
exits non-zero.  Not part of CI (each shape boots vLLM); its runs are recorded in docs/evidence.md.

Traps: keep ``head_dim`` at 32 (vLLM's CPU attention rejects 16) and a window shorter than the prompts
where one is set, so it masks.  A family absent from :data:`ODD` is refused by name.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# family -> config overrides giving a shape its synthetic row does not have
ODD: dict[str, dict[str, Any]] = {
    # 8 query heads over 2 KV heads (a 4-way group), width 384, 4 layers
    "llama": dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=384,
                  num_hidden_layers=4),
    "qwen2_moe": dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=96,
                      shared_expert_intermediate_size=160, num_hidden_layers=4),
    "olmoe": dict(num_experts=8, num_experts_per_tok=3, intermediate_size=48, num_attention_heads=8,
                  num_key_value_heads=8, hidden_size=256),
    "granitemoe": dict(num_local_experts=6, num_experts_per_tok=1, embedding_multiplier=3.0,
                       residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=2.0),
    "exaone4": dict(sliding_window=5, num_attention_heads=8, num_key_value_heads=4, hidden_size=256),
    "olmo3": dict(sliding_window=5, layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    "falcon": dict(num_attention_heads=8, hidden_size=256, num_hidden_layers=4),
    "phi": dict(partial_rotary_factor=0.25, num_attention_heads=8, num_key_value_heads=8, hidden_size=256),
    "gptj": dict(rotary_dim=16, n_head=8, n_embd=256),
    "smollm3": dict(no_rope_layers=[1, 1, 0], num_attention_heads=8, num_key_value_heads=1, hidden_size=256),
    "cohere": dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=256, logit_scale=0.0625),
    "nemotron": dict(num_attention_heads=8, num_key_value_heads=8, hidden_size=256, intermediate_size=320,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    "gpt_bigcode": dict(n_head=8, n_embd=256, n_inner=512, n_layer=4),
    "ernie4_5": dict(num_attention_heads=8, num_key_value_heads=4, hidden_size=256, num_hidden_layers=4),
    "gpt_oss": dict(num_local_experts=6, num_experts_per_tok=3, sliding_window=5, num_attention_heads=8,
                    num_key_value_heads=2, hidden_size=256),
    "flex_olmo": dict(num_experts=6, num_experts_per_tok=1, num_hidden_layers=4),
    "hunyuan_v1_dense": dict(num_attention_heads=8, num_key_value_heads=2, hidden_size=256),
}


def _spec(family: str):
    from harness.models.families import FAMILIES

    if family not in ODD:
        raise SystemExit(f"odd_shapes: no odd shape declared for {family!r}; declared: {', '.join(sorted(ODD))}")
    row = FAMILIES[family]
    return replace(row, name=f"{family}_odd", config={**row.config, **ODD[family]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", help=f"default: all of {', '.join(ODD)}")
    ap.add_argument("--dtype", default="float32,bfloat16")
    ap.add_argument("--out", type=Path, default=Path("/tmp/vllm-parity-odd-shapes"))
    args = ap.parse_args(argv)
    from harness.models.checkpoints import build_checkpoint, spec_key

    failed = []
    for family in args.families or list(ODD):
        spec = _spec(family)
        ckpt = args.out / "checkpoints" / f"{spec.name}-{spec_key(spec)}"
        if not (ckpt / "config.json").exists():
            build_checkpoint(spec, ckpt)
        cmd = [sys.executable, "-m", "harness", "run", "--model-path", str(ckpt), "--dtype", args.dtype,
               "--report-dir", str(args.out / "reports" / spec.name)]
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT)
        print(f"{spec.name}: exit {rc}", flush=True)
        if rc:
            failed.append(spec.name)
    print("odd shapes failing:", ", ".join(failed) or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
