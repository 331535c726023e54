"""The warm server's preload list (harness.engines.warm): what it names exists, covers the default
families' vLLM model modules, and leaves vLLM's plugins unloaded -- else every engine would start cold."""
from __future__ import annotations

import subprocess
import sys

from harness.engines import warm


def test_model_modules_cover_every_default_family():
    from vllm.model_executor.models.registry import _VLLM_MODELS

    from harness.models.families import DEFAULT_FAMILIES, FAMILIES

    def module(name: str) -> str:  # vLLM's registry names a module outside its flat layout by its full path
        return name if name.startswith("vllm.") else f"vllm.model_executor.models.{name}"

    wanted = {module(_VLLM_MODELS[FAMILIES[f].architecture][0])
              for f in DEFAULT_FAMILIES if FAMILIES[f].architecture in _VLLM_MODELS
              and FAMILIES[f].builds_checkpoint}  # a family no checkpoint is built for (Refusal "hf:") never boots
    wanted -= set(warm.UNIMPORTABLE_MODEL_MODULES)  # declared refusals whose module cannot be imported here
    assert wanted <= set(warm.MODEL_MODULES), sorted(wanted - set(warm.MODEL_MODULES))


def test_every_preloaded_name_imports_without_loading_vllms_plugins():
    names = list(warm.preload_order())
    code = ("import importlib, sys, vllm.plugins as p\n"
            f"for n in {names!r}: importlib.import_module(n)\n"
            "print('plugins_loaded', getattr(p, 'plugins_loaded', False))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "plugins_loaded False" in proc.stdout, proc.stdout[-500:]
