"""The chat call's stages one by one: recall once per turn (``recall``), what a reply teaches (``learn``) and the
call's trace line (``chat_trace``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel, RetryPolicy
from remem_agent.adapters.base import ChatResponse, ToolCall, Usage
from remem_agent.agent import MemoryAgent, load_traces
from remem_agent.agent.chat_trace import ChatTraceLine, failed_recall_line
from remem_agent.agent.learn import read_reply, thread_after, turn_key
from remem_agent.agent.recall import thread_before

FAST = RetryPolicy(max_attempts=1, initial_backoff=0.0, max_backoff=0.0)
LINE_KEYS = [
    "v", "kind", "ts", "run", "answer_id", "conversation_id", "scope", "turn", "task", "model", "search_id",
    "recall_query", "recalled", "abstained", "served", "aliases", "messages", "memory_block", "tools", "stream",
    "reply", "citations", "unknown_citations", "used", "error", "latency_ms",
]  # fmt: skip


def _agent(tmp_path: Path, reply: str = "It is in west-2 [M1].") -> tuple[MemoryAgent, ReMem, FunctionChatModel]:
    mem = ReMem(tmp_path / "store")
    mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=1)
    model = FunctionChatModel(lambda req: reply)
    return MemoryAgent(mem, model, trace=tmp_path / "t.jsonl", retry=FAST), mem, model


def test_a_chat_line_has_the_trace_formats_keys_in_order(tmp_path: Path) -> None:
    agent, mem, _ = _agent(tmp_path)
    with mem:
        asyncio.run(agent.chat([{"role": "user", "content": "Where is our server?"}], conversation_id="c1"))
    (line,) = load_traces(tmp_path / "t.jsonl", kind="chat")
    assert list(line) == LINE_KEYS
    assert line["recalled"] is True and line["citations"] and line["used"] == [line["served"][0]["id"]]
    assert set(line["latency_ms"]) == {"recall", "model", "total", "overhead"}


def test_a_failed_recall_line_leaves_out_what_describes_a_turn(tmp_path: Path) -> None:
    agent, mem, _ = _agent(tmp_path)
    with mem:
        opts = agent._conversations.options(
            [{"role": "user", "content": "hi"}], {"conversation_id": "c"}, sampling=agent.sampling, strip=False
        )
    line = failed_recall_line("run-1", opts, RuntimeError("disk full"), 1.5).to_dict()
    assert [k for k in LINE_KEYS if k not in line] == ["abstained", "unknown_citations", "used"]
    assert line["error"] == "recall failed: RuntimeError: disk full" and line["latency_ms"] == {"total": 1.5}
    assert line["model"] == {"adapter": "function", "name": "function"} and line["turn"] == 0


def test_latency_is_added_to_a_copy() -> None:
    base = ChatTraceLine(
        run="r", answer_id="a", conversation_id="c", scope="s", turn=0, task=None, model={}, search_id=None,
        recall_query=None, recalled=False, served=[], aliases={}, messages=[], memory_block=None, tools=[],
        stream=False, reply={}, citations=[], error=None,
    )  # fmt: skip
    timed = base.with_latency({"total": 2.0})
    assert base.latency_ms == {} and timed.to_dict()["latency_ms"] == {"total": 2.0} and timed.ts == base.ts


def test_a_turn_is_recalled_once_and_read_by_learn(tmp_path: Path) -> None:
    agent, mem, _ = _agent(tmp_path)
    conv = agent._conversations
    msgs = [{"role": "user", "content": "Where is our server?"}]
    with mem:
        first = asyncio.run(agent.chat(msgs, conversation_id="c1"))
        loop = [*msgs, {"role": "assistant", "content": "", "tool_calls": [{"id": "t", "type": "function",
                "function": {"name": "ping", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "t",
                "content": "pong"}]  # fmt: skip
        again = asyncio.run(agent.chat(loop, conversation_id="c1"))
        assert again.answer_id == first.answer_id and again.recalled is False and mem.stats().searches == 1
        turn = conv.turns.by_answer(first.answer_id)
        assert turn is not None and turn.answered and turn.cited == list(first.citations)
        opts = conv.options(msgs, {"conversation_id": "c1"}, sampling=agent.sampling, strip=False)
        resp = ChatResponse(text="west-2, as before", tool_calls=(ToolCall(id="x", name="ping", arguments="{}"),))
        reply, waiting = read_reply(opts, turn, resp, recalled=False)
        assert reply.citations == () and reply.used == (turn.result.ids[0],)  # the value, not a label
        assert waiting is not None and waiting[1] == thread_after(opts, resp) == ("conv", "default|c1")
        assert waiting[0].turn == turn_key(turn.key) and waiting[0].served_ids == tuple(turn.result.ids)
        assert thread_before(opts, 0) == ("conv", "default|c1")
        unthreaded = conv.options(msgs, {}, sampling=agent.sampling, strip=False)
        assert thread_before(unthreaded, 0) is None  # a conversation's opening follows nothing
        assert read_reply(opts, turn, ChatResponse(text="ok", usage=Usage()), recalled=False)[0].used == ()
