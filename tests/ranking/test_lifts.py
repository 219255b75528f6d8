"""Lifts of the retrieval score for what a query says about when and who (remem_agent/ranking/lifts.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from remem_agent import ReMem, RememConfig
from remem_agent.ranking.lifts import QueryContext, lifts, names_speaker
from remem_agent.types import Memory, State


def _t(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


NOW = _t(2023, 11, 1, 12)


def _memory(mid: str, speaker: str | None, said: float) -> Memory:
    return Memory(
        id=mid,
        text=f"{speaker}: we went hiking",
        original_text=f"{speaker}: we went hiking",
        entity=None,
        attribute=None,
        role="note",
        tasks=(),
        created_at=said,
        valid_from=said,
        valid_to=None,
        superseded_by=None,
        state=State.ACTIVE,
        token_cost=5,
        confidence=1.0,
        speaker=speaker,
    )


@pytest.mark.parametrize(
    ("query", "speaker", "named"),
    [
        ("What did Caroline paint?", "Caroline", True),
        ("what did caroline paint?", "Caroline", True),  # case does not matter
        ("What did Caroline's sister paint?", "Caroline", True),  # a possessive is the name's word
        ("What did John paint?", "John Smith", True),  # one word of the name
        ("What did Carol paint?", "Caroline", False),  # words, not prefixes
        ("What did the user ask?", "user", True),
        ("What did Caroline paint?", None, False),
        ("What did A paint?", "A", False),  # one-letter words are no names
    ],
)
def test_names_speaker(query: str, speaker: str | None, named: bool) -> None:
    assert names_speaker(QueryContext.of(query, None).words, speaker) is named


def test_lifts_add_time_and_speaker() -> None:
    pooled = [
        _memory("a", "Maria", _t(2023, 6, 10)),  # Maria, in June
        _memory("b", "John", _t(2023, 6, 12)),  # in June
        _memory("c", "Maria", _t(2023, 9, 1)),  # Maria
        _memory("d", "John", _t(2023, 9, 1)),
    ]
    ctx = QueryContext.of("What did Maria do in June 2023?", NOW)
    got = lifts(ctx, pooled, {}, time_weight=0.3, speaker_weight=0.2)
    assert got == pytest.approx({"a": 0.5, "b": 0.3, "c": 0.2})
    assert lifts(ctx, pooled, {}, time_weight=0.0, speaker_weight=0.0) == {}
    # a stored mention counts like the time it was said
    assert lifts(ctx, pooled, {"d": [(_t(2023, 6, 1), _t(2023, 7, 1))]}, time_weight=0.3, speaker_weight=0.0) == {
        "a": 0.3,
        "b": 0.3,
        "d": 0.3,
    }


def test_a_query_naming_a_speaker_serves_that_speakers_turns_first(tmp_path: Path) -> None:
    turns = [
        {"speaker": "John", "text": "I went hiking near the lake on Sunday", "timestamp": _t(2023, 5, 1, 10)},
        {"speaker": "Maria", "text": "I went hiking near the lake too", "timestamp": _t(2023, 5, 1, 11)},
    ]
    got = {}
    for name, cfg in {"on": RememConfig(), "off": RememConfig(speaker_weight=0.0)}.items():
        with ReMem(tmp_path / name, embedder="hash", config=cfg) as mem:
            mem.add_conversation(turns)
            got[name] = [h.text for h in mem.search("Where did Maria go hiking?", k=2, now=NOW).items]
    assert got["on"][0] == "Maria: I went hiking near the lake too"
    assert sorted(got["on"]) == sorted(got["off"])
