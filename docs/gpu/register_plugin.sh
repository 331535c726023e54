#!/usr/bin/env bash
# Registers the project's vllm.general_plugins entry point (the capture hooks, installed before vLLM
# compiles the model) in a --target site folder, where nothing of the project is pip-installed:
#   bash docs/gpu/register_plugin.sh /tmp/site      (from the repository root; PY: the python to use)
# Every GPU script calls this before it boots vLLM; without it the subject stops with "capture hooks
# were not installed before compilation".
set -euo pipefail
SITE=${1:?usage: register_plugin.sh SITE}
${PY:-python3} - "$SITE" <<'PY'
import sys, tomllib, pathlib
site = pathlib.Path(sys.argv[1]); proj = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
d = site / f"vllm_parity-{proj['version']}.dist-info"; d.mkdir(parents=True, exist_ok=True)
(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-parity\nVersion: {proj['version']}\n")
g = "vllm.general_plugins"
(d / "entry_points.txt").write_text(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in proj["entry-points"][g].items()))
PY
