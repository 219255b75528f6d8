"""The leave-one-conversation-out runner (evals/bench/locomo_loco.py) on two copies of the tiny fixture."""

from __future__ import annotations

import json
from pathlib import Path

from evals.bench import locomo_loco
from evals.bench.run_locomo import sample_turns

LOCOMO = Path(__file__).resolve().parents[1] / "fixtures" / "locomo_tiny.json"


def _two_conversations(tmp_path: Path) -> Path:
    (sample,) = json.loads(LOCOMO.read_text())
    other = json.loads(json.dumps(sample)) | {"sample_id": "tiny-2"}
    path = tmp_path / "two.json"
    path.write_text(json.dumps([sample, other]))
    return path


def test_each_turn_is_indexed_after_the_turn_before_it_in_its_session() -> None:
    turns, _ = sample_turns(json.loads(LOCOMO.read_text())[0])
    joined = locomo_loco.with_previous(turns)
    firsts = [i for i, t in enumerate(turns) if i == 0 or turns[i - 1]["session"] != t["session"]]
    assert firsts == [0, 4, 7]
    for i, t in enumerate(turns):
        assert joined[i] == (t["text"] if i in firsts else f"{turns[i - 1]['text']}\n{t['text']}")


def test_each_conversation_is_scored_under_the_rule_chosen_on_the_others(tmp_path: Path) -> None:
    out = tmp_path / "loco.json"
    grid = '{"turn_context": [0, 1.0], "time_weight": [0.3]}'
    assert locomo_loco.main(["--data", str(_two_conversations(tmp_path)), "--grid", grid, "--embedder", "hash",
                             "--out", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert result["meta"]["command"].startswith("python -m evals.bench.locomo_loco --data two.json")
    names = ["turn_context=0,time_weight=0.3", "turn_context=1.0,time_weight=0.3"]
    rows = result["questions"]
    assert len(rows) == 8 and {r["sample_id"] for r in rows} == {"tiny-1", "tiny-2"}
    for fold in result["loco"]["folds"]:
        train = [r for r in rows if r["sample_id"] != fold["held_out"]]
        test = [r for r in rows if r["sample_id"] == fold["held_out"]]

        def mean(part: list[dict], name: str) -> float:
            return round(sum(r["recall"][name]["recall@5"] for r in part) / len(part), 4)

        best = max(names, key=lambda n: (mean(train, n), -names.index(n)))  # ties: the grid's earlier rule
        assert fold["chosen"] == best and fold["train_recall@5"] == mean(train, best)
        assert fold["recall"]["all"]["chosen"]["recall@5"] == mean(test, best)
        for base in locomo_loco.BASELINES:
            assert fold["recall"]["all"][base]["recall@5"] == mean(test, base)
    summary = result["loco"]["summary"]["all"]
    assert summary["n"] == 8 and len(summary["recall@5_per_fold"]) == 2
    assert summary["spread"] == [min(summary["recall@5_per_fold"]), max(summary["recall@5_per_fold"])]
    assert {"bm25_recall@5", "bm25_context_recall@5"} <= set(summary)
    assert set(result["per_config"]) == {*names, *locomo_loco.BASELINES}
