"""A user's correction of a wrong answer kept as the fact that replaces what it cited (agent/corrections.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from remem_agent import ReMem, RememConfig
from remem_agent.adapters import ChatRequest, FunctionChatModel, RetryPolicy
from remem_agent.agent import MemoryAgent
from remem_agent.agent.corrections import SESSION_PREFIX, SPEAKER, correction_value, target
from remem_agent.types import State

FAST = RetryPolicy(max_attempts=2, initial_backoff=0.0, max_backoff=0.0)


@pytest.mark.parametrize(
    ("turn", "value"),
    [
        ("No, it's Lisbon", "Lisbon"),
        ("No, it’s Lisbon.", "Lisbon"),  # a typographic apostrophe
        ("“No, it's Lisbon.”", "Lisbon"),
        ("No, that's wrong, it's Lisbon!", "Lisbon"),
        ("Actually the answer is 42", "42"),
        ("not quite, it was March 2021", "March 2021"),
        ("WRONG: Tuesday", "Tuesday"),
        ("nope — Berlin", "Berlin"),
        ("Nein, Hamburg", "Hamburg"),
        ("👎 it is Oslo", "Oslo"),
        ("No.", None),  # says it is wrong, not what is right
        ("That's wrong", None),
        ("No, no, no", None),
        ("No, !!!", None),
        ("Where is the office?", None),  # no correction at all
        ("Lisbon, not Paris", None),  # does not open like one: the heuristic stays on the opening words
        ("No, " + "x" * 400, None),  # too long to be a value
    ],
)
def test_the_value_a_correcting_turn_states(turn: str, value: str | None) -> None:
    assert correction_value(turn) == value


def _chat_model() -> FunctionChatModel:
    def reply(req: ChatRequest) -> str:
        block = next(m.content for m in req.messages if m.role == "system" and "Long-term memory" in m.content)
        line = next(x for x in block.splitlines() if "office" in x.lower())
        return f"The office is in Paris [{line.split(']')[0].lstrip('[')}]."

    return FunctionChatModel(reply)


def _convo(*turns: str) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


async def _correct(mem: ReMem, tmp_path: Path, turn: str, *, on: bool = True, scope: str | None = None) -> Any:
    agent = MemoryAgent(mem, _chat_model(), trace=tmp_path / "t.jsonl", retry=FAST, capture_corrections=on)
    first = await agent.chat(_convo("Where is the office?"), conversation_id="c1", scope=scope)
    await agent.chat(_convo("Where is the office?", first.text, turn), conversation_id="c1", scope=scope)
    return first


@pytest.fixture()
def mem(tmp_path: Path) -> ReMem:
    m = ReMem(tmp_path / "store")
    m.add("The office is in Paris.", entity="office", attribute="city", timestamp=1)
    m.add("The office is in Paris.", entity="office", attribute="city", timestamp=1, scope="user:bob")
    m.add("Lunch is on Fridays.", role="note", timestamp=1)
    yield m
    m.close()


async def test_a_correction_with_a_value_replaces_the_cited_fact_with_provenance(mem: ReMem, tmp_path: Path) -> None:
    first = await _correct(mem, tmp_path, "No, it's Lisbon.")
    (old,) = first.citations
    current = mem.search("Where is the office?", k=3)
    new = next(h for h in current.items if "Lisbon" in h.text)
    assert new.text == "office city: Lisbon (the user's correction of: The office is in Paris.)"
    info = mem.inspect(new.id)
    assert info.supersedes == (old,) and mem.inspect(old).state is State.INVALIDATED
    assert info.memory.speaker == SPEAKER and info.memory.session == f"{SESSION_PREFIX}{first.answer_id}"
    assert info.memory.scope == "default"
    assert all("Paris" not in h.text or "correction" in h.text for h in current.items)
    bob = mem.search("Where is the office?", k=3, scope="user:bob")  # another user's fact is untouched
    assert [h.text for h in bob.items if "office" in h.text.lower()] == ["The office is in Paris."]
    assert mem.verify().ok


async def test_off_by_default_and_a_correction_without_a_value_only_fails_the_answer(
    mem: ReMem, tmp_path: Path
) -> None:
    before = mem.stats().memories
    first = await _correct(mem, tmp_path / "off", "No, it's Lisbon.", on=False)
    assert mem.stats().memories == before
    (old,) = first.citations
    assert not mem.inspect(old).credits[-1].success  # the verdict itself is the same
    second = await _correct(mem, tmp_path / "bare", "That's wrong.")
    assert mem.stats().memories == before and second.citations == first.citations


async def test_a_correction_only_reaches_the_callers_scope(mem: ReMem, tmp_path: Path) -> None:
    await _correct(mem, tmp_path, "No, it's Madrid", scope="user:bob")
    bob = [h.text for h in mem.search("Where is the office?", k=3, scope="user:bob").items if "office" in h.text]
    assert bob == ["office city: Madrid (the user's correction of: The office is in Paris.)"]
    default = [h.text for h in mem.search("Where is the office?", k=3).items if "office" in h.text.lower()]
    assert default == ["The office is in Paris."]


def test_only_one_keyed_active_fact_of_the_scope_can_be_the_target(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", config=RememConfig()) as m:
        a = m.get(m.add("The office is in Paris.", entity="office", attribute="city", timestamp=1))
        b = m.get(m.add("The office opens at 9.", entity="office", attribute="hours", timestamp=1))
        note = m.get(m.add("Paris is lovely.", role="note", timestamp=1))
        other = m.get(m.add("The office is in Rome.", entity="office", attribute="city", timestamp=1, scope="x"))
        assert target([a, note], "default") == a
        assert target([a, b], "default") is None  # two keys: the turn cannot say which it corrects
        assert target([note], "default") is None
        assert target([other], "default") is None  # another scope's fact
        newer = m.get(m.add("The office moved to Porto.", entity="office", attribute="city", timestamp=2))
        assert target([m.get(a.id), newer], "default") == newer  # the superseded one is no target
