"""Bounded growth (ledger schema 13): waiting answers expire after a TTL, old unjudged traffic is pruned with
every learned statistic kept, and ``verify()`` still holds on both backends."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import _sqlite_downgrades
import pytest
from _sqlite_downgrades import SQLITE_13_TO_12

from remem_agent import (
    AnswerExpiredError,
    FunctionChatModel,
    MemoryAgent,
    ReMem,
    ScriptedChatModel,
    UnknownSearchError,
    UserInputError,
)
from remem_agent.cli import main
from remem_agent.outcomes.ledger import LedgerPendingOutcomes
from remem_agent.outcomes.pending import PendingOutcomes, Waiting
from remem_agent.store import pending, pruning
from remem_agent.store.pruning import GrowthLimits
from remem_agent.types import ALL_TASKS

DAY = 86_400.0
NOTES = [
    "The deploy service runs in eu-west-2.",
    "The billing service retries failed charges three times.",
    "Alice owns the pricing service.",
]


def _retrieved(mem: ReMem) -> dict[tuple[str, str], int]:
    with mem.store.read() as tx:
        rows = tx.run("SELECT memory_id, task, retrieved FROM stats").fetchall()
    return {(str(m), str(t)): int(n) for m, t, n in rows}


def _backdate(mem: ReMem, search_ids: list[str], at: float) -> None:
    """Move searches (and their waiting answers) back in time: rows as an old store holds them."""
    with mem.store.write() as tx:
        for sid in search_ids:
            tx.run("UPDATE searches SET at = ? WHERE search_id = ?", (at, sid))
            tx.run("UPDATE pending_outcomes SET created_at = ? WHERE search_id = ?", (at, sid))


def _waiting(mem: ReMem, search_id: str, answer_id: str, *, thread: str, created_at: float) -> None:
    rec = pending.PendingRecord(
        answer_id=answer_id,
        scope="default",
        thread=thread,
        turn="",
        search_id=search_id,
        served_ids=(),
        cited_ids=(),
        used_ids=(),
        value=None,
        created_at=created_at,
    )
    mem.store.transact(lambda tx: pending.put(tx, rec))


def test_prune_deletes_old_unjudged_searches_and_keeps_what_they_fed(
    store_location: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    t0 = time.time() + 60  # after the adds below, which take the real time
    clock = [t0]  # when ReMem records a search
    monkeypatch.setattr("remem_agent.memory.wall_now", lambda: clock[0])
    with ReMem(store_location("s"), embedder="hash") as mem:
        mem.add_many(NOTES)
        old = [mem.search(q, k=2, task="ops").search_id for q in ("deploy region", "billing retries", "pricing")]
        judged = mem.search("who owns pricing", k=2, task="ops")
        mem.feedback(judged.search_id, success=True, used_ids=[judged.items[0].id])
        _waiting(mem, old[0], "a_old", thread="conv:default|x", created_at=t0)
        clock[0] = t0 + 7.5 * DAY
        fresh = mem.search("deploy service", k=2).search_id
        before = _retrieved(mem)
        assert mem.verify().ok

        report = mem.prune(answer_ttl_s=DAY, retention_s=7 * DAY, now=t0 + 8 * DAY)

        assert report.pruned_searches == 3 and report.expired_answers == 1 and report.pruned_answers == 1
        with mem.store.read() as tx:
            left = {r[0] for r in tx.run("SELECT search_id FROM searches")}
            assert tx.run("SELECT COUNT(*) FROM pending_outcomes").fetchone()[0] == 0
        assert left == {judged.search_id, fresh}  # the judged search is the learning record: kept
        assert _retrieved(mem) == before  # every statistic stays; verify checks retrieved against the base
        assert mem.verify().ok, mem.verify().problems
        with mem.store.read() as tx:
            base = pruning.retrieval_base(tx)
        assert sum(n for (_, t), n in base.items() if t == ALL_TASKS) == 6  # 3 searches x 2 served
        assert all(n == base[(m, ALL_TASKS)] for (m, t), n in base.items() if t == "ops")

        # learning goes on over the pruned history: the counts keep adding up
        mem.search("deploy region", k=2, task="ops")
        assert mem.verify().ok
        assert mem.prune(answer_ttl_s=DAY, retention_s=7 * DAY, now=t0 + 8 * DAY).pruned_searches == 0


def test_a_tampered_retrieval_base_fails_verify(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        mem.add_many(NOTES)
        sid = mem.search("deploy region", k=2).search_id
        _backdate(mem, [sid], 1_000.0)
        mem.prune(answer_ttl_s=DAY, retention_s=DAY, now=1_000.0 + 2 * DAY)
        assert mem.verify().ok
        with mem.store.write() as tx:
            tx.run("UPDATE retrieval_base SET retrieved = retrieved + 1")
        problems = mem.verify().problems
    assert any("retrieved=" in p for p in problems), problems


def test_expired_answers_cannot_be_claimed_and_say_so(store_location: Any) -> None:
    with ReMem(store_location("s"), embedder="hash") as mem:
        mem.add_many(NOTES)
        sid = mem.search("deploy region", k=2).search_id
        _waiting(mem, sid, "a_1", thread="conv:default|t", created_at=1_000.0)
        with mem.store.write() as tx:
            # within the TTL the answer is the thread's latest and can be claimed; past it, nothing claims it
            assert pending.latest(tx, "conv:default|t", fresh_after=999.0) is not None
            assert pending.latest(tx, "conv:default|t", fresh_after=1_001.0) is None
            assert pending.claim_latest(tx, "conv:default|t", by="t", at=2_000.0, fresh_after=1_001.0) is None
            assert pending.claim(tx, "a_1", scope=None, by="t", at=2_000.0, fresh_after=1_001.0) is None
            assert pending.waiting(tx, fresh_after=1_001.0) == []
            assert pending.expired(tx, "a_1", scope=None, fresh_after=1_001.0)
            assert not pending.expired(tx, "a_1", scope=None, fresh_after=999.0)
            assert not pending.expired(tx, "a_1", scope="other", fresh_after=1_001.0)
            assert not pending.expired(tx, "a_unknown", scope=None, fresh_after=1_001.0)
        # a sweep marks it: expired for good, never "judged", its search kept (no outcome is not a failure)
        assert mem.prune(answer_ttl_s=DAY, now=1_000.0 + 2 * DAY).expired_answers == 1
        with mem.store.read() as tx:
            assert pending.expired(tx, "a_1", scope=None, fresh_after=None)
            assert pending.judged(tx, "a_1", scope=None) is None
            assert tx.search(sid) is not None and tx.search(sid).feedback is None
        assert mem.verify().ok


def test_feedback_on_an_expired_answer_is_a_typed_error_that_changes_nothing(tmp_path: Path) -> None:
    async def run() -> None:
        with ReMem(tmp_path / "s", embedder="hash") as mem:
            mem.add_many(NOTES)
            ledger = LedgerPendingOutcomes(mem.store, ttl_s=DAY)
            agent = MemoryAgent(mem, ScriptedChatModel(["eu-west-2"]), trace=False, pending=ledger)
            reply = await agent.chat([{"role": "user", "content": "Where does the deploy service run?"}])
            assert reply.answer_id is not None and reply.served
            with mem.store.write() as tx:  # the answer was given two days ago
                tx.run("UPDATE pending_outcomes SET created_at = created_at - ?", (2 * DAY,))
            before = mem.stats()
            with pytest.raises(AnswerExpiredError) as info:
                await agent.feedback(reply.answer_id, success=True)
            assert isinstance(info.value, UnknownSearchError)  # callers catching the old error still do
            assert "expired" in str(info.value)
            assert mem.stats().feedbacks == before.feedbacks
            # an id never given is still plainly unknown
            with pytest.raises(UnknownSearchError) as unknown:
                await agent.feedback("a_never", success=True)
            assert not isinstance(unknown.value, AnswerExpiredError)

    asyncio.run(run())


def test_in_process_pending_answers_expire_too(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("remem_agent.outcomes.pending.time.monotonic", lambda: clock[0])

    async def run() -> None:
        store: PendingOutcomes[str] = PendingOutcomes(ttl_s=10.0)
        item = Waiting(answer_id="a", search_id="s", served_ids=(), cited_ids=(), value=None)
        await store.add(item, "t")
        assert await store.latest("t") == item and not await store.expired("a")
        clock[0] = 111.0
        assert await store.latest("t") is None
        assert await store.expired("a")
        assert await store.take("a") is None and await store.take_latest("t") is None

    asyncio.run(run())
    with pytest.raises(UserInputError):
        PendingOutcomes(ttl_s=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"answer_ttl_s": 0},
        {"answer_ttl_s": -1.0},
        {"answer_ttl_s": float("nan")},
        {"answer_ttl_s": True},
        {"answer_ttl_s": "7"},
        {"retention_s": DAY},  # pruning needs a TTL: a search is pruned only once no answer can wait for it
        {"answer_ttl_s": 2 * DAY, "retention_s": DAY},
    ],
)
def test_bad_limits_are_refused_before_anything_is_written(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        mem.add_many(NOTES)
        mem.search("deploy", k=2)
        with pytest.raises(UserInputError):
            mem.prune(**kwargs, now=10 * 365 * DAY + 2e9)
        assert mem.stats().searches == 1
    with pytest.raises(UserInputError):
        GrowthLimits(**kwargs)


def test_stats_show_what_is_kept_and_the_disk_it_takes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        mem.add_many(NOTES)
        sid = mem.search("deploy", k=2).search_id
        judged = mem.search("billing", k=2)
        mem.feedback(judged.search_id, success=False)
        _waiting(mem, sid, "a_1", thread="conv:default|t", created_at=1_000.0)
        stats = mem.stats()
    assert stats.kept == {
        "searches_judged": 1,
        "searches_unjudged": 1,
        "answers_waiting": 1,
        "answers_settled": 0,
        "answers_expired": 0,
        "responses": 0,
    }
    assert stats.disk_bytes is not None and stats.disk_bytes > 0
    (tmp_path / "s" / "traces").mkdir()
    (tmp_path / "s" / "traces" / "gateway-1.jsonl").write_text("{}\n")
    assert main(["stats", str(tmp_path / "s")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kept"] == stats.kept and out["disk_bytes"] > 0
    assert out["traces"] == {"files": 1, "bytes": 3}


def test_cli_prune_expires_and_prunes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        mem.add_many(NOTES)
        sid = mem.search("deploy", k=2).search_id
        _backdate(mem, [sid], 1_000.0)
        _waiting(mem, sid, "a_1", thread="conv:default|t", created_at=1_000.0)
    assert main(["prune", str(tmp_path / "s"), "--answer-ttl-days", "1", "--retention-days", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {"expired_answers": 1, "pruned_searches": 1, "pruned_answers": 1, "pruned_responses": 0}
    assert main(["verify", str(tmp_path / "s")]) == 0
    capsys.readouterr()
    for bad in (
        ["--answer-ttl-days", "0"],
        ["--answer-ttl-days", "x"],
        ["--answer-ttl-days", "1", "--retention-days", "-1"],
    ):
        with pytest.raises(SystemExit):
            main(["prune", str(tmp_path / "s"), *bad])
    # retention shorter than the TTL: refused with the library's message, nothing written
    assert main(["prune", str(tmp_path / "s"), "--answer-ttl-days", "3", "--retention-days", "2"]) == 2


def test_version_12_store_upgrades_and_prunes(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        mem.add_many(NOTES)
        sid = mem.search("deploy", k=2).search_id
        _backdate(mem, [sid], 1_000.0)
    conn = sqlite3.connect(tmp_path / "s" / "ledger.db")
    _sqlite_downgrades.downgrade(conn, SQLITE_13_TO_12)
    conn.close()
    with ReMem(tmp_path / "s", embedder="hash") as mem:
        assert mem.store.schema_version == 16
        assert mem.prune(answer_ttl_s=DAY, retention_s=DAY, now=1_000.0 + 2 * DAY).pruned_searches == 1
        assert mem.verify().ok


def test_gateway_answers_410_for_an_expired_answer_and_sweeps(tmp_path: Path) -> None:
    from _gateway import client_of

    from remem_agent.gateway import GatewayConfig, create_app

    mem = ReMem(tmp_path / "store", embedder="hash")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name="m")
    config = GatewayConfig(trace=str(tmp_path / "trace.jsonl"), models=("m",), answer_ttl_s=DAY, retention_s=2 * DAY)
    app = create_app(config, memory=mem, model=model)
    user = [{"role": "user", "content": "Where is our server hosted these days?"}]
    with client_of(app) as client:
        first = client.post("/v1/chat/completions", json={"model": "m", "messages": user})
        second = client.post("/v1/chat/completions", json={"model": "m", "messages": user})
        old, fresh = first.headers["x-remem-answer-id"], second.headers["x-remem-answer-id"]
        with mem.store.write() as tx:  # the first answer was given three days ago
            tx.run("UPDATE pending_outcomes SET created_at = created_at - ? WHERE answer_id = ?", (3 * DAY, old))
            tx.run(
                "UPDATE searches SET at = at - ? WHERE search_id = "
                "(SELECT search_id FROM pending_outcomes WHERE answer_id = ?)",
                (3 * DAY, old),
            )
        r = client.post("/v1/feedback", json={"answer_id": old, "success": True})
        assert r.status_code == 410 and r.json()["error"]["code"] == "answer_expired", r.text
        assert client.post("/v1/feedback", json={"answer_id": fresh, "success": True}).status_code == 200
        report = asyncio.run_coroutine_threadsafe(app.state.gateway.sweep(), _loop_of(app)).result(30)
        assert report is not None and report.expired_answers == 1 and report.pruned_searches == 1
        # after the sweep the expired answer is gone with its search: an unknown id, 404
        r = client.post("/v1/feedback", json={"answer_id": old, "success": True})
        assert r.status_code == 404
        assert "remem_gateway_sweeps_total" in client.get("/metrics").text
    assert mem.verify().ok and mem.stats().kept["searches_judged"] == 1
    mem.close()


def _loop_of(app: Any) -> asyncio.AbstractEventLoop:
    loop = app.state.gateway._sweeper.get_loop()  # the server thread's loop: the sweeper task runs there
    assert isinstance(loop, asyncio.AbstractEventLoop)
    return loop


@pytest.mark.parametrize(
    "over",
    [
        {"answer_ttl_s": 0},
        {"retention_s": 3600.0, "answer_ttl_s": DAY},
        {"sweep_interval_s": float("inf")},
        {"trace_max_bytes": 0},
        {"trace_keep_days": -1},
        {"trace_max_bytes": 1.5},
    ],
)
def test_gateway_config_refuses_bad_growth_settings(over: dict[str, Any]) -> None:
    from remem_agent.gateway.config import GatewayConfig, GatewayConfigError

    with pytest.raises(GatewayConfigError):
        GatewayConfig(**over)


def test_serve_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr("remem_agent.gateway.serve", seen.append)
    argv = ["serve", "--answer-ttl-days", "2", "--retention-days", "0", "--trace-max-mb", "1", "--trace-keep-days", "0"]
    assert main(argv) == 0
    (config,) = seen
    assert config.answer_ttl_s == 2 * DAY and config.retention_s is None
    assert config.trace_max_bytes == 2**20 and config.trace_keep_days is None and config.trace_keep_bytes == 2**30


def test_two_sweeps_at_once_count_every_pruned_search_once(
    store_location: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(pruning, "BATCH", 7)  # several batches, so that the two sweeps interleave
    t0 = time.time() + 60
    monkeypatch.setattr("remem_agent.memory.wall_now", lambda: t0)
    loc = store_location("s")
    with ReMem(loc, embedder="hash") as a, ReMem(loc, embedder="hash") as b:
        a.add_many(NOTES)
        for n in range(40):
            a.search(f"deploy region {n}", k=2, task="ops")
        before = _retrieved(a)
        with ThreadPoolExecutor(2) as pool:
            reports = list(pool.map(lambda m: m.prune(answer_ttl_s=DAY, retention_s=DAY, now=t0 + 2 * DAY), (a, b)))
        assert sum(r.pruned_searches for r in reports) == 40
        assert a.stats().searches == 0 and _retrieved(a) == before
        with a.store.read() as tx:
            assert sum(n for (_, t), n in pruning.retrieval_base(tx).items() if t == ALL_TASKS) == 80
        assert a.verify().ok, a.verify().problems
