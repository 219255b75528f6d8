"""The `remem` command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remem_agent import ReMem, RememConfig
from remem_agent.cli import main
from remem_agent.demo import run_demo


def test_demo_learns_and_verifies(tmp_path: Path) -> None:
    lines: list[str] = []
    summary = run_demo(tmp_path / "demo", out=lines.append, model="none")
    assert summary["current_region"] == "Our server moved to west-2."
    assert summary["as_of_region"] == "Our server is in east-1."
    assert summary["east_state"] == "INVALIDATED"
    before, after = summary["before"], summary["after"]
    assert isinstance(before, list) and isinstance(after, list)
    # the look-alike started on top and the helpful note overtook it through feedback alone
    assert before[0] != after[0]
    assert summary["helpful_first_after"] is True
    assert summary["verify_ok"] is True
    assert any("verify(): ok" in line for line in lines)


def test_cli_demo_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--model", "none"]) == 0
    assert "Our server moved to west-2." in capsys.readouterr().out


def test_demo_runs_the_agent_loop_with_a_local_model(tmp_path: Path) -> None:
    """The real local GGUF (SmolLM2: fast, weak content) through MemoryAgent: valid cited answers + trace."""
    pytest.importorskip("llama_cpp")
    from remem_agent.agent import load_traces

    lines: list[str] = []
    summary = run_demo(tmp_path / "demo", out=lines.append, model="smollm2")
    agent = summary["agent"]
    assert isinstance(agent, dict) and agent["ran"] is True, agent
    traces = load_traces(agent["trace"])
    assert len(traces) == 2
    for t in traces:
        assert t["model"]["adapter"] == "llamacpp" and t["answer"] is not None  # schema-valid answer
        assert t["outcome"]["source"] == "truth" and set(t["citations"]) <= {s["id"] for s in t["served"]}


def test_cli_verify_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add("a fact")
    assert main(["verify", str(tmp_path / "s")]) == 0
    assert capsys.readouterr().out.strip().endswith("ok")
    assert main(["stats", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert '"memories": 1' in out and '"reranker": null' in out


def test_cli_stats_shows_the_store_reranker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ReMem(tmp_path / "s", config=RememConfig(rerank="store")) as mem:
        ids = mem.add_many(["we met on 3 May", "a note about the weather", "another note about lunch"])
        for _ in range(6):
            mem.feedback(mem.search("When did we meet?", k=3).search_id, success=True, used_ids=[ids[0]])
        state = mem.fit_reranker()
    assert state.model is not None
    assert main(["stats", str(tmp_path / "s")]) == 0
    shown = json.loads(capsys.readouterr().out)["reranker"]
    assert shown["answered_at_last_fit"] == 6 and shown["baseline"] == 0
    assert shown["model"]["weights"] == state.model.describe()["weights"]
    with ReMem(tmp_path / "s", config=RememConfig(rerank="store")) as mem:
        assert mem.stats().reranker == shown  # the API's stats and the CLI's agree


def test_cli_refuses_a_folder_that_is_not_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(tmp_path)]) == 2
    assert "not a remem store" in capsys.readouterr().err


def test_serve_offers_exactly_the_registrys_embedders(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    import remem_agent.gateway
    from remem_agent.embedders.registry import EMBEDDER_NAMES

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    offered = re.search(r"--embedder \{([^}]*)\}", capsys.readouterr().out)
    assert offered is not None and tuple(offered.group(1).split(",")) == EMBEDDER_NAMES
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--embedder", "word2vec"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "'word2vec'" in err and all(name in err for name in EMBEDDER_NAMES), err
    served: list[str] = []
    monkeypatch.setattr(remem_agent.gateway, "serve", lambda config: served.append(config.embedder))
    for name in EMBEDDER_NAMES:  # each one reaches the gateway's config as given
        assert main(["serve", "--embedder", name]) == 0
    assert tuple(served) == EMBEDDER_NAMES
