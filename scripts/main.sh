#!/usr/bin/env bash
# The main job: set up, run parity on the default families (or pass --model / --model-path) in fp32,
# bf16 and fp16, write reports/<model>/report*.{json,md,png} and reports/support_matrix.{md,json,html},
# print the matrix. Later arguments override (e.g. --dtype float32).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m harness run --dtype float32,bfloat16,float16 "$@"
