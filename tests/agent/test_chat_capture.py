"""Fact capture from user turns: background, bounded, superseding, and a correction for a waiting answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from remem_agent import ReMem, State
from remem_agent.adapters import ChatRequest, FunctionChatModel
from remem_agent.agent import MemoryAgent, load_traces
from remem_agent.extract import LLMFactExtractor
from remem_agent.validate import MemoryInput


def _facts(req: ChatRequest) -> str:
    said = req.messages[-1].content
    if "eu-3" in said:
        return json.dumps(
            {
                "facts": [
                    {"text": "Our server moved to eu-3.", "role": "state", "entity": "server", "attribute": "region"}
                ]
            }
        )
    return json.dumps({"facts": []})


async def test_a_stated_fact_is_captured_supersedes_and_fails_the_answer_it_contradicts(tmp_path: Path) -> None:
    mem = ReMem(tmp_path / "store")
    west = mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=1)
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].")
    async with MemoryAgent(
        mem, model, trace=tmp_path / "t.jsonl", capture=LLMFactExtractor(FunctionChatModel(_facts))
    ) as agent:
        msgs = [{"role": "user", "content": "Where is our server?"}]
        first = await agent.chat(msgs)
        assert first.citations == (west,)
        msgs += [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "We moved the server to eu-3 yesterday."},
        ]
        await agent.chat(msgs)
        assert agent.capture is not None
        await agent.capture.drain()
        assert agent.capture.captured == 1 and agent.capture.dropped == 0
    assert mem.get(west).state is State.INVALIDATED  # the captured fact superseded it
    current = [m for m in mem.list() if m.key == ("server", "region") and m.state is not State.INVALIDATED]
    assert [m.text for m in current] == ["Our server moved to eu-3."]
    credits = {c.search_id: c for c in mem.inspect(west).credits}
    assert not credits[first.search_id].success  # the answer that used it failed: not a "moved on" success
    assert all(not c.success for c in credits.values())  # and so did the one served it while capture ran
    kinds = [ln["kind"] for ln in load_traces(tmp_path / "t.jsonl")]
    assert kinds.count("capture") == 2 and "outcome" in kinds
    mem.close()


class _Blocked:
    """An extractor that waits until released: the replies must not wait for it."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.seen: list[str] = []

    async def aextract(self, transcript: str) -> Sequence[MemoryInput]:
        self.seen.append(transcript)
        await self.release.wait()
        return []


async def test_capture_never_delays_a_reply_and_drops_beyond_its_queue(tmp_path: Path) -> None:
    mem = ReMem(tmp_path / "store")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    blocked = _Blocked()
    agent = MemoryAgent(mem, FunctionChatModel(lambda req: "ok"), trace=False, capture=blocked, capture_queue=1)
    for i in range(4):  # four conversations, one user turn each, while the extractor is stuck on the first
        await asyncio.wait_for(agent.chat([{"role": "user", "content": f"turn {i}: hello there"}]), timeout=10)
    assert agent.capture is not None
    assert agent.capture.submitted == 2 and agent.capture.dropped == 2  # one in the worker, one queued
    blocked.release.set()
    await agent.capture.drain()
    assert blocked.seen == ["turn 0: hello there", "turn 1: hello there"]
    await agent.aclose()
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    mem.close()


async def test_a_correction_fails_only_answers_that_relied_on_the_corrected_memory(tmp_path: Path) -> None:
    mem = ReMem(tmp_path / "store")
    west = mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=1)
    mem.add("The team lunch is on Fridays.", role="note", timestamp=1)

    def reply(req: ChatRequest) -> str:
        return "It is in west-2 [M1]." if "server" in req.messages[-1].content else "Fridays, I think."

    agent = MemoryAgent(mem, FunctionChatModel(reply), trace=False)
    relied = await agent.chat([{"role": "user", "content": "Where is our server?"}], conversation_id="a")
    other = await agent.chat(
        [{"role": "user", "content": "When is lunch? And where do the machines live?"}], conversation_id="b"
    )
    assert west in relied.used  # it repeats the memory's value
    assert west in {h.id for h in other.served} and west not in (*other.used, *other.citations)
    await agent.remember("Our server moved to eu-3.", entity="server", attribute="region", timestamp=2)
    credits = {c.search_id: c for c in mem.inspect(west).credits}
    assert not credits[relied.search_id].success  # it cited the corrected memory: a failure
    assert other.search_id not in credits  # served it without relying on it: its own verdict is still to come
    await agent.feedback(other.answer_id, success=True)
    mem.close()
