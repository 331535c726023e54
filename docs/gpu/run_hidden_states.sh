#!/usr/bin/env bash
# vLLM's own hidden-state export as the subject (`--subject vllm-hidden-states`:
# harness/engines/subject_hidden_states.py, the `extract_hidden_states` speculative method + vLLM
# 0.20.2's stock ExampleHiddenStatesConnector) on one H200: the synthetic llama and qwen3 in fp32-ieee
# and bf16, eager and compiled (torch.compile + vLLM's default CUDA-graph mode), gated against the
# references on the residual stream between layers (blocks.{i}.hook_in / hook_out).
# Results: docs/gpu/evidence/hidden-states-2026-12-02/ (reports' JSON/MD, logs).
#
# Device calls (each carrying .gpuwhl/host.sh; the machine is lost 30 s after a call):
#   1. bash .gpuwhl/host.sh acc                                   carry .gpuwhl/p00
#   2. bash .gpuwhl/host.sh acc                                   carry .gpuwhl/p01
#   3. bash .gpuwhl/host.sh install && export PYTHONPATH=/tmp/site:$PWD &&
#      bash docs/gpu/run_hidden_states.sh launch && bash docs/gpu/run_hidden_states.sh collect 420
#                                                                 carry .gpuwhl/p02 .gpuwhl/bundle.sha256
#   4. bash docs/gpu/run_hidden_states.sh collect 540             (only if 3 said "still running")
# MODELS (default llama,qwen3), VARIANTS (default the four below) and JOBS narrow or widen a run.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:?launch|plan|collect}; shift || true
SITE=${SITE:-/tmp/site}; WORK=${WORK:-/tmp/vp}; RES=${RES:-/tmp/res}; OUT=${OUT:-/tmp/out}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export MODELS=${MODELS:-llama,qwen3}
read -r -a variants <<<"${VARIANTS:---dtype float32,bfloat16 --precision ieee --modes eager,compiled}"
case "$phase" in
  launch)
    rm -rf "$WORK" "$RES"; mkdir -p "$WORK" "$RES"
    tar --exclude=./.gpuwhl --exclude=./.cache/runs -cf - . | tar -xf - -C "$WORK"
    cd "$WORK" && rm -rf reports/*/
    PY=python3 bash docs/gpu/register_plugin.sh "$SITE" || exit 1  # inert for this subject; as every GPU script
    MODELS=$MODELS setsid nohup bash docs/gpu/run_hidden_states.sh plan >"$RES/plan.out" 2>&1 </dev/null &
    sleep 2; echo "plan started in $WORK, results in $RES" ;;
  plan)
    export PYTHONPATH=$SITE:$WORK
    log=$RES/job.log
    { date; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; nproc
      python3 -c "import torch, vllm, transformers, importlib.metadata as m; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__, 'transformers', transformers.__version__, 'transformer-lens', m.version('transformer-lens'))"
    } >>"$log" 2>&1
    step() { local name=$1 s=$2; shift 2; echo "+ [$(date +%T)] $name: timeout $s $*" >>"$log"
             timeout -k 10 "$s" "$@" >"$RES/$name.log" 2>&1; echo "$name rc=$? at $(date +%T)" >>"$log"; }
    # the synthetic checkpoints, built here once before the parallel jobs
    step checkpoints 300 python3 -c "import os; from harness.models.families import resolve_families
from harness.models.checkpoints import checkpoint_dir
for s in resolve_families(os.environ['MODELS']): print(s.name, checkpoint_dir(s))"
    step hidden_states "${HS_S:-1200}" python3 -m harness run --device cuda --subject vllm-hidden-states \
        --model "$MODELS" "${variants[@]}" --jobs "${JOBS:-8}" --report-dir "$RES/reports"
    touch "$RES/DONE" ;;
  collect)
    end=$(( $(date +%s) + ${1:-540} ))
    while [ ! -e "$RES/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    mkdir -p "$OUT"; cd "$RES" || exit 1
    tar -czf "$OUT/reports.tgz" --exclude='*.png' reports 2>/dev/null
    tar -czf "$OUT/logs.tgz" *.log plan.out 2>/dev/null
    cp job.log "$OUT/" 2>/dev/null
    [ -e DONE ] && echo DONE || echo "still running"
    tail -c 2500 job.log; tail -c 4000 hidden_states.log 2>/dev/null
    find reports -name '*.json' 2>/dev/null | head -30 ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
