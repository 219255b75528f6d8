"""The real-LLM evaluation pipeline (evals.bench.run_llm_agent, evals.analysis.analyze_traces, trace_prompts)
on scripted models."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from evals.analysis import analyze_traces, trace_prompts
from evals.bench import run_llm_agent
from evals.harness.families import make_world
from evals.harness.systems import load_systems
from evals.harness.world import WorldParams
from remem_agent.agent.trace import load_traces

N_TASKS = 10


def _run_cli(tmp_path: Path, adapter: str, *extra: str) -> tuple[Path, Path]:
    out, traces = tmp_path / "out", tmp_path / "traces"
    run_llm_agent.main(
        [
            "--adapter",
            adapter,
            "--family",
            "contradiction,state_change",
            "--seeds",
            "0,1",
            "--tasks",
            str(N_TASKS),
            "--systems",
            "A,C",
            "--out",
            str(out),
            "--trace-dir",
            str(traces),
            *extra,
        ]
    )
    return out, traces


def test_truthful_run_summary_traces_and_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, traces = _run_cli(tmp_path, "scripted-truthful")
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["by_family"]) == {"contradiction", "state_change"}
    for fam in ("contradiction", "state_change"):
        for s in ("A", "C"):
            e = summary["by_family"][fam][s]
            assert e["seeds"] == [0, 1] and e["tasks"] == 2 * N_TASKS
            assert e["success"]["mean"] == 1.0 and e["success"]["n"] == 2
            for m in ("stale_served", "stale_cited", "invalid_final", "latency_ms_mean", "prompt_tokens_per_task"):
                assert set(e[m]) == {"mean", "ci95", "n"}
        assert summary["paired_C_minus_A"][fam]["success"]["mean"] == 0.0
    runs = sorted((out / "runs").glob("*.json"))
    assert len(runs) == 8
    one = json.loads(runs[0].read_text())
    assert one["complete"] and one["n_tasks"] == N_TASKS and len(one["rows"]) == N_TASKS
    files = sorted(traces.glob("*.jsonl"))
    assert [f.name for f in files][:2] == ["contradiction_0_A.jsonl", "contradiction_0_C.jsonl"]
    for f in files:
        recs = load_traces(f)
        assert len(recs) == N_TASKS
        assert {r["system"] for r in recs} == {f.stem.rsplit("_", 1)[-1]}
        for r in recs:
            keys = [k for k in r["schema"]["properties"] if k != "citations"]
            assert keys == list(r["truth"]) and all("." in k for k in keys)
            assert r["outcome"]["success"] and r["answer"] == r["truth"]
    # resumable: a second invocation skips every finished run and leaves the traces alone
    capsys.readouterr()
    before = {f: f.stat().st_mtime_ns for f in files}
    _run_cli(tmp_path, "scripted-truthful")
    assert capsys.readouterr().out.count("done, skipped") == 8
    assert before == {f: f.stat().st_mtime_ns for f in files}
    # the analysis from the traces alone agrees with the runner
    res = analyze_traces.analyze(files)
    for s in ("A", "C"):
        assert res["per_system"][s]["lines"] == 4 * N_TASKS
        assert res["per_system"][s]["successes"] == 4 * N_TASKS
        assert sum(res["per_system"][s]["primary"].values()) == 0


def test_stale_metrics_agree_between_runner_and_trace_analysis(tmp_path: Path) -> None:
    """The runner knows the world, the analyzer only the traces: their stale-served rates must match."""
    out, traces = tmp_path / "out", tmp_path / "traces"
    run_llm_agent.main(
        [
            *("--adapter", "scripted-first-served", "--family", "contradiction", "--seeds", "0", "--tasks", "30"),
            *("--systems", "A,C", "--out", str(out), "--trace-dir", str(traces)),
        ]
    )
    for s in ("A", "C"):
        run = json.loads((out / "runs" / f"contradiction_0_{s}.json").read_text())
        res = analyze_traces.analyze([traces / f"contradiction_0_{s}.jsonl"])
        flags = res["per_system"][s]["flags"]
        assert flags["stale_served"] == sum(r["stale_served"] for r in run["rows"])
        assert flags["gold_served"] == sum(r["gold_served"] for r in run["rows"])
        assert res["per_system"][s]["successes"] == sum(r["success"] for r in run["rows"])


def test_wrong_key_and_invalid_json_are_classified(tmp_path: Path) -> None:
    out_w, tr_w = _run_cli(tmp_path / "w", "scripted-wrong-key")
    summary = json.loads((out_w / "summary.json").read_text())
    assert summary["by_family"]["contradiction"]["A"]["success"]["mean"] == 0.0
    assert summary["by_family"]["contradiction"]["A"]["invalid_final"]["mean"] == 1.0
    res = analyze_traces.analyze(sorted(tr_w.glob("*.jsonl")))
    for s in ("A", "C"):
        prim = res["per_system"][s]["primary"]
        assert prim["right_value_wrong_key"] == 4 * N_TASKS, prim
    # free output mode: no native schema, the middleware still validates and re-asks
    out_i, tr_i = _run_cli(tmp_path / "i", "scripted-invalid-json", "--output-mode", "free")
    res = analyze_traces.analyze(sorted(tr_i.glob("*.jsonl")))
    for s in ("A", "C"):
        row = res["per_system"][s]
        assert row["primary"]["invalid_json"] == 4 * N_TASKS
        assert row["flags"]["reasked"] == 4 * N_TASKS
    recs = load_traces(tr_i / "contradiction_0_A.jsonl")
    assert all(r["model"]["native_json_schema"] is False and len(r["attempts"]) == 3 for r in recs)
    summary = json.loads((out_i / "summary.json").read_text())
    assert summary["by_family"]["state_change"]["C"]["invalid_json_attempt_rate"]["mean"] == 1.0
    # the markdown report and the pretty-printer work on these traces
    analyze_traces.main([*map(str, sorted(tr_i.glob("*.jsonl"))), "--out", str(tmp_path / "an")])
    md = (tmp_path / "an" / "analysis.md").read_text()
    assert "invalid_json" in md and (tmp_path / "an" / "analysis.json").is_file()


def test_right_value_failing_validation_and_distractor_answers(tmp_path: Path) -> None:
    _, tr = _run_cli(tmp_path / "u", "scripted-unserved-cite")
    res = analyze_traces.analyze(sorted(tr.glob("*.jsonl")))
    for s in ("A", "C"):
        row = res["per_system"][s]
        failures = row["failures"]
        assert failures >= 3 * N_TASKS  # every ask with a served memory fails: the cited id was not served
        assert row["primary"]["invalid_right_value"] == failures
        assert row["flags_among_failures"]["unknown_citation"] == failures
    # A repeated citation no longer costs the answer: the middleware keeps the id once (seen in real traces).
    _, tr = _run_cli(tmp_path / "d", "scripted-dup-cite")
    res = analyze_traces.analyze(sorted(tr.glob("*.jsonl")))
    for s in ("A", "C"):
        row = res["per_system"][s]
        assert row["primary"].get("invalid_right_value", 0) == 0
        assert row["flags_among_failures"].get("duplicate_citations", 0) == 0
    _, tr = _run_cli(tmp_path / "f", "scripted-first-served")
    res = analyze_traces.analyze(sorted(tr.glob("*.jsonl")))
    prim = res["per_system"]["A"]["primary"]
    assert sum(prim.values()) == res["per_system"]["A"]["failures"] > 0
    assert prim["answered_distractor"] + prim["answered_stale"] + prim["gold_never_served"] > 0


def test_memory_id_answers_are_classified() -> None:
    rec = {
        "truth": {"maps.region": "eu-west-1"},
        "answer": {"maps.region": "m_01a22c3b0f65e39742b55051"},
        "citations": [],
        "served": [{"id": "m_01a22c3b0f65e39742b55051", "text": "The maps service runs in region eu-west-1."}],
        "attempts": [{"raw": '{"maps.region": "m_01a22c3b0f65e39742b55051", "citations": []}', "kind": "ok"}],
        "outcome": {"success": False},
    }
    assert analyze_traces.classify(rec, {"region": {"eu-west-1"}})["primary"] == "answered_memory_id"
    # per-ask aliases: a label written as the answer names the memory it maps to
    mid = "m_01a22c3b0f65e39742b55051"
    alias_rec = {**rec, "aliases": {"M1": mid}, "answer": {"maps.region": "[M1]"}}
    assert analyze_traces.classify(alias_rec, {"region": {"eu-west-1"}})["primary"] == "answered_memory_id"
    assert analyze_traces.memory_ref(alias_rec, "M1") == mid and analyze_traces.memory_ref(alias_rec, "M9") == "?"
    assert analyze_traces.memory_ref(alias_rec, "eu-west-1") is None
    assert analyze_traces.memory_ref(rec, "M1") is None  # old traces have no aliases: "M1" is a plain value


def test_trace_heuristics() -> None:
    dom = {"eu-west-1", "us-east-1", "us-west-2"}
    assert analyze_traces.memory_kind("The maps service runs in region eu-west-1.", "maps.region", "eu-west-1", dom)
    assert (
        analyze_traces.memory_kind("The maps service moved to region us-east-1.", "maps.region", "eu-west-1", dom)
        == "stale"
    )
    assert (
        analyze_traces.memory_kind("The geo-maps service runs in us-east-1.", "maps.region", "eu-west-1", dom) is None
    )
    assert analyze_traces.memory_kind("Which region should the maps service use?", "maps.region", "x", set()) is None
    assert analyze_traces.holds("version v1.4.", "v1.4") and not analyze_traces.holds("version v1.45", "v1.4")
    rec = {"answer": None, "attempts": [{"raw": '{"maps": "eu-west-1", "citations": []}'}]}
    assert analyze_traces.right_value_wrong_key(rec, {"maps.region": "eu-west-1"})
    rec = {"answer": {"maps.region": "eu-west-1"}, "attempts": [{"raw": '{"maps.region": "eu-west-1"}'}]}
    assert not analyze_traces.right_value_wrong_key(rec, {"maps.region": "eu-west-1"})


def test_run_one_direct_and_trace_prompts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    world = make_world("state_change", 3, WorldParams(n_tasks=6))
    truths = {t.query: t.truth for t in world.tasks()}
    model = run_llm_agent.scripted_model("truthful", truths.get)
    system = load_systems()["C"]
    res = asyncio.run(run_llm_agent.run_one(world, system, model, trace_path=tmp_path / "t.jsonl", run_id="x"))
    assert res["complete"] and res["n_tasks"] == 6 and res["success"] == 1.0
    trace_prompts.main([str(tmp_path / "t.jsonl"), "--n", "2"])
    text = capsys.readouterr().out
    assert text.count("[system]") == 2 and "Question:" in text and "2 of 6 shown" in text


def test_deadline_keeps_a_partial_run(tmp_path: Path) -> None:
    world = make_world("contradiction", 0, WorldParams(n_tasks=5))
    model = run_llm_agent.scripted_model("truthful", {t.query: t.truth for t in world.tasks()}.get)
    res = asyncio.run(
        run_llm_agent.run_one(
            world, load_systems()["A"], model, trace_path=tmp_path / "t.jsonl", run_id="x", deadline=0.0
        )
    )
    assert not res["complete"] and res["n_tasks"] == 0


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python not installed")
def test_real_smollm2_end_to_end(tmp_path: Path) -> None:
    try:
        from remem_agent.adapters.gguf import smollm2_path

        smollm2_path()
    except ImportError as exc:  # ModelNotAvailableError is an ImportError
        pytest.skip(str(exc))
    out, traces = tmp_path / "out", tmp_path / "traces"
    run_llm_agent.main(
        [
            *("--adapter", "llamacpp", "--model", "smollm2", "--family", "contradiction", "--seeds", "0"),
            *("--tasks", "3", "--systems", "A,C", "--out", str(out), "--trace-dir", str(traces)),
            *("--max-tokens", "160"),
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_family"]["contradiction"]["C"]["tasks"] == 3
    for s in ("A", "C"):
        recs = load_traces(traces / f"contradiction_0_{s}.jsonl")
        assert len(recs) == 3 and all(r["model"]["adapter"] == "llamacpp" for r in recs)
    res = analyze_traces.analyze(sorted(traces.glob("*.jsonl")))
    assert res["per_system"]["A"]["lines"] == 3


def test_aggregate_pairs_partial_runs_on_common_tasks(tmp_path: Path) -> None:
    out, _ = _run_cli(tmp_path, "scripted-truthful")
    path = out / "runs" / "state_change_1_C.json"
    run = json.loads(path.read_text())
    run.update(rows=run["rows"][:4], n_tasks=4, complete=False)
    path.write_text(json.dumps(run))
    summary = run_llm_agent.aggregate(out)
    assert summary["partial_runs"] == ["state_change_1_C (4 tasks)"]
    pair = summary["paired_C_minus_A"]["state_change"]
    assert pair["tasks_per_seed"] == {"0": N_TASKS, "1": 4}
    assert summary["by_family"]["state_change"]["C"]["partial_seeds"] == [1]
    # an unfinished run is redone on the next invocation, finished ones are skipped
    run_llm_agent.main(
        [
            *("--adapter", "scripted-truthful", "--family", "state_change", "--seeds", "1", "--tasks", str(N_TASKS)),
            *("--systems", "C", "--out", str(out), "--trace-dir", str(tmp_path / "traces")),
        ]
    )
    assert json.loads(path.read_text())["complete"]
    assert run_llm_agent.aggregate(out)["partial_runs"] == []


def _compare_committed(tmp_path: Path, sets: dict[str, str], cell: str) -> dict[str, Any]:
    """``evals.analysis.compare_traces`` over committed trace folders (set name -> ``traces/<folder>``), one cell."""
    from evals.analysis import compare_traces

    out = tmp_path / "cmp.json"
    root = Path(__file__).resolve().parents[2] / "traces"
    arg = ",".join(f"{name}={root / folder}" for name, folder in sets.items())
    compare_traces.main(["--sets", arg, "--cells", cell, "--out", str(out)])
    result: dict[str, Any] = json.loads(out.read_text())["cells"][cell]
    return result


def test_compare_traces_on_the_committed_real_llm_traces(tmp_path: Path) -> None:
    """evals.analysis.compare_traces over two committed trace sets: consistent counts and a paired view per cell."""
    cell = _compare_committed(tmp_path, {"before": "llm", "after": "llm_sorted_keys"}, "contradiction_0_A")
    for name in ("before", "after"):
        c = cell[name]
        assert c["lines"] == 40 and c["successes"] + c["failures"] == 40
        assert sum(c["primary"].values()) == c["failures"]
    paired = cell["after"]["paired_vs_before"]
    assert paired["common_tasks"] == 40
    assert paired["both_ok"] + paired["only_before_ok"] + paired["only_after_ok"] + paired["both_failed"] == 40
    assert paired["both_ok"] + paired["only_before_ok"] == cell["before"]["successes"]
    assert 0.0 <= paired["sign_test_p"] <= 1.0


def test_compare_traces_recognises_alias_answers_in_the_committed_alias_traces(tmp_path: Path) -> None:
    """Traces with per-ask aliases: an alias written as the answer counts as a memory-id answer."""
    cell = _compare_committed(
        tmp_path, {"sorted_keys": "llm_sorted_keys", "aliases": "llm_aliases"}, "state_change_0_A"
    )
    assert cell["sorted_keys"]["memid_alias"] == 0 and cell["sorted_keys"]["primary"]["answered_memory_id"] == 3
    # t0022 answered "M2" (the mallory memory, not the gold one)
    assert cell["aliases"]["memid_alias"] == 1 and cell["aliases"]["primary"]["answered_memory_id"] == 1
    assert cell["aliases"]["memid_is_gold"] == 0
    traces = Path(__file__).resolve().parents[2] / "traces"
    for rec in load_traces(traces / "llm_aliases" / "state_change_0_A.jsonl"):
        assert set(rec["citations"]) <= set(rec["aliases"].values()) == {s["id"] for s in rec["served"]}
