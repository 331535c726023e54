#!/usr/bin/env bash
# Set up, then run the unit tests (tests/) and the parity suite (parity_tests/) on the default families.
# Extra arguments go to pytest (e.g. --model qwen3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest --durations=25 "$@"
