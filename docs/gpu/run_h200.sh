#!/usr/bin/env bash
# The runs behind docs/gpu/, on an air-gapped CUDA host whose python3 has torch (CUDA) and
# transformers, with vllm + transformer-lens installed into /tmp/site by the offline wheelhouse
# (../shared/gpu: `pack.sh` here writes .gpuwhl/, `.gpuwhl/host.sh acc|install` there).
#
#   export PYTHONPATH=/tmp/site:$PWD
#   bash docs/gpu/run_h200.sh launch            # copy the tree to $WORK, start `plan` in the background
#                                               # (MODELS=a,b: only those families' six variants;
#                                               #  VARIANTS="--dtype bfloat16 --modes eager": only those;
#                                               #  REPORT_DIR=reports-x: a MODELS re-run's reports there)
#   bash docs/gpu/run_h200.sh collect [WAIT_S]  # wait (at most WAIT_S) for it; tar what is there to $OUT
#
# plan (one background job, so it outlives a device call's 10-minute limit; each `collect`
# brings back the reports written so far):
#   1. beside everything else, pinned to the last GPU: tests/unit/engines/test_vllm_compat.py +
#      tests/unit/overlays/test_overlays.py against the installed vLLM line, then the six planted Gemma bugs
#      (tests/engine/test_fault_injection.py) in every gate (fp32-ieee, fp32-tf32, bf16);
#   2. qwen3/llama/gemma in fp32-ieee, fp32-tf32 and bf16, each eager and compiled (torch.compile
#      + CUDA graphs), and beside them tensor_parallel_size 2 (fp32-ieee and bf16, eager);
#   3. then every other family in the same six variants.
# One-GPU jobs are spread over the GPUs (harness run --jobs; each job gets cores / jobs CPU threads).
#
# Nothing of the project is pip-installed on that host, so vLLM would not see the
# vllm.general_plugins entry point that installs the capture hooks before compilation:
# a minimal dist-info declaring it (read from pyproject.toml) is written into /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:?launch|collect|plan}; shift || true
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/vp}
deadline=$(( $(date +%s) + ${BUDGET_S:-3000} ))  # plan's steps stop there
case "$phase" in
  plan) log="$WORK/plan.log" ;;
  launch|collect) log=/dev/null ;;
  *) echo "unknown phase $phase (launch, collect, plan)"; exit 2 ;;
esac
PY=${PY:-python3} bash docs/gpu/register_plugin.sh "$SITE"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ "$log" = /dev/null ] || { date; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; nproc; \
  python3 -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__)"; } >>"$log" 2>&1
run() {  # a step, stopped at the phase's deadline
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 20 ]; then echo "SKIPPED (deadline): $*" >>"$log"; return; fi
  echo "+ [$(date +%T), ${left}s left] $*" >>"$log"
  timeout -k 10 "$left" "$@" >>"$log" 2>&1; echo "rc=$? at $(date +%T)" >>"$log"
}
core3=qwen3,llama,gemma
# VARIANTS="--dtype ... --modes ..." narrows a MODELS re-run (default: the six variants below)
read -r -a variants <<<"${VARIANTS:---dtype float32,bfloat16 --precision ieee,tf32 --modes eager,compiled}"
case "$phase" in
  launch)
    rm -rf "$WORK"; mkdir -p "$WORK"
    tar --exclude=./.gpuwhl --exclude=./.cache/runs -cf - . | tar -xf - -C "$WORK"
    cd "$WORK" && rm -rf reports/*/ && setsid nohup bash docs/gpu/run_h200.sh plan >"$WORK/plan.out" 2>&1 </dev/null &
    sleep 2; echo "plan started in $WORK"; exit 0 ;;
  plan)
    # built once, before parallel jobs (MODELS: those only; a packaged checkpoint not installed here is skipped)
    MODELS=${MODELS:-} python3 -c "import os; from harness.models.families import FAMILIES, resolve_families
from harness.models.checkpoints import checkpoint_dir
for s in resolve_families(os.environ['MODELS'] or ','.join(FAMILIES)):
    try: checkpoint_dir(s)
    except Exception as e: print('checkpoint', s.name, 'not built:', e)" >>"$log" 2>&1
    if [ -n "${MODELS:-}" ]; then  # a re-run of some families only: their six variants, nothing else
      run python3 -m harness run --device cuda --model "$MODELS" "${variants[@]}" --jobs "${JOBS:-12}" \
        ${REPORT_DIR:+--report-dir "$REPORT_DIR"}
      python3 -m harness matrix >/dev/null 2>&1; touch "$WORK/DONE"; exit 0
    fi
    last=$(( $(nvidia-smi -L | wc -l) - 1 ))
    ( CUDA_VISIBLE_DEVICES=$last timeout -k 10 2400 python3 -m pytest -q -p no:cacheprovider \
        tests/unit/engines/test_vllm_compat.py tests/unit/overlays/test_overlays.py >"$WORK/log-compat.txt" 2>&1; echo "rc=$?" >>"$WORK/log-compat.txt"
      CUDA_VISIBLE_DEVICES=$last timeout -k 10 2400 python3 -m pytest -q -s -p no:cacheprovider \
        tests/engine/test_fault_injection.py --device cuda --report-dir /tmp/planted >"$WORK/log-fault.txt" 2>&1
      echo "rc=$?" >>"$WORK/log-fault.txt" ) &
    ( run python3 -m harness run --device cuda --tp 2 --model $core3 --dtype float32,bfloat16 --modes eager \
        --jobs 3 ) &
    run python3 -m harness run --device cuda --model $core3 "${variants[@]}" --jobs "${JOBS:-12}"
    others=$(python3 -c "from harness.models.families import FAMILIES; print(','.join(f for f in FAMILIES if f not in '$core3'.split(',')))")
    run python3 -m harness run --device cuda --model "$others" "${variants[@]}" --jobs "${JOBS:-12}"
    wait
    python3 -m harness matrix >/dev/null 2>&1; touch "$WORK/DONE"; exit 0 ;;
  collect)
    end=$(( $(date +%s) + ${1:-540} ))
    while [ ! -e "$WORK/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    cd "$WORK" && python3 -m harness matrix >/dev/null 2>&1
    tar -czf "$OUT/reports.tgz" reports $(ls -d reports-* 2>/dev/null) plan.log $(ls log-*.txt .cache/runs/*/subject.log 2>/dev/null)
    [ -e DONE ] && echo DONE || echo "still running"
    grep -E "^(==|   (pass|fail|error|skipped)|\+ |rc=|SKIPPED)" plan.log | tail -150
    tail -5 log-fault.txt log-compat.txt 2>/dev/null; exit 0 ;;
esac
