#!/usr/bin/env bash
# The main job: set up, run parity on the default families (or pass --model / --model-path),
# write reports/<model>/report.{json,md} and reports/support_matrix.*, print the matrix.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m harness run "$@"
