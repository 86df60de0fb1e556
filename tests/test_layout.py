"""The house's layout rules, checked on the source: modules a reader can hold in their head, tests that share
code only through tests/helpers/ (never by importing another test file), and fixtures only in conftest.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400
MAX_FUNCTION_LINES = 80
SOURCES = sorted([*(ROOT / "fedrecgel_secure").rglob("*.py"), *(ROOT / "cli").rglob("*.py")])
TESTS = sorted((ROOT / "tests").rglob("*.py"))


def test_no_module_is_over_400_lines():
    assert SOURCES  # the probe sees the package
    long = {str(p.relative_to(ROOT)): n for p in SOURCES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by concern: {long}"


def _function_lengths(path: Path) -> list[tuple[str, int]]:
    """Each function or method in the module, at any depth: its file-and-name label and its length in lines."""
    rel = str(path.relative_to(ROOT))
    nodes = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [(f"{rel}::{n.name}", n.end_lineno - n.lineno + 1) for n in nodes]


def test_no_function_is_over_80_lines():
    lengths = [length for p in SOURCES for length in _function_lengths(p)]
    assert lengths  # the probe sees functions and methods
    long = sorted((name, n) for name, n in lengths if n > MAX_FUNCTION_LINES)
    assert not long, f"cut these along their seams (lines per function): {long}"


def _imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
    return out


def test_no_test_file_imports_another_or_conftest():
    test_modules = {p.stem for p in TESTS if p.stem.startswith("test_")} | {"conftest"}
    crossing = {str(p.relative_to(ROOT)): sorted(_imported_modules(p) & test_modules) for p in TESTS}
    assert not {k: v for k, v in crossing.items() if v}, "share code through tests/helpers/ instead"


@pytest.mark.parametrize("conftest", sorted((ROOT / "tests").rglob("conftest.py")), ids=lambda p: p.parent.name)
def test_a_conftest_holds_fixtures_and_hooks_only(conftest):
    tree = ast.parse(conftest.read_text())
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions  # the probe sees its functions
    for fn in functions:
        fixture = any("fixture" in ast.unparse(d) for d in fn.decorator_list)
        assert fixture or fn.name.startswith("pytest_"), f"{fn.name}: a helper belongs in tests/helpers/"
