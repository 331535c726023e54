"""The layering docs/adding-an-architecture.md states, checked on the source (every import, lazy ones included)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _imports(folder: str) -> dict[str, set[str]]:
    out = {}
    for path in (REPO / folder).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        out[str(path.relative_to(REPO))] = names
    return out


def test_vocabulary_imports_nothing_of_ours():
    for path, names in _imports("harness/vocab").items():
        assert not {n for n in names if n.startswith(("harness", "overlays")) and not n.startswith("harness.vocab")}, path


def test_comparison_and_reporting_never_touch_an_engine():
    for folder in ("harness/comparison", "harness/reporting"):
        for path, names in _imports(folder).items():
            assert not {n for n in names if n.startswith(("harness.engines", "vllm", "transformer_lens"))}, path


def test_no_module_of_the_pipeline_runs_vllm_itself():
    """vLLM is imported only by the engines (its own process), never by the host's pipeline."""
    for folder in ("harness/pipeline", "harness/comparison", "harness/references", "harness/reporting",
                   "harness/models", "harness/frontends", "overlays"):
        for path, names in _imports(folder).items():
            assert not {n for n in names if n == "vllm" or n.startswith("vllm.")}, path
