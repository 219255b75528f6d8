"""evals/analysis/call_path.py: the module crossings of one gateway chat request."""

from __future__ import annotations

import itertools

import pytest

from evals.analysis import call_path


@pytest.mark.parametrize("protocol", ["openai", "ollama"])
def test_a_chat_request_is_followed_from_the_route_through_the_memory_to_the_model(protocol: str) -> None:
    report = call_path.measure(protocol)
    edges = {(c["from"], c["to"]) for c in report["crossings"]}
    modules = set(report["modules"])
    route = "remem_agent.gateway.openai_routes" if protocol == "openai" else "remem_agent.gateway.ollama_routes"
    # the route, the agent's chat stage, the recall in a worker thread, the model call: all seen
    assert {route, "remem_agent.agent.chat", "remem_agent.memory", "remem_agent.adapters.fakes"} <= modules
    assert any(b == "remem_agent.memory" for _, b in edges)  # entered from another module
    assert report["distinct_crossings"] == len(edges) and all(a != b for a, b in edges)
    assert report["distinct_modules"] == len(modules)


@pytest.mark.parametrize("protocol", ["openai", "ollama"])
def test_the_spine_from_the_gateway_to_the_model_crosses_at_most_ten_modules(protocol: str) -> None:
    report = call_path.measure(protocol)
    spine = report["spine"]
    assert spine[0] == "remem_agent.gateway.app" and spine[-1] == "remem_agent.adapters.fakes"
    assert "remem_agent.agent.chat" in spine and "remem_agent.gateway.upstream" in spine
    assert all(a != b for a, b in itertools.pairwise(spine))
    assert report["spine_crossings"] == len(spine) - 1 <= 10


def test_the_spine_counts_only_frames_of_the_library() -> None:
    import sys

    def inner() -> list[str]:
        return call_path.spine(sys._getframe())

    assert call_path.spine(None) == []
    assert inner() == []  # a test module is not remem_agent: nothing on its stack counts
