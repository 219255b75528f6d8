"""evals/bench/locomo_facts.py on the tiny fixture: both stores ranked, facts stand for the turns they cite."""

from __future__ import annotations

import json
from pathlib import Path

from evals.bench import locomo_facts
from evals.harness.embedders import make_embedder

LOCOMO = Path(__file__).resolve().parents[1] / "fixtures" / "locomo_tiny.json"


def test_facts_are_ranked_beside_the_turns_and_stand_for_what_they_cite() -> None:
    sample = json.loads(LOCOMO.read_text())[0]
    plain = locomo_facts.rank_conversation(sample, make_embedder("hash"), facts=False)
    noted = locomo_facts.rank_conversation(sample, make_embedder("hash"), facts=True)
    assert [r["qa_index"] for r in plain] == [r["qa_index"] for r in noted] == [0, 1, 2, 3]
    assert not any(f for r in plain for f in r["facts"])
    dogs = noted[1]  # "What are the names of Bob's dogs?"
    served = [(ids, is_fact) for ids, is_fact in zip(dogs["ranked"], dogs["facts"], strict=True)]
    assert (["D2:1"], True) in served and (["D1:2"], True) in served


def test_the_report_pairs_the_stores_and_holds_no_conversation_text(tmp_path: Path) -> None:
    out = tmp_path / "facts_recall.json"
    assert locomo_facts.main(["--data", str(LOCOMO), "--embedder", "hash", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["overall"]["turns"]["n"] == report["overall"]["turns_facts"]["n"] == 4
    assert set(report["by_category"]) == {"multi-hop", "temporal", "open-domain", "single-hop"}
    diff = report["overall"]["recall@5_diff"]
    mean = sum(q["recall@5"]["turns_facts"] - q["recall@5"]["turns"] for q in report["questions"]) / 4
    assert abs(diff["mean"] - mean) < 1e-9
    text = out.read_text() + out.with_suffix(".md").read_text()
    for word in ("xylophone", "Pepper", "Lisbon", "Rex"):
        assert word not in text
