"""The tests mirror the package: each folder of ``tests/`` is a package of ``remem_agent`` (or ``evals``), and every
module of ``remem_agent`` is imported by name in some test.

``NOT_IMPORTED_BY_NAME`` lists the modules no test imports by name yet, as they were when the rule came in (they
are exercised through the public surface only). It is a ratchet: a module may leave the list, never join it, and
one that a test now imports must leave it.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent / "remem_agent"
NOT_IMPORTED_BY_NAME = {
    "remem_agent._extras",
    "remem_agent.adapters.retry",
    "remem_agent.agent._spans",
    "remem_agent.agent.ask",
    "remem_agent.agent.call",
    "remem_agent.agent.capture",
    "remem_agent.agent.chat",
    "remem_agent.agent.enforce",
    "remem_agent.agent.middleware",
    "remem_agent.agent.ports",
    "remem_agent.agent.scoring",
    "remem_agent.agent.stream",
    "remem_agent.agent.verdicts",
    "remem_agent.embedders.threads",
    "remem_agent.gateway.limits",
    "remem_agent.gateway.metrics",
    "remem_agent.gateway.protocol",
    "remem_agent.index.chroma_backend",
    "remem_agent.index.faiss_backend",
    "remem_agent.maintenance",
    "remem_agent.store.sqlite_cache",
    "remem_agent.store.verify",
    "remem_agent.store_terms",
    "remem_agent.viz.ledger_cli",
}


def _modules() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append(".".join(parts))
    return out


def _imported_names() -> set[str]:
    """Every ``remem_agent`` module a test file names in an import (``from pkg import mod`` counts ``pkg.mod``)."""
    names: set[str] = set()
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    # a package counts once any of its modules is imported
    names |= {name.rsplit(".", i)[0] for name in names for i in range(1, name.count(".") + 1)}
    return {n for n in names if n == "remem_agent" or n.startswith("remem_agent.")}


def test_every_test_folder_is_a_package_of_the_library_or_the_harness() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "fixtures" and p.name[0] not in "_."}
    assert folders <= packages | {"evals"}, folders - packages
    assert not list(TESTS.glob("*/__init__.py")), "test folders are not packages: module names stay unique"


def test_every_module_is_imported_by_name_in_a_test_but_the_listed_ones() -> None:
    modules = set(_modules())
    missing = modules - _imported_names()
    assert modules >= NOT_IMPORTED_BY_NAME, "a listed module is gone: take it off the list"
    assert missing <= NOT_IMPORTED_BY_NAME, f"imported by no test: {sorted(missing - NOT_IMPORTED_BY_NAME)}"
    assert missing >= NOT_IMPORTED_BY_NAME, f"now imported, take off the list: {sorted(NOT_IMPORTED_BY_NAME - missing)}"


def test_every_public_handler_of_a_route_module_is_mounted() -> None:
    """A handler written and never mounted answers 404 forever: each public coroutine of a route module is named
    in the app's route table."""
    from remem_agent.gateway import anthropic_routes, app, memory_routes, ollama_routes, openai_routes, responses_routes

    table = inspect.getsource(app.create_app)
    for module in (anthropic_routes, memory_routes, ollama_routes, openai_routes, responses_routes):
        short = module.__name__.rsplit(".", 1)[1]
        handlers = [
            name
            for name, fn in vars(module).items()
            if inspect.iscoroutinefunction(fn) and not name.startswith("_") and fn.__module__ == module.__name__
        ]
        assert handlers, short
        for name in handlers:
            assert re.search(rf"\b{short}\.{name}\b", table), f"{short}.{name} is not mounted"
