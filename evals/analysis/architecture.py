"""The module map of ``docs/ARCHITECTURE.md``, rendered from the code: every module of ``remem_agent``, what its
docstring says it is, and which of the library's packages it imports.

The map sits between two marker lines of the document; a test checks that the committed document holds exactly
what this renders, so a new, moved or renamed module cannot be missing from it.

    python -m evals.analysis.architecture            # rewrite the map in docs/ARCHITECTURE.md
    python -m evals.analysis.architecture --check    # exit 1 when it is out of date
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN = "<!-- module map: python -m evals.analysis.architecture -->"
END = "<!-- end of module map -->"
PACKAGE = "remem_agent"


def _modules() -> dict[str, Path]:
    """``store/sql.py``-style path -> source file, for every module of the library (packages' ``__init__``
    included when they hold more than their docstring and re-exports)."""
    out: dict[str, Path] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        out[path.relative_to(ROOT / PACKAGE).as_posix()] = path
    return out


def summary(path: Path) -> str:
    """The first sentence of the module's docstring ("" when it has none), on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    for end in (". ", ".\n"):
        if end in first + "\n":
            first = (first + "\n").split(end)[0] + "."
            break
    return first.replace("|", "\\|")


def imported_packages(rel: str, path: Path) -> list[str]:
    """The library's top-level packages and modules this module imports (at any depth), itself excluded."""
    own = rel.split("/")[0] if "/" in rel else rel.removesuffix(".py")
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package_parts = [PACKAGE, *rel.split("/")[:-1]]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package_parts[: len(package_parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [base]
            if base == PACKAGE:
                names = [f"{base}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == PACKAGE and len(parts) > 1 and parts[1] != own:
                found.add(parts[1])
    return sorted(found)


def render() -> str:
    """The map: one table per package, a row per module."""
    groups: dict[str, list[tuple[str, Path]]] = defaultdict(list)
    for rel, path in _modules().items():
        groups[rel.split("/")[0] + "/" if "/" in rel else ""].append((rel, path))
    lines = [BEGIN, ""]
    for group in sorted(groups, key=lambda g: (g != "", g)):
        lines += [f"### `{PACKAGE}/{group}`" if group else f"### `{PACKAGE}/` (top level)", ""]
        lines += ["| module | what it is | imports from |", "| --- | --- | --- |"]
        for rel, path in groups[group]:
            deps = ", ".join(f"`{d}`" for d in imported_packages(rel, path)) or "–"
            lines.append(f"| `{rel}` | {summary(path) or '–'} | {deps} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def updated(text: str, block: str) -> str:
    """``text`` with the map between the markers replaced by ``block``."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no module-map markers ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + block + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed map is out of date")
    args = ap.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    new = updated(text, render())
    if args.check:
        return 0 if new == text else 1
    DOC.write_text(new, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
