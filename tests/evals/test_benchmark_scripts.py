"""The benchmark scripts run and write well-formed JSON (structure only: tests never assert timings)."""

from __future__ import annotations

import json
from pathlib import Path

from evals.perf import core as perf_core
from evals.perf import middleware as perf_middleware
from evals.perf import search_stages
from remem_agent.errors import UserInputError


def test_perf_core_quick_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "core.json"
    perf_core.main(["--quick", "--out", str(out)])
    rep = json.loads(out.read_text())
    names = {t["name"] for t in rep["targets"]}
    assert {"search_p50_ms", "add_per_s", "feedback_p50_ms", "ratio_full_vs_remem_similarity_only_p50"} <= names
    assert "ratio_full_vs_similarity_p50" in rep["sizes"][0]["search"]  # the bare lookup: reported as context
    size = rep["sizes"][0]
    for path in ("full", "budgeted", "similarity_only", "remem_similarity_only"):
        assert size["search"][path]["p50_ms"] > 0
    assert rep["machine"]["cpu_count"] >= 1 and rep["wall_time_s"] > 0


def test_perf_core_reports_the_median_of_its_repeats(tmp_path: Path) -> None:
    out = tmp_path / "core.json"
    perf_core.main(["--quick", "--repeats", "3", "--queries", "8", "--warmup", "2", "--out", str(out)])
    rep = json.loads(out.read_text())
    assert rep["config"]["repeats"] == 3
    size = rep["sizes"][0]
    runs = size["repeats"]
    assert len(runs) == 3 and all(r["size"] == size["size"] for r in runs)
    for pick in (lambda s: s["add"]["per_s"], lambda s: s["search"]["full"]["p50_ms"]):
        assert pick(size) == sorted(pick(r) for r in runs)[1]  # the middle run's value, not the first's
    by_name = {t["name"]: t["measured"] for t in rep["targets"]}
    assert by_name["add_per_s"] == size["add"]["per_s"]


def test_median_of_repeats_merges_reports_number_by_number() -> None:
    from evals.perf.measure import median_of_repeats

    runs = [
        {"a": {"p50": 3.0, "n": 5}, "ok": True, "load": [1.0], "name": "x"},
        {"a": {"p50": 1.0, "n": 5}, "ok": True, "load": [2.0], "name": "x"},
        {"a": {"p50": 2.0, "n": 5}, "ok": True, "load": [1.0], "name": "x"},
    ]
    assert median_of_repeats(runs) == {
        "a": {"p50": 2.0, "n": 5},
        "ok": True,  # a bool is not a number to take the median of
        "load": [[1.0], [2.0], [1.0]],  # differing non-numbers are listed per run
        "name": "x",
    }


