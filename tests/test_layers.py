"""The layering rules docs/ARCHITECTURE.md states, each checked against the code's import graph.

The layer table is read from the document itself (between its ``<!-- layers`` and ``<!-- end of layers -->``
markers), so the document and the check cannot drift apart: a module in no layer, a layer named twice, or an
import into a higher layer fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_import_graph import cycles, import_graph

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
LIB = "remem_agent"


def unit(module: str) -> str:
    """The layered unit a module belongs to: its top-level package or module (``__init__`` for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layers(text: str) -> dict[str, int]:
    """The layer of each unit, as the document's table gives it."""
    block = re.search(r"<!-- layers.*?-->(.*?)<!-- end of layers -->", text, re.S)
    assert block, "docs/ARCHITECTURE.md has no layer table"
    out: dict[str, int] = {}
    for row in block.group(1).splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", row)
        if not m:
            continue
        for name in re.findall(r"`([^`]+)`", m.group(2)):
            assert name not in out, f"{name} is in two layers"
            out[name] = int(m.group(1))
    return out


def unit_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """unit -> imported unit -> the (module, module) imports behind that arrow."""
    out: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for module, deps in graph.items():
        if not module.startswith(LIB):
            continue
        for dep in deps:
            if dep.startswith(LIB + ".") and unit(dep) != unit(module):
                out.setdefault(unit(module), {}).setdefault(unit(dep), []).append((module, dep))
    return out


def upward(graph: dict[str, set[str]], layer: dict[str, int]) -> list[str]:
    return sorted(
        f"{a} (layer {layer[a]}) -> {b} (layer {layer[b]}): {edges[0][0]} imports {edges[0][1]}"
        for a, targets in unit_graph(graph).items()
        for b, edges in targets.items()
        if layer[b] > layer[a]
    )


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph([LIB])


def test_every_package_and_module_has_one_layer(graph: dict[str, set[str]]) -> None:
    layer = layers(DOC.read_text(encoding="utf-8"))
    units = {unit(m) for m in graph}
    assert units - set(layer) == set(), "add these to the layer table of docs/ARCHITECTURE.md"
    assert set(layer) - units == set(), "the layer table names units that do not exist"


def test_no_import_runs_to_a_higher_layer(graph: dict[str, set[str]]) -> None:
    assert upward(graph, layers(DOC.read_text(encoding="utf-8"))) == []


def test_the_packages_graph_has_no_cycle(graph: dict[str, set[str]]) -> None:
    units: dict[str, set[str]] = {unit(m): set() for m in graph}
    for a, targets in unit_graph(graph).items():
        units[a] |= set(targets)
    assert cycles(units) == []


def test_the_checker_sees_an_upward_arrow() -> None:
    """The checks themselves: a lower unit importing a higher one is reported, a cycle of units is found."""
    graph = {"remem_agent.store.sql": {"remem_agent.learning.lifecycle"}, "remem_agent.learning.lifecycle": set()}
    found = upward(graph, {"store": 3, "learning": 4})
    assert found == [
        "store (layer 3) -> learning (layer 4): remem_agent.store.sql imports remem_agent.learning.lifecycle"
    ]
    graph["remem_agent.learning.lifecycle"] = {"remem_agent.store.base"}
    graph["remem_agent.store.base"] = set()
    assert cycles({a: set(t) for a, t in unit_graph(graph).items()}) == [["learning", "store"]]


def _closure(graph: dict[str, set[str]], module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_agent_and_adapters_reach_no_store_ranking_or_memory(graph: dict[str, set[str]]) -> None:
    """Not even through another module: an agent runs over any ``AgentMemory``, a remote one included."""
    banned = ("remem_agent.store", "remem_agent.ranking", "remem_agent.memory")
    offenders = {
        module: sorted(d for d in _closure(graph, module) if d == banned[2] or d.startswith(banned[:2]))
        for module in graph
        if module.startswith(("remem_agent.agent", "remem_agent.adapters"))
    }
    assert {m: d for m, d in offenders.items() if d} == {}


def test_ranking_and_learning_read_their_policy_protocols_not_the_config(graph: dict[str, set[str]]) -> None:
    importers = sorted(m for m, deps in graph.items() if "remem_agent.config" in deps)
    assert not [m for m in importers if unit(m) in ("ranking", "learning")], importers


def test_the_harness_packages_import_as_documented() -> None:
    allowed = {
        "harness": {"harness"},
        "analysis": {"harness", "analysis"},
        "perf": {"harness", "perf"},
        "bench": {"harness", "analysis", "bench"},
    }
    graph = import_graph(["evals"])
    wrong = sorted(
        f"{m} imports {d}"
        for m, deps in graph.items()
        for d in deps
        if m.count(".") >= 1
        and d.count(".") >= 1
        and d.split(".")[1] not in allowed.get(m.split(".")[1], {d.split(".")[1]})
    )
    assert wrong == []
