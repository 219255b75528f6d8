"""``add_conversation``: the transcript shapes, speaker and session as fields, all-or-nothing validation,
extracted facts that supersede, and the memory's time for temporal questions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from remem_agent import ReMem
from remem_agent.agent.prompt import build_messages, is_temporal_question, render_memories
from remem_agent.errors import UserInputError
from remem_agent.transcripts import BadTurnError, parse_conversation, parse_when
from remem_agent.types import State
from remem_agent.validate import MemoryInput
from tests.conftest import StoreLocation

LOCOMO: dict[str, Any] = {
    "speaker_a": "Caroline",
    "speaker_b": "Melanie",
    "session_1_date_time": "1:56 pm on 8 May, 2023",
    "session_1": [
        {"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to the LGBTQ support group yesterday."},
        {"speaker": "Melanie", "dia_id": "D1:2", "text": "That's great, how was it?"},
    ],
    "session_2_date_time": "7:00 pm on 25 May, 2023",
    "session_2": [{"speaker": "Melanie", "dia_id": "D2:1", "text": "I painted a sunrise last weekend."}],
}
LONGMEMEVAL: dict[str, Any] = {
    "question": "What did I buy?",
    "haystack_session_ids": ["s_a", "s_b"],
    "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/22 (Mon) 10:00"],
    "haystack_sessions": [
        [{"role": "user", "content": "I bought a red bike."}, {"role": "assistant", "content": "Nice!"}],
        [{"role": "user", "content": "The bike has a bell now."}],
    ],
}


def _epoch(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_locomo_shape_keeps_speaker_session_and_session_time(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        ids = mem.add_conversation(LOCOMO)
        assert len(ids) == 3
        first, second, third = (mem.get(i) for i in ids)
        assert (first.speaker, first.session, first.role) == ("Caroline", "session_1", "note")
        assert first.text == "Caroline: I went to the LGBTQ support group yesterday."
        assert first.valid_from == _epoch(2023, 5, 8, 13, 56)
        assert second.valid_from == first.valid_from + 1  # turns keep their order within a session
        assert (third.speaker, third.session, third.valid_from) == ("Melanie", "session_2", _epoch(2023, 5, 25, 19))
    assert parse_conversation({"sample_id": "x", "conversation": LOCOMO}) == parse_conversation(LOCOMO)


def test_longmemeval_and_openai_shapes(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        ids = mem.add_conversation(LONGMEMEVAL)
        rows = [mem.get(i) for i in ids]
        assert [(m.speaker, m.session) for m in rows] == [("user", "s_a"), ("assistant", "s_a"), ("user", "s_b")]
        assert rows[2].valid_from == _epoch(2023, 5, 22, 10)
        msgs = [
            {"role": "user", "content": "I use vim.", "name": "dana"},
            {"role": "assistant", "content": "Noted.", "timestamp": "2024-01-02T03:04:05Z"},
        ]
        a, b = (mem.get(i) for i in mem.add_conversation(msgs, timestamp=_epoch(2024, 1, 1)))
        assert (a.speaker, a.text, a.valid_from) == ("dana", "dana: I use vim.", _epoch(2024, 1, 1))
        assert (b.speaker, b.valid_from) == ("assistant", _epoch(2024, 1, 2, 3, 4, 5))
        (c,) = mem.add_conversation("bob: The deploy is on Friday.")
        assert (mem.get(c).speaker, mem.get(c).text) == ("bob", "bob: The deploy is on Friday.")


def test_openai_messages_as_an_agent_loop_leaves_them(tmp_path: Path) -> None:
    """Real chat histories hold content parts, tool calls, tool results and refusals; what was said is
    stored, what only plumbs tools is skipped. The assistant messages are built by the openai SDK's own types."""
    from openai.types.chat import ChatCompletionMessage

    call = ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
            ],
        }
    ).model_dump()
    answer = ChatCompletionMessage(role="assistant", content="It is 4 degrees in Oslo.").model_dump()
    refused = ChatCompletionMessage(role="assistant", content=None, refusal="I cannot share that.").model_dump()
    history = [
        {"role": "system", "content": "You are a travel assistant."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "I am flying to Oslo on Friday."},
                {"type": "image_url", "image_url": {"url": "https://example.com/ticket.png"}},
                {"type": "text", "text": "What will the weather be?"},
            ],
        },
        call,
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 4, "sky": "overcast"}'},
        answer,
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}]},
        {"role": "user", "content": "What is my manager's salary?"},
        refused,
    ]
    with ReMem(tmp_path / "s") as mem:
        ids = mem.add_conversation(history, timestamp=_epoch(2024, 3, 1))
        rows = [mem.get(i) for i in ids]
    assert [(m.speaker, m.text) for m in rows] == [
        ("system", "system: You are a travel assistant."),
        ("user", "user: I am flying to Oslo on Friday.\nWhat will the weather be?"),
        ("assistant", "assistant: It is 4 degrees in Oslo."),
        ("user", "user: What is my manager's salary?"),
        ("assistant", "assistant: I cannot share that."),
    ]
    assert [m.valid_from for m in rows] == sorted(m.valid_from for m in rows)  # still in conversation order


