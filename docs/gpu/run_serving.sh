#!/usr/bin/env bash
# The serving axes and the V2 runner on the GPU (and the 8B-shaped capture benchmark) on the CUDA host, after `.gpuwhl/host.sh install`:
#   export PYTHONPATH=/tmp/site:$PWD
#   WORK=/tmp/vp bash docs/gpu/run_h200.sh launch   # not this; this script is the background plan:
#   setsid nohup bash docs/gpu/run_serving.sh >/tmp/serving.out 2>&1 &    (then run_h200.sh collect)
# Runs, each a `harness run` through run_h200.sh's plan (its prelude: the plugin's dist-info, offline env):
#   1. the serving axes (harness/engines/serving.py) with the V1 runner, fp32-ieee and bf16, eager and
#      compiled (piecewise CUDA graphs), on qwen3, gemma, mixtral and the real smollm2;
#   2. the V2 model runner (opt-in on vLLM 0.20), single prompts and decode steps, same grid;
#   3. docs/gpu/run_8b_bench.sh when present (the 8B-shaped capture-overhead benchmark).
# BUDGET_S bounds 1 and 2 together (default 480 s); each leaves reports in reports/ as it goes.
set -uo pipefail
cd "$(dirname "$0")/../.."
export WORK=${WORK:-$PWD}
models=${SERVING_MODELS:-qwen3,gemma,mixtral,smollm2}
start=$(date +%s); budget=${BUDGET_S:-480}
left() { echo $(( budget - ($(date +%s) - start) )); }
rm -f "$WORK/DONE"
MODELS=$models BUDGET_S=$(left) VARIANTS="--dtype float32,bfloat16 --modes eager,compiled --serving prefix-cache,chunked,decode,preempt --runner v1" \
  bash docs/gpu/run_h200.sh plan
rm -f "$WORK/DONE"
MODELS=$models BUDGET_S=$(left) VARIANTS="--dtype float32,bfloat16 --modes eager,compiled --serving single,decode --runner v2" \
  bash docs/gpu/run_h200.sh plan
rm -f "$WORK/DONE"
[ -e docs/gpu/run_8b_bench.sh ] && bash docs/gpu/run_8b_bench.sh >>"$WORK/plan.log" 2>&1
touch "$WORK/DONE"
