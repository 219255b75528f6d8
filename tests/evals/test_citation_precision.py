"""evals.analysis.citation_precision on a tiny hand-written trace set (no world behind it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.analysis.citation_precision import main, run


def _line(
    tid: str,
    truth: dict[str, str],
    answer: dict[str, str],
    served: list[tuple[str, str]],
    cited: list[str],
    success: bool,
) -> dict[str, Any]:
    return {
        "v": 1,
        "ts": "2026-01-01T00:00:00+00:00",
        "run": "r",
        "answer_id": f"a_{tid}",
        "task_id": tid,
        "task": "ops",
        "question": "q?",
        "system": "C",
        "model": {"adapter": "scripted", "name": "x"},
        "search_id": f"s_{tid}",
        "served": [
            {"id": i, "rank": n, "score": 1.0, "similarity": 1.0, "state": "ACTIVE", "text": t}
            for n, (i, t) in enumerate(served)
        ],
        "schema": {"type": "object", "properties": {k: {"type": "string"} for k in truth}},
        "truth": truth,
        "messages": [],
        "attempts": [],
        "answer": answer,
        "citations": cited,
        "error": None,
        "outcome": {"success": success, "score": float(success)},
        "latency_ms": {"total": 1.0},
    }


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_precision_recall_and_support_on_a_tiny_trace(tmp_path: Path) -> None:
    served = [
        ("m1", "The billing service is owned by alice."),
        ("m2", "The billing service is owned by bob."),
        ("m3", "The auth service is deployed at version v2."),
    ]
    lines = [
        # success: cites gold m1 (supported) and m3 (unsupported, not gold)
        _line("fam-0-t0001", {"billing.owner": "alice"}, {"billing.owner": "alice"}, served, ["m1", "m3"], True),
        # failure: answered the stale value, cites the stale m2 (supported, not gold) only
        _line("fam-0-t0002", {"billing.owner": "alice"}, {"billing.owner": "bob"}, served, ["m2"], False),
    ]
    d = tmp_path / "traces" / "set1"
    _write(d / "fam_0_C.jsonl", lines)
    res = run([d], world_check=False)
    allb = res["trace_sets"][str(d)]["per_system"]["C"]["all"]
    assert (allb["answered"], allb["cited"], allb["gold"], allb["cited_gold"]) == (2, 3, 2, 1)
    assert allb["precision"] == round(1 / 3, 4) and allb["recall"] == 0.5
    assert allb["unsupported_share"] == round(1 / 3, 4)  # m3 in the first ask
    assert allb["supported_precision"] == 0.5  # m1 (gold) and m2 (stale) are supported
    assert allb["unsupported_gold_share"] == 0.0
    assert allb["world_checked"] == 0 and allb["gold_agreement_rate"] is None
    succ = res["trace_sets"][str(d)]["per_system"]["C"]["success"]
    assert (succ["answered"], succ["precision"], succ["supported_precision"]) == (1, 0.5, 1.0)


def test_cli_writes_json_and_prints_a_table(tmp_path: Path, capsys: Any) -> None:
    served = [("m1", "The billing service is owned by alice.")]
    d = tmp_path / "set"
    _write(
        d / "fam_0_A.jsonl",
        [
            _line("fam-0-t0001", {"billing.owner": "alice"}, {"billing.owner": "alice"}, served, ["m1"], True)
            | {"system": "A"}
        ],
    )
    out = tmp_path / "cp.json"
    main([str(d), "--out", str(out)])  # world check on: the unknown family "fam" is skipped, not an error
    res = json.loads(out.read_text())
    assert res["trace_sets"][str(d)]["per_system"]["A"]["all"]["precision"] == 1.0
    assert "citation precision" in capsys.readouterr().out


def test_world_gold_finds_the_world_fact_for_the_task() -> None:
    from evals.analysis.citation_precision import world_gold
    from evals.harness.families import make_world
    from evals.harness.world import WorldParams, key_name

    world = make_world("contradiction", 0, WorldParams(n_tasks=5))
    task = next(world.tasks())
    k, v = next(iter(task.truth.items()))
    fact = next(f for f in world.facts() if f.key and key_name(f.key) == k and f.value == v)
    rec = {
        "task_id": task.tid,
        "question": task.query,
        "served": [{"id": "g", "text": fact.text}, {"id": "x", "text": "unrelated"}],
    }
    assert world_gold(rec, Path("contradiction_0_C.jsonl"), 5) == {"g"}
    assert world_gold(rec | {"question": "another question"}, Path("x.jsonl"), 5) is None
