"""Waiting answers shared through the ledger (store/pending.py, remem_agent/shared_outcomes.py), on both backends.

* the pending store itself: one claim per answer however many handles race for it, release, the latest
  answer of a thread (not a retry of the same turn), corrections by a new fact, and ``verify`` seeing a
  waiting answer that points at no search;
* two ``remem serve`` processes on one store: turn 1 of a conversation answered by A, its correction (turn 2)
  reaching B: the inferred failure is recorded once, by B; the "moved on" of turn 3 back at A; explicit
  feedback for an answer of one process sent to the other;
* ``remem serve --workers 2`` on one SQLite store: every conversation's first answer settled exactly once,
  whichever worker each turn reached.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from _llama_server import free_port, serve_process
from _ollama_server import FakeOllama, chat_ok

from remem_agent import ReMem
from remem_agent.outcomes.ledger import LedgerPendingOutcomes
from remem_agent.outcomes.pending import Waiting
from remem_agent.store import pending

MODEL = "qwen2.5:0.5b"
QUESTION = "Where is our server hosted these days?"
StoreLocation = Callable[[str], "str | Path"]


def _waiting(mem: ReMem, answer_id: str, *, cited: tuple[str, ...] = (), turn: str = "0:a") -> Waiting:
    res = mem.search(QUESTION, k=3)
    return Waiting(
        answer_id=answer_id,
        search_id=res.search_id,
        served_ids=tuple(res.ids),
        cited_ids=cited,
        value=None,
        scope="default",
        turn=turn,
    )


@pytest.fixture()
def two_handles(store_location: StoreLocation) -> Iterator[tuple[ReMem, ReMem]]:
    loc = store_location("shared")
    a = ReMem(loc)
    mid = a.add("Our server moved to west-2.", entity="server", attribute="region")
    assert mid
    b = ReMem(loc)
    yield a, b
    b.close()
    a.close()


async def test_one_claim_per_answer_across_handles(two_handles: tuple[ReMem, ReMem]) -> None:
    a, b = two_handles
    pa, pb = LedgerPendingOutcomes(a.store, claimant="a"), LedgerPendingOutcomes(b.store, claimant="b")
    item = _waiting(a, "a_1")
    await pa.add(item, ("conv", "default|c1"))
    assert await pb.scope_of("a_1") == "default" and await pb.scope_of("a_nope") is None
    assert await pb.take("a_1", scope="user:eve") is None  # another scope never claims it
    got = await asyncio.gather(*(p.take("a_1") for p in (pa, pb) * 6))
    winners = [w for w in got if w is not None]
    assert len(winners) == 1 and winners[0] == item  # every field back as it was added
    assert await pa.take("a_1") is None
    await pb.release(winners[0])  # the verdict could not be recorded: judge it again
    assert await pa.take("a_1") == item
    assert a.verify().ok and b.verify().ok


async def test_the_latest_answer_of_a_thread(two_handles: tuple[ReMem, ReMem]) -> None:
    a, b = two_handles
    pa, pb = LedgerPendingOutcomes(a.store), LedgerPendingOutcomes(b.store)
    thread = ("conv", "default|c2")
    assert await pb.latest(thread) is None and await pb.take_latest(thread) is None
    first, second = _waiting(a, "a_1", turn="0:x"), _waiting(a, "a_2", turn="2:y")
    await pa.add(first, thread)
    await pa.add(second, thread)
    await pa.add(_waiting(a, "a_other"), ("conv", "default|c3"))
    latest = await pb.latest(thread)
    assert latest is not None and latest.answer_id == "a_2" and latest.turn == "2:y"
    # a tool loop's later reply of the same turn updates what the answer cited
    await pa.add(Waiting(**{**second.__dict__, "cited_ids": ("m_x",)}), thread)
    taken = await pb.take_latest(thread)
    assert taken is not None and taken.answer_id == "a_2" and taken.cited_ids == ("m_x",)
    assert await pa.latest(thread) is None  # the newest was judged; the older one is not reached past it
    assert await pa.take_latest(thread) is None


async def test_a_correction_claims_the_answers_that_relied_on_the_memory(two_handles: tuple[ReMem, ReMem]) -> None:
    a, b = two_handles
    (m,) = a.list()
    pa, pb = LedgerPendingOutcomes(a.store), LedgerPendingOutcomes(b.store)
    await pa.add(_waiting(a, "a_cited", cited=(m.id,)), ("conv", "default|c1"))
    await pa.add(_waiting(a, "a_served_only"), ("conv", "default|c2"))
    got = await asyncio.gather(pa.take_relying_on([m.id]), pb.take_relying_on([m.id]))
    claimed = [(w.answer_id, ids) for batch in got for w, ids in batch]
    assert claimed == [("a_cited", [m.id])]
    assert await pb.take("a_served_only") is not None  # merely served: its own verdict still comes


def test_verify_reports_a_waiting_answer_without_its_search(two_handles: tuple[ReMem, ReMem]) -> None:
    a, _ = two_handles
    rec = pending.PendingRecord(
        answer_id="a_ghost", scope="default", thread="conv:default|c", turn="0:a", search_id="s_missing",
        served_ids=(), cited_ids=(), used_ids=(), value=None, created_at=0.0,
    )  # fmt: skip
    with a.store.write() as tx:
        assert pending.problems(tx) == []
        pending.put(tx, rec)
    with a.store.read() as tx:
        (problem,) = pending.problems(tx)
    assert "a_ghost" in problem and "s_missing" in problem


# ---------------------------------------------------------------------------------- processes
@contextmanager
def gateway_process(store: str, upstream: str, trace: Path, *extra: str) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "remem_agent.cli", "serve", "--store", store, "--upstream", upstream]
    cmd += ["--upstream-kind", "ollama", "--models", MODEL, "--port", str(port), "--trace", str(trace), *extra]
    base = f"http://127.0.0.1:{port}"
    with serve_process(cmd, f"{base}/healthz", "remem serve", timeout_s=90):
        yield base


def _lines(*paths: Path, kind: str) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        if p.exists():
            out += [r for r in map(json.loads, p.read_text().splitlines()) if r["kind"] == kind]
    return out


def _chat(http: httpx.Client, base: str, messages: list[dict[str, str]]) -> httpx.Response:
    r = http.post(f"{base}/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert r.status_code == 200, r.text
    return r


def _said(r: httpx.Response) -> str:
    content = r.json()["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


def test_the_next_turn_settles_the_answer_another_process_gave(store_location: StoreLocation, tmp_path: Path) -> None:
    store = str(store_location("gw"))
    ta, tb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    with FakeOllama() as fake, ExitStack() as stack:
        fake.default = chat_ok("It is in west-2 [M1].", model=MODEL)
        a = stack.enter_context(gateway_process(store, fake.url, ta))
        b = stack.enter_context(gateway_process(store, fake.url, tb))
        http = stack.enter_context(httpx.Client(trust_env=False, timeout=60))
        added = http.post(f"{a}/v1/memories", json={"text": "Our server moved to west-2.", "entity": "server",
                                                    "attribute": "region"})  # fmt: skip
        mid = added.json()["id"]
        turn1 = [{"role": "user", "content": QUESTION}]
        r1 = _chat(http, a, turn1)
        a1 = r1.headers["x-remem-answer-id"]
        assert r1.headers["x-remem-served"] == mid
        # no conversation id: each turn resends the history, replies as the client got them
        turn2 = [*turn1, {"role": "assistant", "content": _said(r1)},
                 {"role": "user", "content": "No, that's wrong: it moved to east-1 last week."}]  # fmt: skip
        r2 = _chat(http, b, turn2)
        a2 = r2.headers["x-remem-answer-id"]  # B settles A's a1: a correction
        turn3 = [*turn2, {"role": "assistant", "content": _said(r2)},
                 {"role": "user", "content": "Thanks, and which team runs it there?"}]  # fmt: skip
        a3 = _chat(http, a, turn3).headers["x-remem-answer-id"]  # A settles B's a2: moved on
        _chat(http, b, turn3)  # a retry of turn 3 reaching B is no next turn: a3 stays waiting
        # explicit feedback for A's answer sent to B; a second verdict for a1 (already inferred) is refused
        assert http.post(f"{b}/v1/feedback", json={"answer_id": a3, "success": True}).status_code == 200
        assert http.post(f"{a}/v1/feedback", json={"answer_id": a1, "success": True}).status_code == 409
        info = http.get(f"{a}/v1/memories/{mid}").json()
        for base in (a, b):
            report = http.get(f"{base}/v1/verify").json()
            assert report["ok"] and report["problems"] == []
    outcomes = {o["answer_id"]: o for o in _lines(tb, kind="outcome")}
    from_a = {o["answer_id"]: o for o in _lines(ta, kind="outcome")}
    assert set(outcomes) == {a1, a3} and set(from_a) == {a2}  # each settled once, by the process that saw it
    assert outcomes[a1]["outcome"] == {"success": False, "source": "inferred", "weight": 1.0}
    assert from_a[a2]["outcome"]["success"] is True and from_a[a2]["outcome"]["source"] == "inferred"
    assert outcomes[a3]["outcome"]["source"] == "user"
    assert len(info["credits"]) == 3 and [c["success"] for c in info["credits"]] == [False, True, True]


def test_workers_share_the_waiting_answers(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    traces = tmp_path / "traces"
    with FakeOllama() as fake, ExitStack() as stack:
        fake.default = chat_ok("It is in west-2 [M1].", model=MODEL)
        base = stack.enter_context(gateway_process(store, fake.url, traces / "gw.jsonl", "--workers", "2"))
        http = stack.enter_context(httpx.Client(trust_env=False, timeout=60, headers={"connection": "close"}))
        assert http.post(f"{base}/v1/memories", json={"text": "Our server moved to west-2.", "entity": "server",
                                                       "attribute": "region"}).status_code == 201  # fmt: skip
        n = 12

        def conversation(i: int) -> None:
            first = [{"role": "user", "content": f"{QUESTION} (conversation {i})"}]
            _chat(http, base, first)
            moved_on = {"role": "user", "content": "Thanks. And which team runs it there?"}
            _chat(http, base, [*first, {"role": "assistant", "content": "It is in west-2."}, moved_on])

        with ThreadPoolExecutor(4) as pool:  # concurrent, on fresh connections: both workers take some
            list(pool.map(conversation, range(n)))
        stats = http.get(f"{base}/v1/stats").json()
        report = http.get(f"{base}/v1/verify").json()
    assert stats["feedbacks"] == n and report["ok"]  # every first answer settled, each exactly once
    outcomes = _lines(*traces.glob("*.jsonl"), kind="outcome")
    assert len(outcomes) == n and all(o["outcome"]["success"] is True for o in outcomes)
    assert len({o["answer_id"] for o in outcomes}) == n
