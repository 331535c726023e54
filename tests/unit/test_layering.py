"""The package levels README.md and docs/adding-an-architecture.md state, checked on the source: every
import (lazy ones inside functions included) of every module of ``harness`` and ``overlays``.

Contract: :data:`LEVELS` is the order, lowest first.  A module may import its own package and any
package on a lower level, never one on a higher level or a sibling on the same level; and the
module-level import graph has no circle (so no folder-level one either).  ``harness.<module>`` (a
module directly under ``harness/``) is the *base* level: paths, kernel path, phases, memory sampling,
spill, the log-prob request rule.
"""
from __future__ import annotations

import ast
from pathlib import Path

from harness.paths import REPO_ROOT as REPO

# lowest first; packages on one line share a level and may not import each other
LEVELS: tuple[tuple[str, ...], ...] = (
    ("harness.vocab",),            # hook names and the rules on them: imports nothing of ours
    ("harness",),                  # base modules directly under harness/ (paths, kernel_path, ...)
    ("overlays",),                 # the declarative maps, per family
    ("harness.engines",),          # vLLM and reference processes, the worker side
    ("harness.models",),           # families, checkpoints, prompts, targets
    ("harness.values",),           # Variant, Plan, result schema, selection, settings, fingerprints
    ("harness.comparison",),       # conversions, metrics, the gate and its data
    ("harness.references",),       # reference captures, floors, stored references
    ("harness.quantized", "harness.reporting"),
    ("harness.pipeline",),         # orchestration: one (target, variant), fault sweeps, refusals
    ("harness.frontends",),        # the CLI and the pytest plugin
    ("harness.__main__",),         # ``python -m harness``
)


def _package(module: str) -> str | None:
    """The level-bearing package of a dotted module name of ours, or None for a third-party one."""
    parts = module.split(".")
    if parts[0] == "overlays":
        return "overlays"
    if parts[0] != "harness":
        return None
    if module == "harness.__main__":
        return module
    if len(parts) >= 2 and (REPO / "harness" / parts[1]).is_dir():
        return f"harness.{parts[1]}"
    return "harness"


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``from harness.x import y`` counts ``harness.x.y``
    where that is a module, else ``harness.x``)."""
    out = {}
    for root in ("harness", "overlays"):
        for path in (REPO / root).rglob("*.py"):
            names = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for a in node.names:
                        sub = f"{node.module}.{a.name}"
                        is_module = (REPO / Path(*sub.split("."))).with_suffix(".py").exists() or \
                            (REPO / Path(*sub.split("."))).is_dir()
                        names.add(sub if is_module else node.module)
            out[_module_name(path)] = {n for n in names if _package(n)}
    return out


def _level(package: str) -> int:
    for i, packages in enumerate(LEVELS):
        if package in packages:
            return i
    raise AssertionError(f"{package} has no level in LEVELS: add it where it belongs")


def test_every_package_has_a_level():
    packages = {_package(m) for m in _imports()}
    for package in packages:
        _level(package)


def test_no_import_runs_up_or_sideways():
    wrong = []
    for module, names in _imports().items():
        src = _package(module)
        for name in names:
            dst = _package(name)
            if dst != src and _level(dst) >= _level(src):
                wrong.append(f"{module} imports {name} ({dst} is not below {src})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_circle_between_modules():
    graph = _imports()
    state: dict[str, int] = {}  # 1 on the path, 2 done
    circles = []

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif not state.get(nxt):
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if not state.get(module):
            visit(module, [module])
    assert not circles, "\n".join(circles)


def test_vocabulary_imports_nothing_of_ours():
    for module, names in _imports().items():
        if _package(module) == "harness.vocab":
            assert all(_package(n) == "harness.vocab" for n in names), module


def _third_party(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_comparison_and_reporting_never_touch_an_engine():
    """Pure functions of captures: no engine of ours, no vLLM, no TransformerLens."""
    for folder in ("harness/comparison", "harness/reporting"):
        for path in (REPO / folder).rglob("*.py"):
            assert not {n for n in _third_party(path)
                        if n.startswith(("harness.engines", "vllm", "transformer_lens"))}, path


def test_no_module_outside_the_engines_imports_vllm():
    """vLLM is imported only by the engines (its own process), never by the host's pipeline."""
    for root in ("harness", "overlays"):
        for path in (REPO / root).rglob("*.py"):
            if path.is_relative_to(REPO / "harness" / "engines"):
                continue
            assert not {m for m in _third_party(path) if m == "vllm" or m.startswith("vllm.")}, path
