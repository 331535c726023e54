#!/usr/bin/env bash
# The main job: set up, run parity on the default families (or pass --model / --model-path) in fp32,
# bf16 and fp16, then -- with no arguments -- the serving axes (prefix caching, chunked prefill,
# decode steps, preemption: harness/engines/serving.py) on qwen3, llama, gemma and mixtral in fp32, and the
# shapes that carry a recurrent mixer's state (decode, chunked) on each mixer kind (docs/serving.md: their
# prefix caching is a named vLLM crash or not applicable, which tests/engine/test_serving_axes.py checks);
# write reports/<model>/report*.{json,md,png} and reports/support_matrix.{md,json,html}, print the
# matrix. Later arguments override (e.g. --dtype float32) and skip the serving run.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit $?
status=0
.venv/bin/python -m harness run --dtype float32,bfloat16,float16 "$@" || status=$?
if [ $# -eq 0 ]; then
  .venv/bin/python -m harness run --model qwen3,llama,gemma,mixtral --dtype float32 \
    --serving prefix-cache,chunked,decode,preempt || status=$?
  .venv/bin/python -m harness run --model lfm2_conv,zamba2,granitemoehybrid --dtype float32 \
    --serving chunked,decode || status=$?
  .venv/bin/python -m harness run --model qwen3_next --dtype bfloat16 --serving chunked,decode || status=$?
fi
exit $status
