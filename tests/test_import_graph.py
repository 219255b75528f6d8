"""No import cycles in ``remem_agent`` or ``evals``, counting every import statement (also inside functions).

The graph is built from the source with ``ast``: a module imports another when any ``import`` or
``from ... import`` in it (at any depth: functions, ``if TYPE_CHECKING`` blocks, try/except) names that
module, a submodule of it or a name in it. ``from pkg import name`` counts as importing ``pkg.name``
when that is a module, else ``pkg``. Importing one's own parent package is not counted (Python runs a
package's ``__init__`` before any submodule anyway, so that edge cannot make a cycle worse). Cycles
are the strongly connected components with more than one module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("remem_agent", "evals")


def modules(package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every ``.py`` file of ``package``."""
    out: dict[str, Path] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is, or is inside of (``pkg.mod.func`` -> ``pkg.mod``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(module: str, path: Path) -> Iterable[str]:
    """Every dotted name an import statement of ``module`` refers to (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(packages: Iterable[str]) -> dict[str, set[str]]:
    known: dict[str, Path] = {}
    for package in packages:
        known.update(modules(package))
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for name in imported_names(module, path):
            target = _resolve(name, known)
            if target and target != module and not module.startswith(target + "."):
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, todo = work[-1]
            if todo:
                w = todo.pop()
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, sorted(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_cycle_finder_sees_function_level_imports(tmp_path: Path) -> None:
    """The checker itself: a cycle closed only by an import inside a function is still a cycle."""
    graph = {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}
    assert cycles(graph) == [["p.a", "p.b"]]
    src = "def f():\n    from evals.harness import world\n"
    names = list(imported_names("evals.harness.families", _write(tmp_path / "families.py", src)))
    assert "evals.harness.world" in names


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package: str) -> None:
    graph = import_graph([package])
    assert len(graph) > 5, f"found too few modules in {package}"
    assert cycles(graph) == [], "import cycles (each list is one strongly connected component)"


def test_no_import_cycles_across_packages() -> None:
    assert cycles(import_graph(PACKAGES)) == []


def test_library_never_imports_the_harness() -> None:
    """remem_agent ships in the wheel without evals: nothing in it may import evals."""
    graph = import_graph(PACKAGES)
    offenders = sorted(
        m for m, deps in graph.items() if m.startswith("remem_agent") and any(d.startswith("evals") for d in deps)
    )
    assert offenders == []


def test_the_architecture_module_map_is_rendered_from_the_code() -> None:
    """docs/ARCHITECTURE.md lists every module with its docstring's first sentence and the packages it imports,
    exactly as ``python -m evals.analysis.architecture`` renders them: a new or moved module fails here."""
    from evals.analysis.architecture import DOC, render, updated

    text = DOC.read_text(encoding="utf-8")
    assert updated(text, render()) == text, "run: python -m evals.analysis.architecture"
    listed = render()
    for path in sorted((ROOT / "remem_agent").rglob("*.py")):
        if "__pycache__" not in path.parts:
            assert f"| `{path.relative_to(ROOT / 'remem_agent').as_posix()}` |" in listed
