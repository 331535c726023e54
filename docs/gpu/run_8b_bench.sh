#!/usr/bin/env bash
# The GPU capture-overhead target and an 8B-class model on one GPU, in one device call: a Llama-3-8B-shaped
# bf16 checkpoint (seeded random weights, benchmarks/shaped_checkpoint.py) and the capture overhead at
# batch sizes 1, 8, 32 x 128 tokens, ours (bare / residual / TL's hook set / every offered hook) against
# TransformerLens's boot_vllm in the same run (benchmarks/bench_capture_batches.py; eager).
#
# On the air-gapped CUDA host, from the repository root, after the wheelhouse is installed into /tmp/site
# (docs/gpu/README.md, "Commands"):
#
#   export PYTHONPATH=/tmp/site:$PWD && bash docs/gpu/run_8b_bench.sh
#
# Knobs (environment): CKPT (default /tmp/llama3-8b-shaped; built once, reused when complete),
# BATCHES (1,8,32), TOKENS (128), ROUNDS (8; the bench stops starting rounds at BENCH_BUDGET_S),
# ITERS (3), WARMUP (1), BENCH_BUDGET_S (300: boot + rounds), RES (docs/gpu/evidence/capture-batches-8b),
# OUT (if set, results are copied there), TOTAL_S (560: the script's own deadline; lower it when the
# wheel install shares the device call), BENCH=0 (skip the benchmark), PARITY=1 (then, if PARITY_S
# seconds remain, the parity harness on the same checkpoint: harness run --model-path CKPT --dtype bfloat16).
# BENCH_ARGS: more bench_capture_batches options (e.g. --no-copy-floor, --tl-logits, --kv-cache-gb 8).
#
# Prints the table, the checkpoint's build time and numeric check, and peak GPU memory (nvidia-smi,
# sampled every 500 ms over the whole script, and each engine's torch max_memory_allocated).
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
CKPT=${CKPT:-/tmp/llama3-8b-shaped}
RES=${RES:-docs/gpu/evidence/capture-batches-8b}
TOTAL_S=${TOTAL_S:-560}
export PYTHONPATH=${PYTHONPATH:-$SITE:$PWD}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$RES"
left() { echo $(( TOTAL_S - ($(date +%s) - T0) )); }

{ date; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv; nproc; free -g | head -2
  $PY -c "import torch, vllm, transformers, transformer_lens as tl; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'vllm', vllm.__version__, 'transformers', transformers.__version__, 'transformer-lens', __import__('importlib.metadata').metadata.version('transformer-lens'))"
} 2>&1 | tee "$RES/host.txt"

# GPU memory over the whole run (MiB per GPU, every 500 ms); stopped by its pid at the end
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$RES/gpu_mem.csv" 2>/dev/null &
SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null' EXIT

# 1. the checkpoint (~16 GB: 4 shards of <= 5 GB), drawn on the GPU
if [ -e "$CKPT/shaped_checkpoint.json" ]; then
  echo "== checkpoint: $CKPT already built"
else
  echo "== checkpoint: building $CKPT [$(left) s left]"
  timeout -k 10 240 $PY -m benchmarks.shaped_checkpoint --shape llama3-8b --dtype bfloat16 --out "$CKPT" \
    2>&1 | tee "$RES/checkpoint.log" | grep -v "^  shard" ; echo "rc=${PIPESTATUS[0]}"
fi
cp "$CKPT/shaped_checkpoint.json" "$RES/" 2>/dev/null
du -sh "$CKPT" 2>/dev/null

# 2. the benchmark (both engines in their own processes, booted concurrently on GPU 0)
if [ "${BENCH:-1}" = 1 ]; then
budget=$(( $(left) - 40 )); [ "$budget" -gt "${BENCH_BUDGET_S:-300}" ] && budget=${BENCH_BUDGET_S:-300}
echo "== bench: budget ${budget} s [$(left) s left]"
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -k 15 $(( budget + 90 )) $PY -m benchmarks.bench_capture_batches \
  --checkpoint "$CKPT" --dtype bfloat16 --batch-sizes "${BATCHES:-1,8,32}" --tokens "${TOKENS:-128}" \
  --rounds "${ROUNDS:-8}" --iters "${ITERS:-3}" --warmup "${WARMUP:-1}" --budget-s "$budget" \
  --out "$RES/capture_batches_8b" ${BENCH_ARGS:-} >"$RES/bench.log" 2>&1
echo "bench rc=$? at +$(( $(date +%s) - T0 )) s"
grep -E "engine up|^round|stopping|Error|error:" "$RES/bench.log" | grep -v "Processed prompts" | tail -20
[ -e "$RES/capture_batches_8b.md" ] && cat "$RES/capture_batches_8b.md" || tail -60 "$RES/bench.log"
fi

# 3. optional: the parity harness on the same checkpoint
if [ "${PARITY:-0}" = 1 ] && [ "$(left)" -gt "${PARITY_S:-150}" ]; then
  echo "== parity: harness run --model-path $CKPT --dtype bfloat16 [$(left) s left]"
  # the harness's subject needs its vllm.general_plugins entry point (as run_h200.sh writes it)
  PY=${PY:-python3} bash docs/gpu/register_plugin.sh "$SITE"
  timeout -k 10 $(( $(left) - 20 )) $PY -m harness run --device cuda --model-path "$CKPT" --dtype bfloat16 \
    --report-dir "$RES/reports" >"$RES/parity.log" 2>&1; echo "parity rc=$?"
  grep -E "^(==|   (pass|fail|error|skipped))" "$RES/parity.log" | tail -20
fi

kill $SAMPLER 2>/dev/null; wait $SAMPLER 2>/dev/null
echo "== peak GPU memory (nvidia-smi, MiB, whole script): $(awk -F', *' '{ if ($2 > m[$1]) m[$1] = $2 } END { for (g in m) printf "GPU%s %s  ", g, m[g] }' "$RES/gpu_mem.csv")"
$PY - "$RES/capture_batches_8b.json" <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))
for tool, m in (r.get("memory") or {}).items():
    if m:
        print(f"   {tool}: torch max_memory_allocated {m['max_allocated_gb']:.1f} GB, reserved {m['reserved_gb']:.1f} GB")
PY
gzip -f "$RES/bench.log" 2>/dev/null
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && cp -r "$RES" "$OUT/" && echo "copied $RES to $OUT/$(basename "$RES")"
fi
echo "done at +$(( $(date +%s) - T0 )) s"
