"""Time in recall: a query that names a time lifts memories of that time; prompts show the times a text names."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from remem_agent import MemoryInput, ReMem, RememConfig
from remem_agent.agent.prompt import build_messages, is_temporal_question, render_memories
from remem_agent.errors import UserInputError
from remem_agent.ranking.fusion import fuse
from remem_agent.temporal import matching, names_time, resolve
from remem_agent.types import Hit, State

StoreLocation = Callable[[str], "str | Path"]


def _t(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


NOW = _t(2023, 11, 1, 12)
# Three alike turns on three dates: only the time tells them apart. The June one is said in June; the
# August one speaks of June ("last month"), so both are "in June 2023" for a question that names it.
TURNS = [
    MemoryInput("Maria: we went to the beach with the kids", role="note", timestamp=_t(2023, 3, 4, 10)),
    MemoryInput("Maria: we went to the beach with my sister", role="note", timestamp=_t(2023, 6, 10, 10)),
    MemoryInput("Maria: last month we went to the beach with friends", role="note", timestamp=_t(2023, 7, 20, 10)),
    MemoryInput("Maria: we went to the beach with the dog", role="note", timestamp=_t(2023, 9, 2, 10)),
]


# -- the pure steps -----------------------------------------------------------------------------------------
def test_fusion_adds_each_ids_lift() -> None:
    cos = {"a": 0.60, "b": 0.50, "c": 0.40}
    cfg = RememConfig(fusion="bonus", lexical_weight=0.3, time_weight=0.3)
    pool = fuse([("a", 0.6), ("b", 0.5), ("c", 0.4)], [], cos, config=cfg, lift={"c": 0.3})
    assert pool.ids == ("c", "a", "b") and pool.retrieval.tolist() == pytest.approx([0.7, 0.6, 0.5])
    dense = fuse([("a", 0.6), ("c", 0.4)], [], cos, config=RememConfig(retrieval="dense"), lift={"c": 0.3})
    assert dense.ids == ("a", "c") and dense.retrieval.tolist() == [0.6, 0.4]  # dense keeps the cosine exactly


def test_matching_by_said_time_or_by_a_mention() -> None:
    (june,) = resolve("in June 2023", NOW, past=True)
    said = [("said_in_june", _t(2023, 6, 10)), ("said_later", _t(2023, 7, 20)), ("other", _t(2023, 9, 2))]
    mentions = {"said_later": [(_t(2023, 6, 1), _t(2023, 7, 1))], "other": [(_t(2022, 6, 1), _t(2022, 7, 1))]}
    assert matching([june], said, mentions) == {"said_in_june", "said_later"}
    assert matching([], said, mentions) == frozenset()


def test_time_weight_is_validated() -> None:
    for name in ("time_weight", "speaker_weight"):
        for bad in (-0.1, float("nan"), float("inf"), "0.3", True):
            with pytest.raises(UserInputError, match=name):
                RememConfig(**{name: bad})


# -- through the store --------------------------------------------------------------------------------------
def _texts(mem: ReMem, query: str, **kw: object) -> list[str]:
    return [h.text for h in mem.search(query, k=4, now=NOW, **kw).items]  # type: ignore[arg-type]


def test_a_query_naming_a_month_ranks_that_months_memories_first(store_location: StoreLocation) -> None:
    with ReMem(store_location("s"), embedder="hash") as mem:
        mem.add_many(TURNS)
        top = _texts(mem, "Who went to the beach in June 2023?")[:2]
        assert set(top) == {TURNS[1].text, TURNS[2].text}  # said in June, and "last month" said in July


def test_the_time_lift_follows_the_config_and_the_mode(tmp_path: Path) -> None:
    q = "Who went to the beach in March?"  # no year: the latest March up to now (2023)
    got = {}
    for name, cfg in {
        "on": RememConfig(),
        "off": RememConfig(time_weight=0.0),
        "dense": RememConfig(retrieval="dense"),
    }.items():
        with ReMem(tmp_path / name, embedder="hash", config=cfg) as mem:
            mem.add_many(TURNS)
            got[name] = _texts(mem, q)
            got[name + "_no_time"] = _texts(mem, "Who went to the beach?")
    assert got["on"][0] == TURNS[0].text
    assert got["off"] == got["off_no_time"] and got["dense"] == got["dense_no_time"]


def test_relative_query_times_count_from_the_search_now(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        mem.add_many(TURNS)
        # "four weeks ago" asked on Sunday 1 October 2023 is the week of Monday 28 August: the turn of 2 September
        asked = _t(2023, 10, 1, 9)
        top = [h.text for h in mem.search("Who went to the beach four weeks ago?", k=4, now=asked).items]
        assert top[0] == TURNS[3].text
        for query in ("four weeks ago", "yesterday?", "In June 2023"):  # nothing but a time: still answered
            assert len(mem.search(query, k=4, now=asked).items) == 4


# -- prompts ------------------------------------------------------------------------------------------------
def _hit(text: str, said: float) -> Hit:
    return Hit(
        id="m_1",
        text=text,
        score=1.0,
        similarity=1.0,
        state=State.ACTIVE,
        rank=0,
        valid_from=said,
        valid_to=None,
        entity=None,
        attribute=None,
        role="note",
        token_cost=12,
    )


def test_a_question_about_time_shows_each_resolved_mention() -> None:
    hit = _hit("Caroline: I went to the support group yesterday, and last weekend too.", _t(2023, 5, 8, 13, 56))
    block = render_memories([hit], temporal=True)
    assert block == (
        '[M1] (at Monday 8 May 2023, 13:56 UTC; "yesterday" = Sunday 7 May 2023; "last weekend" = the weekend of '
        '6-7 May 2023) "Caroline: I went to the support group yesterday, and last weekend too."'
    )
    assert render_memories([hit]) == f'[M1] (valid from 2023-05-08) "{hit.text}"'  # other questions: unchanged


@pytest.mark.parametrize(
    ("question", "about_time"),
    [
        ("When did Caroline go to the support group?", True),
        ("What did Maria donate in December 2023?", True),
        ("What did John do last weekend?", True),
        ("What is Caroline's favourite colour?", False),
        ("May I ask what Melanie paints?", False),
    ],
)
def test_which_questions_are_about_time(question: str, about_time: bool) -> None:
    assert is_temporal_question(question) is about_time
    messages = build_messages(question, [_hit("Caroline: I did it yesterday.", _t(2023, 5, 8))], {"type": "object"})
    assert ('"yesterday" = Sunday 7 May 2023' in messages[1].content) is about_time


def test_names_time_needs_a_readable_expression() -> None:
    assert names_time("see you next Friday") and names_time("İstanbul, last week")
    assert not names_time("see you on Friday") and not names_time("") and not names_time("May I?")


def test_an_as_of_search_is_not_lifted_by_the_time_it_names(tmp_path: Path) -> None:
    """In an as_of search the question's time is the as_of: validity then decides, not when a memory was said."""
    q = "Who went to the beach in June 2023?"
    got = {}
    for name, cfg in {"on": RememConfig(), "off": RememConfig(time_weight=0.0)}.items():
        with ReMem(tmp_path / name, embedder="hash", config=cfg) as mem:
            mem.add_many(TURNS)
            got[name] = [h.text for h in mem.search(q, k=4, now=NOW, as_of=_t(2023, 10, 1)).items]
            got[name + "_now"] = [h.text for h in mem.search(q, k=4, now=NOW).items]
    assert got["on"] == got["off"]
    assert got["on_now"] != got["off_now"]  # without as_of the same question is lifted
