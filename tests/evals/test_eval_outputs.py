"""The benchmark's output tools (plots, failure analysis, ranking demo) run on a tiny benchmark (structure only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from evals.analysis import failure_analysis, plots
from evals.bench import demo_ranking, run_benchmark
from evals.harness.families import make_world
from evals.harness.reader import ReaderParams
from evals.harness.world import WorldParams, key_name

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quick benchmark: distractor, contradiction, state_change; seeds 0-1; 120 tasks per world."""
    out = tmp_path_factory.mktemp("bench")
    assert run_benchmark.main(["--quick", "--out", str(out), "--workers", "1"]) == 0
    assert json.loads((out / "benchmark.json").read_text())["params"]["tasks_per_world"] == 120
    return out


def test_plots_are_valid_pngs(bench: Path) -> None:
    pytest.importorskip("matplotlib")
    assert plots.main(["--bench", str(bench)]) == 0
    names = {p.name for p in (bench / "plots").glob("*.png")}
    assert {"headline.png", "per_family_first.png", "stale_in_context_first.png"} <= names
    assert {"per_family_latest.png", "stale_in_context_latest.png"} <= names
    for name in names:
        data = (bench / "plots" / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5_000


def test_plots_name_the_install_command_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plots._pyplot()


def test_failure_analysis_writes_tagged_failures_and_tables(bench: Path) -> None:
    assert failure_analysis.main(["--bench", str(bench)]) == 0
    lines = (bench / "failures.jsonl").read_text().splitlines()
    runs = [
        r
        for p in sorted((bench / "runs").glob("*/*.json"))
        for r in json.loads(p.read_text())["runs"]
        if r["system"] == "C" and r["reader"] == "first"
    ]
    failed = sum(not row["success"] for r in runs for row in r["rows"])
    assert failed > 0 and len(lines) == failed
    for line in lines:
        rec = json.loads(line)
        assert rec["system"] == "C" and rec["reader"] == "first"
        assert rec["tags"][0] == "failure" and set(rec["tags"]) <= set(failure_analysis.TAGS)
        assert rec["cause"] in failure_analysis.CAUSES
        assert all(len(s) == 3 for s in rec["served"])
        if "gold_never_served" not in rec["tags"]:
            assert any(status == "current" for _, _, status in rec["served"])
    md = (bench / "failure_analysis.md").read_text()
    assert "0 replay mismatches" in md  # worlds were regenerated with the run's 120 tasks
    for heading in ("## Summary (core families)", "## Cause of failure per family, system C", "## Examples"):
        assert heading in md
    assert "| family | tasks | success | gold never served |" in md
    assert "| tag (% of core tasks) | C | A |" in md
    for fam in ("distractor", "contradiction", "state_change"):
        assert f"| {fam} |" in md


def test_failure_analysis_other_system_and_reader(bench: Path) -> None:
    assert failure_analysis.main(["--bench", str(bench), "--system", "A", "--reader", "latest"]) == 0
    recs = [json.loads(x) for x in (bench / "failures.jsonl").read_text().splitlines()]
    assert recs and {(r["system"], r["reader"]) for r in recs} == {("A", "latest")}
    assert not any("similar_correct_pushed_out" in r["tags"] for r in recs)  # only defined against A


def test_failure_analysis_refuses_a_world_of_another_size(bench: Path) -> None:
    runs = json.loads((bench / "runs" / "distractor" / "0.json").read_text())["runs"]
    rows = next(r for r in runs if r["system"] == "C" and r["reader"] == "first")["rows"]
    world = make_world("distractor", 0, WorldParams())  # 300 tasks, the run had 120
    with pytest.raises(ValueError, match="another --tasks"):
        failure_analysis.analyse_world(world, rows, reader=ReaderParams(), system="C")


def test_demo_ranking_finds_a_lookalike_kept_out(tmp_path: Path) -> None:
    out = tmp_path / "demo.md"
    assert demo_ranking.main(["--family", "distractor", "--seed", "1", "--tasks", "120", "--out", str(out)]) == 0
    md = out.read_text()
    assert md.startswith("# More similar is not more useful")
    world = make_world("distractor", 1, WorldParams(n_tasks=120))
    cases, counts = demo_ranking.probe_world(world, demo_ranking.load_systems()["C"], ReaderParams())
    assert counts["tasks"] == 120 and len(cases) >= 1
    assert f"**{len(cases)} of 120 tasks**" in md
    for c in cases:
        assert c.trap.kind == "trap" and c.gold.key is not None
        assert c.gold.value == c.task.truth[key_name(c.gold.key)]
        assert c.trap_cand["similarity"] > c.gold_hit["similarity"]
        assert c.gold_hit["components"] and c.trap_cand["components"]
    assert 1 <= md.count("## Task ") <= 5
    assert "| component | gold | look-alike | gold − look-alike |" in md
