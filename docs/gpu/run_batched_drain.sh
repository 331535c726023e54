#!/usr/bin/env bash
# The batched graph-path drain (commit 1f53c1a: one DrainPlan per padded token count, one torch.cat(out=)
# per dtype per step) on one H200, in one device session: correctness first, then the cost.
#   A. beside each other: the graph-capture unit tests on CUDA (tests/unit/engines/test_graph_capture.py:
#      the stale-capture test and the batched-drain tests; test_graph_anatomy.py), qwen3 and llama compiled
#      under vLLM's default FULL_AND_PIECEWISE in fp32-ieee and bf16, serving single (the parity run) and
#      decode (full-graph replays, 8 drained steps per call, resolved in step order), and the 8B-shaped
#      checkpoint build (the bench's own command; its plan then finds it);
#   B. after A: docs/gpu/run_graph_bench.sh's plan phase, unchanged (BENCH_ARGS, ROUNDS, ... pass through).
# Results: docs/gpu/evidence/capture-graphs-8b-batched-drain/.
#
# Device calls (the machine is lost 30 s after a call ends):
#   1. bash .gpuwhl/host.sh acc && bash docs/gpu/run_batched_drain.sh acc    carry .gpuwhl/host.sh .gpuwhl/p00 .gpuwhl/pyt.tgz
#   2. bash .gpuwhl/host.sh acc                                              carry .gpuwhl/host.sh .gpuwhl/p01
#   3. bash .gpuwhl/host.sh install && export PYTHONPATH=/tmp/site:$PWD &&
#      BENCH_ARGS=--anatomy bash docs/gpu/run_batched_drain.sh launch &&
#      bash docs/gpu/run_batched_drain.sh collect 420                         carry .gpuwhl/host.sh .gpuwhl/p02 .gpuwhl/bundle.sha256
#   4. bash docs/gpu/run_batched_drain.sh collect 560                         (as often as needed)
# Measured 2026-12-02: call 3 finished the whole plan (install ~30 s, A 95 s, bench 130 s). A second bench run
# followed on the same machine: RES=/tmp/bdres2 bash docs/gpu/run_graph_bench.sh launch, then collect.
# .gpuwhl/pyt.tgz: pytest, _pytest, pluggy, iniconfig, packaging from .venv's site-packages (pure Python; the
# host has no pytest): tar --exclude=__pycache__ -czf .gpuwhl/pyt.tgz -C .venv/lib/python3*/site-packages
#   pytest _pytest pluggy iniconfig packaging *.dist-info of each.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:?acc|launch|plan|collect}; shift || true
SITE=${SITE:-/tmp/site}; WORK=${WORK:-/tmp/bdw}; RES=${RES:-/tmp/bdres}; OUT=${OUT:-/tmp/out}; PYT=/root/pyt
CKPT=${CKPT:-/tmp/llama3-8b-shaped}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case "$phase" in
  acc)
    rm -rf "$PYT" && mkdir -p "$PYT" && tar -xzf .gpuwhl/pyt.tgz -C "$PYT" && ls "$PYT" ;;
  launch)
    PY=python3 bash docs/gpu/register_plugin.sh "$SITE" || exit 1
    PYTHONPATH=$SITE python3 -c "import importlib.metadata as m; print(m.entry_points(group='vllm.general_plugins'))"
    rm -rf "$WORK" "$RES"; mkdir -p "$WORK" "$RES/bench"
    tar --exclude=./.gpuwhl --exclude=./.cache --exclude=./.venv -cf - . | tar -xf - -C "$WORK"
    cd "$WORK" && rm -rf reports/*/
    setsid nohup bash docs/gpu/run_batched_drain.sh plan >"$RES/plan.out" 2>&1 </dev/null &
    sleep 2; echo "plan started in $WORK, results in $RES" ;;
  plan)
    export PYTHONPATH=$SITE:$WORK
    log=$RES/job.log
    { date; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; nproc
      python3 -c "import torch, vllm, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__, 'transformers', transformers.__version__)"
    } >>"$log" 2>&1
    step() { local name=$1 s=$2; shift 2; echo "+ [$(date +%T)] $name: timeout $s $*" >>"$log"
             timeout -k 10 "$s" "$@" >"$RES/$name.log" 2>&1; echo "$name rc=$? at $(date +%T)" >>"$log"; }
    # A: correctness, with the checkpoint build beside it
    ( [ -e "$CKPT/shaped_checkpoint.json" ] || step checkpoint 300 python3 -m benchmarks.shaped_checkpoint \
        --shape llama3-8b --dtype bfloat16 --out "$CKPT" ) &
    ( export PYTHONPATH=$PYT:$SITE:$WORK; step graph_capture_tests 400 python3 -m pytest \
        tests/unit/engines/test_graph_capture.py tests/unit/engines/test_graph_anatomy.py -v -rs -p no:cacheprovider ) &
    step parity "${PARITY_S:-480}" python3 -m harness run --device cuda --compiled --model qwen3,llama \
        --dtype float32,bfloat16 --precision ieee --serving single,decode --jobs 8 --report-dir "$RES/reports"
    wait
    python3 -m harness matrix --report-dir "$RES/reports" --grid >"$RES/grid.md" 2>&1
    # B: the bench, alone on the GPU
    echo "+ [$(date +%T)] bench: run_graph_bench.sh plan (BENCH_ARGS=${BENCH_ARGS:-})" >>"$log"
    cp "$RES/checkpoint.log" "$RES/bench/" 2>/dev/null
    RES=$RES/bench WORK=$WORK CKPT=$CKPT bash docs/gpu/run_graph_bench.sh plan >"$RES/bench/plan.out" 2>&1
    echo "bench done at $(date +%T)" >>"$log"
    touch "$RES/DONE" ;;
  collect)
    end=$(( $(date +%s) + ${1:-540} ))
    while [ ! -e "$RES/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    # one archive for the bench folder: the run tool brings back only a few files per call
    mkdir -p "$OUT"; cd "$RES" || exit 1
    tar -czf "$OUT/reports.tgz" --exclude='*.png' reports 2>/dev/null
    cp job.log plan.out grid.md graph_capture_tests.log "$OUT/" 2>/dev/null
    gzip -c parity.log >"$OUT/parity.log.gz" 2>/dev/null; gzip -c checkpoint.log >"$OUT/checkpoint.log.gz" 2>/dev/null
    tar -czf "$OUT/bench.tgz" bench 2>/dev/null
    [ -e DONE ] && echo DONE || echo "still running"
    cat job.log; tail -n 25 graph_capture_tests.log 2>/dev/null; cat grid.md 2>/dev/null | tail -8
    cat bench/plan.out 2>/dev/null
    grep -E "engine up|^round|stopping|Error|error" bench/bench.log 2>/dev/null | grep -v "Processed prompts" | tail -20
    [ -e bench/capture_graphs_8b.md ] && cat bench/capture_graphs_8b.md || tail -c 3000 bench/bench.log 2>/dev/null ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
