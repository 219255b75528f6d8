"""Modules and functions of the library stay small enough to read (docs/ARCHITECTURE.md, "Layout").

No module of ``remem_agent`` is over 600 lines. No function is over 80 lines, except the ones listed in
``LONG_FUNCTIONS`` with the length they had when the rule came: a listed function may only shrink, and
leaves the list once it is within the limit, so the list can only get shorter.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "remem_agent"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS: dict[tuple[str, str], int] = {}  # (module, qualified name) -> lines when the limit came in


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """Every function and method (nested ones inside their parent's length, not counted again)."""
    out: list[tuple[str, int]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            out.append((prefix + node.name, node.end_lineno - node.lineno + 1))
        elif isinstance(node, ast.ClassDef):
            out += _functions(node, prefix + node.name + ".")
    return out


def _lengths() -> dict[tuple[str, str], int]:
    return {
        (path.relative_to(ROOT).as_posix(), name): length
        for path in sorted(ROOT.rglob("*.py"))
        for name, length in _functions(ast.parse(path.read_text(encoding="utf-8")))
    }


def test_no_module_is_over_600_lines() -> None:
    sizes = {
        p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in ROOT.rglob("*.py")
    }
    assert len(sizes) > 100
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_function_is_over_80_lines_but_the_listed_ones_which_only_shrink() -> None:
    lengths = _lengths()
    too_long = {key: n for key, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert set(too_long) <= set(LONG_FUNCTIONS), "new function over 80 lines"
    grown = {key: (n, LONG_FUNCTIONS[key]) for key, n in too_long.items() if n > LONG_FUNCTIONS[key]}
    assert grown == {}, "a listed function grew"
    assert set(LONG_FUNCTIONS) <= set(too_long), "within the limit now (or gone): take it off the list"


def test_the_function_walk_sees_methods_and_leaves_nested_functions_to_their_parent() -> None:
    tree = ast.parse(
        "class A:\n    def f(self):\n        def g():\n            pass\n        return g\n\ndef h():\n    pass\n"
    )
    assert _functions(tree) == [("A.f", 4), ("h", 2)]
