#!/usr/bin/env bash
# An 8B-class model through the whole suite on one GPU: the Llama-3-8B-shaped
# checkpoint (benchmarks/shaped_checkpoint.py: the real config, 8.03 B seeded random parameters,
# built on the device, nothing downloaded), `python -m harness run` per dtype, with the GPU's
# memory sampled by nvidia-smi beside the harness's own per-phase times and memory (report.json:
# timings.phases, timings.memory, timings.peak_memory).
#
# On the air-gapped CUDA host, from the repository root, with the wheelhouse in /tmp/site:
#
#   export PYTHONPATH=/tmp/site:$PWD && DTYPES=float32 bash docs/gpu/run_8b_parity.sh
#
# Knobs: DTYPES (bfloat16,float32), CKPT (/tmp/llama3-8b-shaped), RES (results; default
# $OUT/8b-parity or /tmp/out/8b-parity), TOTAL_S (560), TMPDIR (where captures spill; the disk
# needs room for every reference's captures of the run: harness.spill).
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
CKPT=${CKPT:-/tmp/llama3-8b-shaped}
RES=${RES:-${OUT:-/tmp/out}/8b-parity}
TOTAL_S=${TOTAL_S:-560}
export PYTHONPATH=${PYTHONPATH:-$SITE:$PWD}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
mkdir -p "$RES"
left() { echo $(( TOTAL_S - ($(date +%s) - T0) )); }
{ date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; free -g | head -2; df -h /tmp | tail -1; } \
  2>&1 | tee "$RES/host.txt"

PY=$PY bash docs/gpu/register_plugin.sh "$SITE"  # the capture hooks' entry point (nothing is pip-installed here)

if [ ! -e "$CKPT/shaped_checkpoint.json" ]; then
  echo "== checkpoint: building $CKPT [$(left) s left]"
  timeout -k 10 240 $PY -m benchmarks.shaped_checkpoint --shape llama3-8b --dtype bfloat16 --out "$CKPT" \
    >"$RES/checkpoint.log" 2>&1; echo "rc=$?"
fi

DTYPES=${DTYPES:-bfloat16,float32}
for dtype in ${DTYPES//,/ }; do
  budget=$(( $(left) - 10 ))
  if [ "$budget" -lt 60 ]; then echo "== $dtype SKIPPED: ${budget} s left" | tee -a "$RES/run.log"; continue; fi
  echo "== harness run --dtype $dtype [budget ${budget} s]" | tee -a "$RES/run.log"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >"$RES/gpu_mem-$dtype.csv" 2>/dev/null &
  SAMPLER=$!
  timeout -k 10 "$budget" $PY -m harness run --model-path "$CKPT" --device cuda --dtype "$dtype" \
    --report-dir "$RES/reports" --engine-timeout $(( budget - 20 )) >"$RES/parity-$dtype.log" 2>&1
  echo "rc=$? at +$(( $(date +%s) - T0 )) s; peak GPU memory used (nvidia-smi, MiB): $(sort -n "$RES/gpu_mem-$dtype.csv" | tail -1)" \
    | tee -a "$RES/run.log"
  kill $SAMPLER 2>/dev/null
  tail -2 "$RES/parity-$dtype.log" | cut -c1-400
done
find "$RES/reports" -name 'report*.json' | head
