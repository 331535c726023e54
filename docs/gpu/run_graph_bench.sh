#!/usr/bin/env bash
# Capture cost under CUDA graphs on one H200: the Llama-3-8B-shaped bf16 checkpoint (seeded random weights,
# benchmarks/shaped_checkpoint.py, built on the GPU) and benchmarks/bench_capture_graphs.py: one compiled
# engine per mode (none = bare / residual / every offered hook), torch.compile + vLLM's default
# cudagraph_mode FULL_AND_PIECEWISE, the reads installed before compilation (the vllm_parity
# vllm.general_plugins entry point, docs/gpu/register_plugin.sh), B = 1, 8, 32 x 128 tokens: the prefill
# step (piecewise graphs) and decode steps (full-graph replays). Results: docs/gpu/evidence/capture-graphs-8b/.
#
# Device calls (each carrying .gpuwhl/host.sh; the machine is lost 30 s after a call ends):
#   1. bash .gpuwhl/host.sh acc                                              carry .gpuwhl/p00
#   2. bash .gpuwhl/host.sh acc                                              carry .gpuwhl/p01
#   3. bash .gpuwhl/host.sh install && export PYTHONPATH=/tmp/site:$PWD &&
#      BENCH_ARGS=--anatomy bash docs/gpu/run_graph_bench.sh launch &&
#      bash docs/gpu/run_graph_bench.sh collect 470                          carry .gpuwhl/p02 .gpuwhl/bundle.sha256
#   4. bash docs/gpu/run_graph_bench.sh collect 540                          (as often as needed)
# `launch` registers the plugin into $SITE, copies the checkout to $WORK (the code as it is now) and starts
# `plan` there in the background (setsid nohup); `collect N` waits up to N s for it, then copies the
# results to $OUT (which the run tool brings back). The whole plan takes about 4-5 min (checkpoint ~50 s,
# three compiled boots at once ~140 s, 8 rounds ~60 s), so call 3 usually finishes it.
#
# Knobs (environment): CKPT (/tmp/llama3-8b-shaped; built once), BATCHES (1,8,32), TOKENS (128), DECODE (8),
# ROUNDS (8; the bench stops starting rounds at BENCH_BUDGET_S), ITERS (3), WARMUP (1), MODES (none,residual,all),
# BENCH_BUDGET_S (420: boot + rounds), BENCH_ARGS (more bench_capture_graphs options).
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:?launch|plan|collect}; shift || true
SITE=${SITE:-/tmp/site}; WORK=${WORK:-/tmp/gbw}; RES=${RES:-/tmp/gbres}; OUT=${OUT:-/tmp/out}
CKPT=${CKPT:-/tmp/llama3-8b-shaped}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case "$phase" in
  launch)
    PY=python3 bash docs/gpu/register_plugin.sh "$SITE" || exit 1
    PYTHONPATH=$SITE python3 -c "import importlib.metadata as m; print(m.entry_points(group='vllm.general_plugins'))"
    rm -rf "$WORK" "$RES"; mkdir -p "$WORK" "$RES"
    tar --exclude=./.gpuwhl --exclude=./.cache --exclude=./.venv -cf - . | tar -xf - -C "$WORK"
    cd "$WORK" && setsid nohup bash docs/gpu/run_graph_bench.sh plan >"$RES/plan.out" 2>&1 </dev/null &
    sleep 2; echo "plan started in $WORK, results in $RES" ;;
  plan)
    export PYTHONPATH=$SITE:$WORK
    T0=$(date +%s)
    { date; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv; nproc; free -g | head -2
      python3 -c "import torch, vllm, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__, 'transformers', transformers.__version__)"
    } >"$RES/host.txt" 2>&1
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$RES/gpu_mem.csv" 2>/dev/null &
    SAMPLER=$!
    if [ ! -e "$CKPT/shaped_checkpoint.json" ]; then
      echo "+ [$(date +%T)] checkpoint $CKPT"
      timeout -k 10 300 python3 -m benchmarks.shaped_checkpoint --shape llama3-8b --dtype bfloat16 --out "$CKPT" \
        >"$RES/checkpoint.log" 2>&1; echo "checkpoint rc=$? at +$(( $(date +%s) - T0 )) s"
    fi
    cp "$CKPT/shaped_checkpoint.json" "$RES/" 2>/dev/null
    budget=${BENCH_BUDGET_S:-420}
    echo "+ [$(date +%T)] bench, budget $budget s"
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} timeout -k 15 $(( budget + 120 )) python3 -m benchmarks.bench_capture_graphs \
      --checkpoint "$CKPT" --dtype bfloat16 --batch-sizes "${BATCHES:-1,8,32}" --tokens "${TOKENS:-128}" \
      --decode "${DECODE:-8}" --modes "${MODES:-none,residual,all}" --rounds "${ROUNDS:-8}" --iters "${ITERS:-3}" \
      --warmup "${WARMUP:-1}" --budget-s "$budget" \
      --eager-ref docs/gpu/evidence/capture-batches-8b/capture_batches_8b.json \
      --out "$RES/capture_graphs_8b" ${BENCH_ARGS:-} >"$RES/bench.log" 2>&1
    echo "bench rc=$? at +$(( $(date +%s) - T0 )) s"
    kill $SAMPLER 2>/dev/null; wait $SAMPLER 2>/dev/null
    echo "peak GPU memory (nvidia-smi, MiB): $(awk -F', *' '{ if ($2 > m[$1]) m[$1] = $2 } END { for (g in m) printf "GPU%s %s  ", g, m[g] }' "$RES/gpu_mem.csv")"
    touch "$RES/DONE" ;;
  collect)
    end=$(( $(date +%s) + ${1:-540} ))
    while [ ! -e "$RES/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    mkdir -p "$OUT"; cd "$RES" || exit 1
    cp host.txt plan.out shaped_checkpoint.json capture_graphs_8b.json capture_graphs_8b.md checkpoint.log "$OUT/" 2>/dev/null
    gzip -c bench.log >"$OUT/bench.log.gz" 2>/dev/null; gzip -c gpu_mem.csv >"$OUT/gpu_mem.csv.gz" 2>/dev/null
    [ -e DONE ] && echo DONE || echo "still running"
    cat plan.out; grep -E "engine up|^round|stopping|Error|error" bench.log 2>/dev/null | grep -v "Processed prompts" | tail -20
    [ -e capture_graphs_8b.md ] && cat capture_graphs_8b.md || tail -c 4000 bench.log 2>/dev/null ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
