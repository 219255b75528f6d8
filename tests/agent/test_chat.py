"""MemoryAgent.chat / chat_stream with the shipped fakes: the conversation path's rules, one by one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remem_agent import FeedbackConflictError, ModelError, ReMem, UnknownSearchError, UserInputError
from remem_agent.adapters import (
    Capabilities,
    ChatRequest,
    ChatResponse,
    FunctionChatModel,
    RetryPolicy,
    ScriptedChatModel,
)
from remem_agent.adapters.base import StreamChunk, ToolCall
from remem_agent.agent import MemoryAgent, load_traces
from remem_agent.agent.conversation import CitationStripper, looks_like_correction, recall_query, strip_citations

FAST = RetryPolicy(max_attempts=2, initial_backoff=0.0, max_backoff=0.0)
SYSTEM = "You are Ops Bot. Answer in one sentence."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "ping",
        "description": "Ping a region's server",
        "parameters": {"type": "object", "properties": {"region": {"type": "string"}}, "required": ["region"]},
    },
}


@pytest.fixture()
def mem(tmp_path: Path) -> ReMem:
    m = ReMem(tmp_path / "store")
    m.add("Our server is in east-1.", entity="server", attribute="region", timestamp=1)
    m.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=2)
    m.add("The team lunch is on Fridays.", role="note", timestamp=2)
    yield m
    m.close()


def agent_for(mem: ReMem, model: Any, tmp_path: Path, **kw: Any) -> MemoryAgent:
    return MemoryAgent(mem, model, trace=tmp_path / "trace.jsonl", retry=FAST, **kw)


def label_of(req: ChatRequest, text: str) -> str:
    """The label the memory block gives the memory whose text contains ``text``."""
    block = next(m.content for m in req.messages if m.role == "system" and "Long-term memory" in m.content)
    line = next(x for x in block.splitlines() if text in x)
    return line.split("]")[0].lstrip("[")


def convo(*turns: str) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i, t in enumerate(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    return msgs


async def test_system_prompt_and_history_survive_and_one_memory_block_is_added(mem: ReMem, tmp_path: Path) -> None:
    model = FunctionChatModel(lambda req: f"It is in west-2 [{label_of(req, 'west-2')}].")
    agent = agent_for(mem, model, tmp_path)
    msgs = convo("Hi there, quick question about infrastructure.", "Sure, ask away.", "Where is our server?")
    reply = await agent.chat(msgs)
    sent = model.requests[0].messages
    assert sent[0].role == "system" and sent[0].content == SYSTEM  # the caller's system prompt, untouched
    assert sent[1].role == "system" and "quoted DATA" in sent[1].content  # the one memory block, right after
    assert [m.content for m in sent[2:]] == [m["content"] for m in msgs[1:]]  # history intact, in order
    assert sum("Long-term memory" in m.content for m in sent) == 1
    west = next(h.id for h in reply.served if "west-2" in h.text)
    assert reply.citations == (west,) and reply.text.endswith("].") and reply.raw == reply.text
    assert all("east-1" not in h.text for h in reply.served)  # the superseded fact is not served


async def test_inline_citations_are_extracted_and_optionally_stripped(mem: ReMem, tmp_path: Path) -> None:
    model = FunctionChatModel(lambda req: f"West-2 [{label_of(req, 'west-2')}, M9]. Lunch is Fridays [M1].")
    agent = agent_for(mem, model, tmp_path, strip_citations=True)
    reply = await agent.chat([{"role": "user", "content": "Where is our server and when is lunch?"}])
    assert "[" not in reply.text and reply.text == "West-2. Lunch is Fridays."
    assert "[M" in reply.raw
    assert len(reply.citations) >= 1 and all(c in reply.aliases.values() for c in reply.citations)
    line = load_traces(tmp_path / "trace.jsonl")[0]
    assert line["v"] == 2 and line["kind"] == "chat" and "M9" in line["unknown_citations"]


async def test_tool_loop_recalls_once_per_user_turn_and_round_trips_tool_calls(mem: ReMem, tmp_path: Path) -> None:
    def fn(req: ChatRequest) -> ChatResponse:
        if req.messages[-1].role == "tool":
            return ChatResponse(text=f"west-2 answers: {req.messages[-1].content} [{label_of(req, 'west-2')}]")
        return ChatResponse(
            text="",
            finish_reason="tool_calls",
            tool_calls=(ToolCall(id="call_1", name="ping", arguments=json.dumps({"region": "west-2"})),),
        )

    model = FunctionChatModel(fn)
    agent = agent_for(mem, model, tmp_path)
    msgs: list[dict[str, Any]] = [*convo("Is our server up?")]
    searches_before = mem.stats().searches
    first = await agent.chat(msgs, tools=[WEATHER_TOOL])
    assert first.finish_reason == "tool_calls" and first.tool_calls[0].name == "ping" and first.recalled
    assert model.requests[0].tools[0].name == "ping"
    west = next(h.id for h in first.served if "west-2" in h.text)
    assert west in first.used  # the tool-call arguments repeat the value the memory carries
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [c.to_dict() for c in first.tool_calls]},
        {"role": "tool", "tool_call_id": "call_1", "content": "pong 12 ms"},
    ]
    second = await agent.chat(msgs, tools=[WEATHER_TOOL])
    assert not second.recalled and second.answer_id == first.answer_id and second.search_id == first.search_id
    assert mem.stats().searches == searches_before + 1  # one recall for the whole turn
    assert second.citations == (west,) and "pong" in second.text
    # the next user turn moves on: the turn's answer is a weak success credited to the memory it used
    msgs += [
        {"role": "assistant", "content": second.text},
        {"role": "user", "content": "Great, thanks. What about lunch?"},
    ]
    await agent.chat(msgs, tools=[WEATHER_TOOL])
    info = mem.inspect(west)
    assert info.credits and info.credits[-1].search_id == first.search_id and info.credits[-1].success
    assert info.credits[-1].credit == pytest.approx(0.3)
    outcome = [t for t in load_traces(tmp_path / "trace.jsonl") if t.get("kind") == "outcome"]
    assert outcome[0]["outcome"] == {"success": True, "source": "inferred", "weight": 0.3}


async def test_a_correction_in_the_next_user_turn_blames_the_memory_the_answer_used(mem: ReMem, tmp_path: Path) -> None:
    model = FunctionChatModel(lambda req: f"Lunch is on Fridays [{label_of(req, 'lunch')}].")
    agent = agent_for(mem, model, tmp_path)
    msgs = convo("When is the team lunch?")
    reply = await agent.chat(msgs)
    lunch = reply.citations[0]
    msgs += [
        {"role": "assistant", "content": reply.text},
        {"role": "user", "content": "No, that's outdated: it moved."},
    ]
    await agent.chat(msgs)
    info = mem.inspect(lunch)
    assert info.credits[-1].search_id == reply.search_id and not info.credits[-1].success
    assert info.credits[-1].blame > 0
    others = [h.id for h in reply.served if h.id != lunch]
    for other in others:  # the memories it did not use are not blamed
        assert all(c.blame == 0 for c in mem.inspect(other).credits)


async def test_explicit_feedback_with_a_reason_is_recorded_once(mem: ReMem, tmp_path: Path) -> None:
    model = FunctionChatModel(lambda req: f"west-2 [{label_of(req, 'west-2')}]")
    agent = agent_for(mem, model, tmp_path)
    reply = await agent.chat(convo("Where is our server?"))
    receipt = await agent.feedback(reply.answer_id, success=True, reason="thumbs up")
    assert receipt.source == "user" and receipt.credit[reply.citations[0]] == 1.0
    assert (await agent.feedback(reply.answer_id, success=True, reason="again")).repeated  # counted once
    with pytest.raises(FeedbackConflictError):  # one verdict per answer
        await agent.feedback(reply.answer_id, success=False)
    outcomes = [t for t in load_traces(tmp_path / "trace.jsonl") if t.get("kind") == "outcome"]
    assert len(outcomes) == 1  # the repeat is not traced as a second outcome
    assert outcomes[0]["reason"] == "thumbs up" and outcomes[0]["outcome"]["source"] == "user"


async def test_a_judge_verdict_replaces_the_heuristic_and_both_are_traced(mem: ReMem, tmp_path: Path) -> None:
    model = FunctionChatModel(lambda req: f"west-2 [{label_of(req, 'west-2')}]")
    judge = ScriptedChatModel([json.dumps({"verdict": "wrong", "reason": "the user says it moved again"})])
    agent = agent_for(mem, model, tmp_path, judge=judge)
    msgs = convo("Where is our server?")
    reply = await agent.chat(msgs)
    msgs += [{"role": "assistant", "content": reply.text}, {"role": "user", "content": "Thanks! Which team runs it?"}]
    await agent.chat(msgs)
    assert judge.requests and judge.requests[0].json_schema is not None
    line = next(t for t in load_traces(tmp_path / "trace.jsonl") if t.get("kind") == "outcome")
    assert line["outcome"]["source"] == "judge" and line["outcome"]["success"] is False
    assert line["heuristic"]["success"] is True  # the heuristic alone would have said "moved on"
    assert mem.inspect(reply.citations[0]).credits[-1].success is False


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([{"role": "wizard", "content": "hi"}], "unknown role"),
        ([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "r"}], "no earlier"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}], "only text parts"),
        ([{"role": "user", "content": 5}], "must be text"),
        ([{"role": "assistant", "content": "hello"}], "at least one user"),
        ([], "must not be empty"),
        ("hello", "must be a list"),
        ([{"role": "user", "content": "bad \ud800 text"}], "lone surrogate"),
    ],
)
async def test_malformed_conversations_are_refused_before_any_model_call(
    mem: ReMem, tmp_path: Path, messages: Any, needle: str
) -> None:
    model = ScriptedChatModel([])
    agent = agent_for(mem, model, tmp_path)
    before = mem.stats()
    with pytest.raises(UserInputError, match=needle):
        await agent.chat(messages)
    with pytest.raises(UserInputError, match=needle):
        agent.chat_stream(messages)
    assert model.requests == [] and mem.stats() == before


async def test_invalid_tools_and_tools_for_a_model_without_them_are_refused(mem: ReMem, tmp_path: Path) -> None:
    bad = {"type": "function", "function": {"name": "x", "parameters": {"type": "nonsense"}}}
    agent = agent_for(mem, ScriptedChatModel([]), tmp_path)
    with pytest.raises(UserInputError, match="not a valid JSON schema"):
        await agent.chat(convo("hi there"), tools=[bad])
    with pytest.raises(UserInputError, match="tool_choice"):
        await agent.chat(convo("hi there"), tools=[WEATHER_TOOL], tool_choice="launch")
    plain = ScriptedChatModel([], capabilities=Capabilities())
    with pytest.raises(UserInputError, match="does not support tools"):
        await agent_for(mem, plain, tmp_path).chat(convo("hi there"), tools=[WEATHER_TOOL])


async def test_streaming_yields_pieces_strips_split_labels_and_learns_after_the_last(
    mem: ReMem, tmp_path: Path
) -> None:
    model = FunctionChatModel(lambda req: f"It moved to west-2 [{label_of(req, 'west-2')}] last year.")
    agent = agent_for(mem, model, tmp_path, strip_citations=True)
    stream = agent.chat_stream(convo("Where is our server?"))
    await stream.start()
    assert stream.answer_id and stream.served  # known before the first token
    pieces = [c.text async for c in stream]
    assert len([p for p in pieces if p]) > 3 and "".join(pieces) == "It moved to west-2 last year."
    assert stream.reply is not None and stream.reply.citations and stream.reply.answer_id == stream.answer_id
    line = load_traces(tmp_path / "trace.jsonl")[0]
    assert line["stream"] is True and "first_token" in line["latency_ms"] and "[M" in line["reply"]["text"]


class _Upstream:
    """A streaming fake that records whether its stream was closed, and can fail mid-stream."""

    name, adapter = "upstream", "fake"
    capabilities = Capabilities(streaming=True)

    def __init__(self, fail_after: int | None = None) -> None:
        self.closed = 0
        self.fail_after = fail_after

    async def complete(self, request: ChatRequest) -> ChatResponse:
        raise AssertionError("not used")

    async def stream(self, request: ChatRequest) -> Any:
        try:
            for i in range(1000):
                if self.fail_after is not None and i == self.fail_after:
                    raise ModelError("upstream cut the stream", retryable=True)
                await asyncio.sleep(0)
                yield StreamChunk(text=f"w{i} ")
            yield StreamChunk(finish_reason="stop")
        finally:
            self.closed += 1


async def test_a_consumer_that_stops_early_leaves_nothing_behind(mem: ReMem, tmp_path: Path) -> None:
    up = _Upstream()
    agent = agent_for(mem, up, tmp_path, max_concurrency=1)
    stream = agent.chat_stream(convo("Where is our server?"))
    async for chunk in stream:
        if chunk.text == "w3 ":
            break
    await stream.aclose()
    assert up.closed == 1 and agent._sem._value == 1  # upstream closed, concurrency slot released
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    line = load_traces(tmp_path / "trace.jsonl")[0]
    assert "stopped reading" in line["error"] and line["citations"] == []
    # dropped without aclose: the generator is finalised by the event loop, the slot comes back
    stream2 = agent.chat_stream(convo("Where is our server?"))
    async for _ in stream2:
        break
    del stream2
    for _ in range(200):  # bounded: the loop finalises the generator, which writes its trace line on a thread
        if up.closed == 2 and agent._sem._value == 1:
            break
        await asyncio.sleep(0.01)
    assert up.closed == 2 and agent._sem._value == 1


async def test_a_model_error_mid_stream_is_a_model_error_traced_with_the_partial_text_and_not_credited(
    mem: ReMem, tmp_path: Path
) -> None:
    agent = agent_for(mem, _Upstream(fail_after=4), tmp_path)
    searches = mem.stats().searches
    got: list[str] = []
    with pytest.raises(ModelError):
        async for chunk in agent.chat_stream(convo("Where is our server?")):
            got.append(chunk.text)
    assert "".join(got) == "w0 w1 w2 w3 "  # never retried after the first byte
    line = load_traces(tmp_path / "trace.jsonl")[0]
    assert line["reply"]["text"] == "w0 w1 w2 w3 " and "mid-stream" in line["error"]
    assert mem.stats().feedbacks == 0 and mem.stats().searches == searches + 1
    with pytest.raises(UnknownSearchError):  # nothing waits for an outcome
        await agent.feedback(line["answer_id"], success=True)


async def test_traces_of_ask_and_chat_load_together(mem: ReMem, tmp_path: Path) -> None:
    model = FunctionChatModel(lambda req: json.dumps({"answer": "west-2", "citations": []}))
    agent = agent_for(mem, model, tmp_path)
    await agent.ask("Where is our server?")
    await agent.chat(convo("Where is our server?"))
    lines = load_traces(tmp_path / "trace.jsonl")
    assert [ln["v"] for ln in lines] == [1, 2]


def test_recall_query_borrows_the_previous_user_turn_for_a_short_follow_up() -> None:
    from remem_agent.agent.conversation import parse_messages

    msgs = parse_messages(convo("Where does the billing service run?", "In west-2.", "Since when?"))
    assert recall_query(msgs) == "Where does the billing service run?\nSince when?"
    msgs = parse_messages(
        convo("Where does the billing service run?", "In west-2.", "Who owns the billing database now?")
    )
    assert recall_query(msgs) == "Who owns the billing database now?"


def test_correction_heuristic_reads_only_the_opening() -> None:
    assert looks_like_correction("No, it moved to Berlin.")
    assert looks_like_correction("That's wrong.")
    assert looks_like_correction("actually it is Tuesday")
    assert not looks_like_correction("Great. Is there no parking?")
    assert not looks_like_correction("Nobody told me, thanks")


CORRECTIONS = [
    "That’s wrong.",  # U+2019, what phones type
    "That‘s wrong",
    "THAT'S WRONG",
    "thats wrong",
    "That is not right, it moved",
    "It’s outdated: we moved last week",
    "You’re wrong, it is Lisbon",
    "youre mistaken",
    "“No, it’s Lisbon.”",
    "«Nope»",
    "**No.** Lisbon.",
    "  no — Lisbon",
    "Actually, it moved",
    "Incorrect.",
    "Not quite: Lisbon",
    "This is no longer true",
    "👎 Lisbon now",
    "👎️",  # with the emoji variation selector
    "❌ wrong region",
    "Nein, Lissabon.",
    "Falsch",
    "Das stimmt nicht",
    "C’est faux, c’est Lisbonne",
    "Non, Lisbonne.",
    "Incorrecto, es Lisboa",
    "¡No! Es Lisboa",
]
NOT_CORRECTIONS = [
    "Nobody told me, thanks",
    "Great. Is there no parking?",
    "Thanks, that’s right.",
    "That’s great",
    "Nonetheless, thanks",
    "Nonprofit hours?",
    "Know anything else?",
    "👍 thanks",
    "Notes for tomorrow: deploy",
    "What about west-2?",
]


@pytest.mark.parametrize("text", CORRECTIONS)
def test_a_correction_reads_as_one_whatever_its_quotes_case_and_language(text: str) -> None:
    assert looks_like_correction(text), text


@pytest.mark.parametrize("text", NOT_CORRECTIONS)
def test_other_openings_are_no_correction(text: str) -> None:
    assert not looks_like_correction(text), text


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(
        st.sampled_from(["word ", "[M1]", " [M2, M3]", "[", "]", "M", "1", ",", " ", "[x]", "[M12]", "."]), max_size=30
    ),
    st.data(),
)
def test_streamed_citation_stripping_equals_stripping_the_whole_text(parts: list[str], data: st.DataObject) -> None:
    text = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    s = CitationStripper()
    out = "".join(s.feed(p) for p in pieces) + s.flush()
    assert out == strip_citations(text)


_PART = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["\ud800", "\x00", "", "  "]),
    st.integers(),
    st.none(),
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=5)})),
)
_MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "bot", 3]), "content": _PART},
        optional={
            "tool_call_id": st.one_of(st.text(max_size=4), st.integers()),
            "tool_calls": st.one_of(
                st.lists(st.fixed_dictionaries({"id": st.text(max_size=3), "function": st.just({"name": "ping"})})),
                st.text(max_size=3),
            ),
            "name": st.one_of(st.text(max_size=4), st.integers()),
        },
    ),
    st.text(max_size=5),
    st.integers(),
)


@settings(max_examples=300, deadline=None)
@given(
    messages=st.one_of(st.lists(_MESSAGE, max_size=5), st.text(max_size=5), st.none(), st.integers()),
    tools=st.one_of(
        st.none(),
        st.lists(st.one_of(st.just(WEATHER_TOOL), st.dictionaries(st.text(max_size=3), st.integers())), max_size=2),
    ),
)
def test_any_conversation_is_answered_or_refused_with_a_typed_error_and_refusals_change_nothing(
    tmp_path_factory: pytest.TempPathFactory, messages: Any, tools: Any
) -> None:
    from remem_agent import RememError

    async def run() -> None:
        with ReMem(tmp_path_factory.mktemp("p")) as m:
            m.add("Our server moved to west-2.", entity="server", attribute="region")
            agent = MemoryAgent(m, FunctionChatModel(lambda req: "ok [M1]"), trace=False, retry=FAST)
            before = m.stats()
            try:
                await agent.chat(messages, tools=tools)
            except RememError:
                assert m.stats() == before  # a refused call wrote nothing (not even a search record)
            assert m.verify().ok

    asyncio.run(run())


async def test_a_chat_whose_recall_fails_still_leaves_its_trace_line(tmp_path: Path) -> None:
    from remem_agent.errors import StoreError

    class _Broken(ReMem):
        async def asearch(self, query: str, **kw: Any) -> Any:  # type: ignore[override]
            raise StoreError("disk gone")

    with _Broken(tmp_path / "s") as broken:
        agent = MemoryAgent(broken, FunctionChatModel(lambda req: "x"), trace=tmp_path / "t.jsonl")
        with pytest.raises(StoreError):
            await agent.chat([{"role": "user", "content": "Where is our server?"}])
        with pytest.raises(StoreError):
            async for _ in agent.chat_stream([{"role": "user", "content": "Where is our server?"}]):
                pass
    lines = load_traces(tmp_path / "t.jsonl")
    assert [ln["error"] for ln in lines] == ["recall failed: StoreError: disk gone"] * 2


def _outcomes(tmp_path: Path) -> dict[str, dict[str, Any]]:
    return {t["answer_id"]: t for t in load_traces(tmp_path / "trace.jsonl") if t.get("kind") == "outcome"}


async def test_identical_fresh_requests_get_their_own_answers_and_their_own_outcomes(
    mem: ReMem, tmp_path: Path
) -> None:
    said = iter(["It is in west-2 [M1].", "West-2, as far as I know [M1].", "ok", "ok"])
    agent = agent_for(mem, FunctionChatModel(lambda req: next(said)), tmp_path)
    question = convo("Where is our server?")
    first, second = await agent.chat(question), await agent.chat(question)  # two users, same opening words
    assert first.answer_id != second.answer_id
    assert first.conversation_id == second.conversation_id  # the label of the opening: not what threads turns
    # the second user corrects their answer, the first moves on: each verdict reaches its own answer
    await agent.chat(
        [*question, {"role": "assistant", "content": second.text}, {"role": "user", "content": "No, wrong."}]
    )
    await agent.chat([*question, {"role": "assistant", "content": first.text}, {"role": "user", "content": "Thanks!"}])
    outcomes = _outcomes(tmp_path)
    assert outcomes[first.answer_id]["outcome"] == {"success": True, "source": "inferred", "weight": 0.3}
    assert outcomes[second.answer_id]["outcome"] == {"success": False, "source": "inferred", "weight": 1.0}


async def test_the_history_a_client_resends_matches_with_labels_blanks_and_case_aside(
    mem: ReMem, tmp_path: Path
) -> None:
    agent = agent_for(mem, FunctionChatModel(lambda req: "It is in  west-2 [M1].\n"), tmp_path, strip_citations=False)
    question = convo("Where is our server?")
    reply = await agent.chat(question)
    assert reply.text == "It is in  west-2 [M1].\n"
    shown = "it is in west-2."  # a client that shows the stripped, trimmed reply and lower-cases it
    await agent.chat([*question, {"role": "assistant", "content": shown}, {"role": "user", "content": "No, east-1."}])
    assert _outcomes(tmp_path)[reply.answer_id]["outcome"]["success"] is False
    # a rewritten reply is another history: the answer it does not follow keeps waiting for its verdict
    again = await agent.chat(question)
    await agent.chat(
        [*question, {"role": "assistant", "content": "Something else."}, {"role": "user", "content": "No."}]
    )
    assert again.answer_id not in _outcomes(tmp_path)
    assert (await agent.feedback(again.answer_id, success=True)).source == "user"


async def test_with_a_conversation_id_a_new_turn_settles_its_latest_answer(mem: ReMem, tmp_path: Path) -> None:
    agent = agent_for(mem, FunctionChatModel(lambda req: "It is in west-2 [M1]."), tmp_path)
    question = convo("Where is our server?")
    first = await agent.chat(question, conversation_id="c-42")
    retry = await agent.chat(question, conversation_id="c-42")  # the same request again: its own answer
    assert retry.answer_id != first.answer_id and retry.conversation_id == "c-42"
    # the history need not match: the id threads the turns, and the latest answer is the one judged
    edited = [*question, {"role": "assistant", "content": "(edited)"}, {"role": "user", "content": "No, wrong."}]
    await agent.chat(edited, conversation_id="c-42")
    outcomes = _outcomes(tmp_path)
    assert outcomes[retry.answer_id]["outcome"]["success"] is False and first.answer_id not in outcomes


async def test_an_agent_loop_keeps_its_turns_answer_id_and_recall(mem: ReMem, tmp_path: Path) -> None:
    calls = [
        ChatResponse(text="", tool_calls=(ToolCall(id="c1", name="ping", arguments='{"region": "west-2"}'),),
                     finish_reason="tool_calls"),
        ChatResponse(text="west-2 answers [M1]."),
    ]  # fmt: skip
    agent = agent_for(mem, ScriptedChatModel(calls), tmp_path)
    msgs = convo("Is our server up?")
    first = await agent.chat(msgs, tools=[WEATHER_TOOL])
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [c.to_dict() for c in first.tool_calls]},
        {"role": "tool", "tool_call_id": "c1", "content": "pong"},
    ]
    searches = mem.stats().searches
    second = await agent.chat(msgs, tools=[WEATHER_TOOL])
    assert second.answer_id == first.answer_id and not second.recalled and mem.stats().searches == searches
