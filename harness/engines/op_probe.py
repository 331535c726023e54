"""Which of vLLM's kernel ops this platform's extension has: a check made before any engine boots.

Contract: ``python -m harness.engines.op_probe REQ.json`` (run by harness.engines.subject.launch_subject,
in its own process like an engine: it imports vLLM and loads the platform's C extension) reads
``{"ops": [...], "modules": [...], "out": path}`` and writes ``{"vllm_version", "platform", "ops": {name:
null | what torch said}, "modules": {name: null | what the import raised}}`` to ``out``: ``null`` where
``torch.ops._C.<name>`` resolves, else the exception text torch gives for it -- the words the engine would
crash with on its first prompt; ``null`` where the module (one of vLLM's model modules) imports, else the
exception the import raised -- what vLLM's registry meets when it inspects the model.

Trap: vLLM registers its ops into ``torch.ops._C`` only once the platform's kernels are imported
(``current_platform.import_kernels()``: on x86 CPUs the library is ``_C_AVX2`` / ``_C_AVX512``
under the module name ``_C``, whose import "fails" after loading); an op looked up before that is
missing everywhere.
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def main(request_path: str) -> int:
    question = json.loads(Path(request_path).read_text())
    import torch
    import vllm
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    ops: dict[str, str | None] = {}
    for name in question["ops"]:
        try:
            getattr(torch.ops._C, name)
            ops[name] = None
        except (AttributeError, RuntimeError) as exc:
            ops[name] = f"{type(exc).__name__}: {exc}"
    modules: dict[str, str | None] = {}
    for name in question.get("modules", []):
        try:
            importlib.import_module(name)
            modules[name] = None
        except Exception as exc:  # noqa: BLE001 -- any failure to import is the answer, in its own words
            modules[name] = f"{type(exc).__name__}: {exc}"
    out = {"vllm_version": vllm.__version__, "platform": type(current_platform).__name__, "ops": ops,
           "modules": modules}
    Path(question["out"]).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
