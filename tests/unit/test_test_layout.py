"""The tests are laid out like the code: engine-free unit tests under tests/unit/<package>/, one named
test module per module of the gate's packages, engine-backed tests apart under tests/engine/.

Contracts checked: no test file sits directly in tests/; every file under tests/engine/ marks its
whole module ``parity`` (``pytestmark``), so ``-m "not parity"`` and ``tests/unit`` select the same
engine-free set, and no unit test carries the mark; test file names are unique (pytest's default
import mode needs it); every module of harness/comparison and harness/references has
``tests/unit/<package>/test_<module>.py``.
"""
from __future__ import annotations

import ast
from collections import Counter

from harness.paths import REPO_ROOT

TESTS = REPO_ROOT / "tests"
NAMED_PACKAGES = ("comparison", "references")


def _marks_module_parity(path) -> bool:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return ast.unparse(node.value) == "pytest.mark.parity"
    return False


def _uses_parity_mark(path) -> bool:
    """``pytest.mark.parity`` anywhere in the code (a decorator, a pytestmark, a param's marks), not in text."""
    return any(isinstance(n, ast.Attribute) and n.attr == "parity" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(ast.parse(path.read_text())))


def test_no_test_file_outside_unit_and_engine():
    assert not sorted(p.name for p in TESTS.glob("test_*.py"))


def test_engine_tests_are_marked_parity_and_unit_tests_are_not():
    unmarked = [p.name for p in (TESTS / "engine").glob("test_*.py") if not _marks_module_parity(p)]
    assert not unmarked, f"tests/engine files without pytestmark = pytest.mark.parity: {unmarked}"
    marked = [str(p.relative_to(TESTS)) for p in (TESTS / "unit").rglob("test_*.py") if _uses_parity_mark(p)]
    assert not marked, f"unit tests marked parity (an engine-backed test belongs in tests/engine/): {marked}"


def test_test_file_names_are_unique():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1]


def test_every_module_of_the_gate_packages_has_its_named_test():
    missing = []
    for package in NAMED_PACKAGES:
        for module in sorted((REPO_ROOT / "harness" / package).glob("*.py")):
            if module.name != "__init__.py" and not (TESTS / "unit" / package / f"test_{module.name}").exists():
                missing.append(f"harness/{package}/{module.name}")
    assert not missing, f"no tests/unit/<package>/test_<module>.py for: {missing}"