def test_search_stages_times_every_stage_and_restores_the_methods(tmp_path: Path) -> None:
    from remem_agent.index.flat import FlatIndex

    scan = FlatIndex.scan
    out = tmp_path / "stages.json"
    assert search_stages.main(["--size", "300", "--queries", "10", "--warmup", "5", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert set(rep["stages"]) == {"flat", "lexical", "rows", "stats", "attributes", "fuse", "rank", "record", "total"}
    assert all(rep["stages"][s]["n"] == 10 for s in rep["stages"])
    assert rep["stages"]["total"]["p50_ms"] >= rep["stages"]["rank"]["p50_ms"] > 0
    assert FlatIndex.scan is scan  # the timers are gone after the run


def test_search_ab_compares_a_commit_with_the_working_tree_in_one_process(tmp_path: Path) -> None:
    import sys

    import pytest

    from evals.perf import search_ab

    out = tmp_path / "ab.json"
    argv = ["--base", "HEAD", "--size", "300", "--queries", "6", "--warmup", "2", "--seeds", "3", "--out", str(out)]
    assert search_ab.main(argv) == 0
    rep = json.loads(out.read_text())
    (seed,) = rep["seeds"]
    assert seed["base"]["n"] == seed["new"]["n"] == 6 and seed["median_ratio_new_over_base"] > 0
    assert len(rep["base_commit"]) == 40
    assert search_ab.BASE_PACKAGE not in sys.modules  # the exported copy is unloaded after the run
    with pytest.raises(SystemExit):
        search_ab.main(["--base", "no-such-revision", "--out", str(out)])


def test_search_ab_can_pin_the_new_side_to_a_commit_and_its_configuration(tmp_path: Path) -> None:
    import sys

    import pytest

    from evals.perf import search_ab

    out = tmp_path / "ab.json"
    small = ["--size", "300", "--queries", "4", "--warmup", "1", "--seeds", "3", "--out", str(out)]
    argv = ["--base", "HEAD", "--new", "HEAD", "--new-config", '{"utility": "heuristic", "guard_top": 3}', *small]
    assert search_ab.main(argv) == 0
    rep = json.loads(out.read_text())
    assert rep["new_commit"] == rep["base_commit"] and rep["new_config"] == {"utility": "heuristic", "guard_top": 3}
    assert search_ab.NEW_PACKAGE not in sys.modules and search_ab.BASE_PACKAGE not in sys.modules
    for bad in ('{"no_such_field": 1}', "[1]", "not json"):
        with pytest.raises((SystemExit, UserInputError)):
            search_ab.main(["--base", "HEAD", "--new-config", bad, *small])


def test_search_ab_range_measures_each_commit_that_touched_the_library(tmp_path: Path) -> None:
    import subprocess

    from evals.perf import search_ab_range
    from evals.perf.measure import REPO_ROOT

    # the range from just before the newest commit that touched the library: exactly that commit is measured
    last = subprocess.run(
        ["git", "log", "-1", "--format=%H", "--", "remem_agent"], cwd=REPO_ROOT, capture_output=True, text=True
    ).stdout.strip()
    (touched,) = search_ab_range.commits(f"{last}~1", "HEAD")
    assert touched[0] == last and touched[1]
    out = tmp_path / "range.json"
    small = ["--size", "300", "--queries", "4", "--warmup", "1", "--seeds", "3", "--out", str(out)]
    assert search_ab_range.main(["--base", f"{last}~1", *small]) == 0
    rep = json.loads(out.read_text())
    (row,) = rep["commits"]
    assert row["commit"] == last and row["subject"] == touched[1] and row["median_ratio_new_over_base"] > 0


def test_add_ab_compares_a_commit_with_the_working_tree_in_one_process(tmp_path: Path) -> None:
    import sys

    import pytest

    from evals.perf import add_ab, search_ab

    out = tmp_path / "add_ab.json"
    argv = ["--base", "HEAD", "--size", "300", "--batch", "100", "--rounds", "2", "--out", str(out)]
    assert add_ab.main(argv) == 0
    rep = json.loads(out.read_text())
    assert rep["batches"] == 6 and rep["adds_per_s"]["base"] > 0 and rep["adds_per_s"]["new"] > 0
    assert rep["ratio_new_over_base"]["q1"] <= rep["ratio_new_over_base"]["median"] <= rep["ratio_new_over_base"]["q3"]
    assert rep["cpu_ratio_new_over_base"]["median"] > 0 and len(rep["base_commit"]) == 40
    assert search_ab.BASE_PACKAGE not in sys.modules  # the exported copy is unloaded after the run
    with pytest.raises(SystemExit):
        add_ab.main(["--base", "no-such-revision", "--out", str(out)])


def test_perf_middleware_quick_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "mw.json"
    assert perf_middleware.main(["--quick", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["result"]["verify_ok"] is True
    assert rep["result"]["overhead"]["n"] == 40 and rep["result"]["overhead"]["p50_ms"] > 0
    assert "met" in rep["target"]


def test_similarity_only_preset_ranks_by_cosine_and_ignores_feedback(tmp_path: Path) -> None:
    from remem_agent import ReMem, RememConfig

    mem = ReMem(tmp_path, config=RememConfig.similarity_only())
    q = "How do I ship the release to production?"
    look = mem.add("Release day notes: the production release channel has a new bot avatar.", timestamp=1)
    good = mem.add("Before shipping, run the database migration script, then tag the build.", timestamp=1)
    for r in range(8):
        res = mem.search(q, k=2, task="deploy", now=10 + r)
        assert res.ids[0] == look
        assert [h.similarity for h in res.items] == sorted((h.similarity for h in res.items), reverse=True)
        mem.feedback(res.search_id, success=True, used_ids=[good])
    assert mem.get(look).state.value == "ACTIVE"  # retention off in system A


def _run_module(module: str, argv: list[str], *, timeout_s: float) -> None:
    """``python -m module argv`` from the repository root, in its own process; it must exit 0."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_perf_postgres_quick_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "pg.json"
    _run_module("evals.perf.postgres", ["--quick", "--out", str(out), "--tmpdir", str(tmp_path)], timeout_s=300)
    rep = json.loads(out.read_text())
    assert rep["benchmark"] == "perf_postgres" and rep["quick"] is True
    assert rep["machine"]["postgres"]["pgvector"] and "git_commit" in rep
    size = rep["sizes"][0]
    for backend in ("sqlite", "postgres"):
        assert size[backend]["add"]["per_s"] > 0
        assert size[backend]["search"]["p50_ms"] > 0 and size[backend]["search"]["p95_ms"] > 0
        assert size[backend]["feedback"]["p50_ms"] > 0
    assert 0.0 <= size["recall"]["topk_recall"] <= 1.0 and 0.0 <= size["recall"]["pool_recall"] <= 1.0
    users = size["user_scopes"]
    assert users["users"] == 3 and users["search"]["postgres"]["n"] == users["served_agreement"]["queries"] == 40
    assert users["served_agreement"]["mean"] > 0.5  # small scopes are ranked exactly on both backends
    conc = rep["concurrency"]
    assert conc["workers"] == 4 and conc["feedback_calls"] == 4 * conc["cycles_per_worker"]
    assert conc["lost_updates"] == 0 and conc["rows_differing"] == 0
    assert conc["verify_ok"] is True and conc["worker_errors"] == 0
    assert conc["sent_totals"]["shown"] == conc["ledger_totals"]["shown"] > 0
    retries = conc["retries"]
    assert retries["learning_retries"] == sum(retries["per_worker"])  # the total is the workers' counts added up
    assert sum(retries["feedbacks_by_attempts"].values()) == conc["feedback_calls"]  # each feedback counted once


def test_embed_ceiling_counts_the_model_and_writes_its_report(tmp_path: Path) -> None:
    import pytest

    from evals.perf import embed_ceiling
    from remem_agent.embedders.onnx import onnx_available

    # 6 layers x (4 attention weights 384x384 + 384x1536 + 1536x384) per token, plus attention over 10 tokens
    assert embed_ceiling.WEIGHT_MACS_PER_TOKEN == 6 * (4 * 384 * 384 + 2 * 384 * 1536) == 10_616_832
    assert embed_ceiling.macs_per_text(10) == 10 * 10_616_832 + 6 * 2 * 10 * 10 * 384
    if not onnx_available():
        pytest.skip("the onnx extra is not installed")
    out = tmp_path / "ceiling.json"
    assert embed_ceiling.main(["--texts", "8", "--batch", "2", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert set(rep["ceiling_texts_per_s"]) == set(rep["onnx_measured"]) == {"1", "2"}
    assert rep["texts"]["n"] == 8 and rep["texts"]["mean_tokens"] > 2
    assert all(v > 0 for v in rep["ceiling_texts_per_s"].values())


def test_pg_contention_quick_runs_every_workload_on_both_packages(tmp_path: Path) -> None:
    out = tmp_path / "pgc.json"
    argv = [
        "--quick",
        "--workers",
        "2",
        "--repeats",
        "1",
        "--base",
        "HEAD",
        "--out",
        str(out),
        "--tmpdir",
        str(tmp_path),
    ]
    _run_module("evals.perf.pg_contention", argv, timeout_s=600)
    rep = json.loads(out.read_text())
    assert rep["benchmark"] == "pg_contention" and rep["quick"] is True and rep["base_commit"]
    for package in ("head", "base"):
        assert set(rep[package]) == {"feedback_shared", "mixed", "shuffled_batches"}
        for workload, runs in rep[package].items():
            (run,) = runs
            assert run["workload"] == workload and run["workers"] == 2
            assert run["verify_ok"] is True and run["workers_given_up"] == 0, run["errors"]
            assert run["operations"] == 2 * rep["sizes"][workload]
            assert run["learning_transactions"] > 0 and isinstance(run["learning_reruns"], int)
            if package == "head":  # lock order and commutative writes: the current code never deadlocks
                assert run["deadlocks"] == 0, (workload, run["deadlocks"])


def test_perf_protocols_measures_every_chat_route(tmp_path: Path) -> None:
    out = tmp_path / "protocols.json"
    _run_module("evals.perf.protocols", ["--memories", "50", "--requests", "5", "--out", str(out)], timeout_s=300)
    report = json.loads(out.read_text())
    from evals.perf.protocols import ROUTES

    assert set(report["routes"]) == {*ROUTES, "direct"} and report["embedder"] == "hash"
    assert all(r["errors"] == 0 and r["latency"]["n"] == 5 for r in report["routes"].values()), report["routes"]
    assert set(report["summary"]["overhead_p50_ms"]) == set(ROUTES)