@pytest.mark.parametrize(
    "bad",
    [
        [{"role": "user", "content": "fine"}, {"role": "user", "content": ["a bare string part"]}],
        [{"role": "user", "content": "fine"}, {"role": "user", "content": [{"type": "text"}]}],  # no text
        [{"role": "user", "content": "fine"}, {"role": "assistant", "content": None}],  # no text, no tool call
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}],  # says nothing
        [{"role": "tool", "tool_call_id": "c1", "content": "42"}],  # only a tool result: nothing said
        [{"role": "user", "content": "fine"}, {"role": "user", "content": ""}],  # the second turn is empty
        [{"role": "user", "content": "fine"}, {"content": "who said this?"}],  # no speaker
        [{"role": "user", "content": "fine"}, {"role": "user", "content": "x", "timestamp": "not a time"}],
        [{"role": "user", "content": "fine"}, "just a string"],
        [{"role": "user", "content": "fine"}, {"role": "user", "content": "nul \x00 inside"}],
        {"session_1": [{"speaker": "a", "text": "ok"}], "session_1_date_time": "sometime"},
        {"speaker_a": "a"},  # no sessions
        {"haystack_sessions": [[{"role": "user", "content": "x"}]], "haystack_dates": []},
        [],
        42,
    ],
)
def test_bad_turns_are_typed_errors_and_store_nothing(store_location: StoreLocation, bad: Any) -> None:
    with ReMem(store_location("s")) as mem:
        with pytest.raises(BadTurnError) as info:
            mem.add_conversation(bad)
        assert isinstance(info.value, UserInputError)
        assert mem.stats().memories == 0


class KeyedExtractor:
    """Turns "X is now on plan P" lines into keyed state facts (a stand-in for LLMFactExtractor)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def extract(self, transcript: str) -> Sequence[MemoryInput]:
        self.seen.append(transcript)
        out = []
        for line in transcript.splitlines():
            if " plan " in line:
                plan = line.rsplit(" ", 1)[-1].strip(".")
                out.append(MemoryInput(f"The customer is on the {plan} plan.", entity="customer", attribute="plan"))
        return out


def test_extracted_facts_supersede_and_take_their_session_time(tmp_path: Path) -> None:
    conv = {
        "session_1_date_time": "9:00 am on 1 March, 2024",
        "session_1": [{"speaker": "user", "text": "We are on the plan Pro."}],
        "session_2_date_time": "9:00 am on 1 June, 2024",
        "session_2": [{"speaker": "user", "text": "We moved to the plan Enterprise."}],
    }
    ex = KeyedExtractor()
    with ReMem(tmp_path / "s") as mem:
        ids = mem.add_conversation(conv, extractor=ex)
        assert len(ex.seen) == 2 and ex.seen[0] == "user: We are on the plan Pro."  # one call per session
        pro, ent = (mem.get(i) for i in ids)
        assert pro.state is State.INVALIDATED and pro.superseded_by == ent.id
        assert (ent.session, ent.valid_from) == ("session_2", _epoch(2024, 6, 1, 9))
        with_turns = mem.add_conversation(conv, extractor=KeyedExtractor(), turns=True)
        assert [mem.get(i).role for i in with_turns[:2]] == ["note", "note"]


def test_a_failing_extractor_stores_nothing(tmp_path: Path) -> None:
    class Broken:
        def extract(self, transcript: str) -> Sequence[MemoryInput]:
            return ["not a MemoryInput"]  # type: ignore[list-item]

    with ReMem(tmp_path / "s") as mem:
        with pytest.raises(UserInputError):
            mem.add_conversation(LOCOMO, extractor=Broken(), turns=True)
        assert mem.stats().memories == 0


def test_parse_when_reads_the_benchmarks_dates() -> None:
    assert parse_when("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert parse_when("2023/05/20 (Sat) 02:21") == datetime(2023, 5, 20, 2, 21, tzinfo=UTC)
    # never a silently wrong date: a longer number is no year, an impossible time of day no midnight
    for unreadable in ("99999-01-01", "12023/05/20", "123 May, 2023", "May 8, 20234", "2023/05/20 25:61"):
        assert parse_when(unreadable) is None, unreadable
    assert parse_when("May 8, 2023") == datetime(2023, 5, 8, tzinfo=UTC)
    assert parse_when("no date here") is None
    assert [t.speaker for t in parse_conversation("plain line\nann: hi")] == ["user", "ann"]


def test_temporal_questions_get_the_memory_time(tmp_path: Path) -> None:
    assert is_temporal_question("When did Caroline go to the LGBTQ support group?")
    assert is_temporal_question("How long ago was Melanie's camping trip?")
    assert not is_temporal_question("What did Melanie paint?")
    with ReMem(tmp_path / "s") as mem:
        mem.add_conversation(LOCOMO)
        hits = mem.search("When did Caroline go to the LGBTQ support group?", k=1, now=_epoch(2024, 1, 1)).items
        assert '(at Monday 8 May 2023, 13:56 UTC; "yesterday" = Sunday 7 May 2023)' in render_memories(
            hits, temporal=True
        )
        assert "(valid from 2023-05-08)" in render_memories(hits)
        user = build_messages("When did Caroline go to the group?", hits, {"type": "object", "properties": {}})[1]
        assert "13:56 UTC" in user.content
        plain = build_messages("What did Caroline go to?", hits, {"type": "object", "properties": {}})[1]
        assert "13:56" not in plain.content and "2023-05-08" in plain.content
