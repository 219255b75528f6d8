"""The abstain gate: a store with nothing relevant injects nothing, and says so, through every layer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from _gateway import client_of, in_process_app

from remem_agent import ReMem, RememConfig
from remem_agent.adapters.base import ChatRequest
from remem_agent.adapters.fakes import FunctionChatModel
from remem_agent.agent import MemoryAgent
from remem_agent.errors import UserInputError
from remem_agent.ranking.gate import NULL_TEXTS, decide, null_threshold

GATED = RememConfig(abstain="null")
NOTES = ("Our server moved to west-2.", "Billing invoices are sent on the first Monday.")


def test_the_threshold_is_the_quantile_of_the_querys_null_cosines_plus_the_margin() -> None:
    q = np.array([1.0, 0.0])
    null = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6]])  # cosines 1, 0, .6, .8
    assert null_threshold(q, null, quantile=1.0, margin=0.0) == pytest.approx(1.0)
    assert null_threshold(q, null, quantile=0.5, margin=0.1) == pytest.approx(0.7 + 0.1)  # median of 0,.6,.8,1
    assert decide(np.array([0.5, 0.75]), 0.7).abstained is False
    d = decide(np.array([0.5, 0.7]), 0.7)  # must exceed, not equal
    assert d.abstained and d.best == 0.7 and d.margin == pytest.approx(0.0)
    assert decide(np.array([]), 0.1).abstained  # an empty pool has nothing to serve
    assert len(NULL_TEXTS) == len(set(NULL_TEXTS)) >= 60


@pytest.mark.parametrize(
    "over",
    [{"abstain": "sometimes"}, {"abstain_quantile": 1.5}, {"abstain_quantile": -0.1}, {"abstain_margin": 3.0}],
)
def test_bad_gate_settings_are_a_typed_error(over: dict[str, object]) -> None:
    with pytest.raises(UserInputError):
        RememConfig(**over)  # type: ignore[arg-type]


def test_an_unrelated_question_is_served_nothing_and_a_related_one_its_memory(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", config=GATED) as mem:
        server, _ = mem.add_many(list(NOTES))
        off = ReMem(tmp_path / "s")  # the same store without the gate serves its nearest notes regardless
        try:
            assert len(off.search("What is the capital of Australia?").items) == 2
        finally:
            off.close()
        res = mem.search("What is the capital of Australia?")
        assert res.abstained and res.items == () and res.tokens == 0
        with mem.store.read() as tx:
            rec = tx.search(res.search_id)
        assert rec is not None and rec.served == ()  # the search is logged, with nothing served
        mem.feedback(res.search_id, success=True)  # a verdict on it credits nothing
        assert mem.inspect(server).credits == ()
        hit = mem.search("Where does our server run?")
        assert not hit.abstained and hit.ids[0] == server
        assert mem.verify().ok


def test_the_agent_injects_no_memory_block_when_the_gate_abstains(tmp_path: Path) -> None:
    seen: list[ChatRequest] = []

    def model(req: ChatRequest) -> str:
        seen.append(req)
        return "Canberra."

    trace = tmp_path / "trace.jsonl"

    async def go() -> tuple[bool, bool]:
        with ReMem(tmp_path / "s", config=GATED) as mem:
            mem.add_many(list(NOTES))
            agent = MemoryAgent(mem, FunctionChatModel(model), trace=str(trace))
            try:
                unrelated = await agent.chat([{"role": "user", "content": "What is the capital of Australia?"}])
                related = await agent.chat([{"role": "user", "content": "Where does our server run?"}])
            finally:
                await agent.aclose()
            assert unrelated.served == () and related.served != ()
            return unrelated.abstained, related.abstained

    assert asyncio.run(go()) == (True, False)
    assert [m.role for m in seen[0].messages] == ["user"]  # exactly what was sent without memory
    assert any(m.role == "system" and "west-2" in m.content for m in seen[1].messages)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    chats = [t for t in lines if t.get("kind") == "chat"]
    assert [t["abstained"] for t in chats] == [True, False] and chats[0]["memory_block"] is None


@pytest.mark.parametrize("stream", [False, True])
def test_the_gateway_says_it_abstained_in_headers_and_body(tmp_path: Path, stream: bool) -> None:
    seen: list[ChatRequest] = []

    def model(req: ChatRequest) -> str:
        seen.append(req)
        return "Canberra."

    with ReMem(tmp_path / "s", config=GATED) as mem:
        mem.add_many(list(NOTES))
        app = in_process_app(mem, tmp_path, FunctionChatModel(model), ("local",))
        with client_of(app) as client:
            body = {"model": "local", "messages": [{"role": "user", "content": "What is the capital of Australia?"}]}
            if not stream:
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                assert r.headers["x-remem-abstained"] == "true" and r.headers["x-remem-served"] == ""
                assert r.json()["remem"]["abstained"] is True and r.json()["remem"]["served"] == []
            else:
                r = client.post("/v1/chat/completions", json={**body, "stream": True})
                assert r.status_code == 200 and r.headers["x-remem-abstained"] == "true"
            related = {"model": "local", "messages": [{"role": "user", "content": "Where does our server run?"}]}
            r = client.post("/v1/chat/completions", json=related)
            assert "x-remem-abstained" not in r.headers and "abstained" not in r.json()["remem"]
    assert [m.role for m in seen[0].messages] == ["user"]


def test_remem_serve_abstain_opens_its_store_with_the_gate(tmp_path: Path) -> None:
    from remem_agent.gateway import GatewayConfig, create_app

    with ReMem(tmp_path / "s") as mem:
        mem.add_many(list(NOTES))
    seen: list[ChatRequest] = []

    def model(req: ChatRequest) -> str:
        seen.append(req)
        return "Canberra."

    for abstain in (False, True):
        config = GatewayConfig(store=str(tmp_path / "s"), abstain=abstain, models=("local",), trace="off")
        with client_of(create_app(config, model=FunctionChatModel(model))) as client:
            body = {"model": "local", "messages": [{"role": "user", "content": "What is the capital of Australia?"}]}
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            assert (r.headers.get("x-remem-abstained") == "true") is abstain
    assert [len(r.messages) for r in seen] == [2, 1]  # the nearest notes without the gate; nothing with it
