"""The ReMem API on real ledgers: quickstart, supersession, as_of, feedback, reopen.

Every test runs on both backends (``[sqlite]`` a folder, ``[postgres]`` a fresh database on the
session's pgserver; see ``store_location`` in conftest.py), so the two cannot drift apart.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from remem_agent import (
    FeedbackConflictError,
    MemoryInput,
    ReMem,
    State,
    UnknownMemoryError,
    UnknownSearchError,
    UserInputError,
)

StoreLocation = Callable[[str], "str | Path"]


@pytest.fixture()
def mem(store_location: StoreLocation) -> Iterator[ReMem]:
    m = ReMem(store_location("store"))
    yield m
    m.close()


def test_reference_quickstart(store_location: StoreLocation, backend: str) -> None:
    mem = ReMem(store_location("my_memory"))
    # mem.path: the folder for SQLite; for PostgreSQL the URL with its password masked (pgserver's
    # URL has an empty one, ``postgres:@``, which is masked too: ``postgres:***@``).
    if backend == "sqlite":
        assert mem.path == Path(store_location("my_memory"))
    else:
        from remem_agent.store.postgres import redact

        assert mem.path == mem.store.location == redact(str(store_location("my_memory")))
        assert isinstance(mem.path, str) and mem.path.startswith("postgresql://postgres:***@/")
    east = mem.add("Our server is in east-1.", entity="server", attribute="region", timestamp=1000)
    west = mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=2000)

    hits = mem.search("Where is our server?", now=3000)
    assert hits.items[0].text == "Our server moved to west-2."
    assert east not in hits.ids  # the replaced fact is not served beside its replacement

    receipt = mem.feedback(hits.search_id, success=True, used_ids=[hits.items[0].id])
    assert receipt.credit[west] > 0

    info = mem.inspect(east)
    assert info.state is State.INVALIDATED
    assert "superseded" in (info.reason or "") and "moved to" in (info.reason or "")
    assert info.memory.superseded_by == west and info.memory.valid_to == 2000
    assert [e.kind for e in info.history] == ["add", "invalidate"]
    assert mem.inspect(west).supersedes == (east,)

    past = mem.search("Where is our server?", as_of=1500)
    assert past.ids == [east]
    assert mem.search("Where is our server?", as_of=2500).ids == [west]
    mem.close()

    # Reopening the folder (or the database URL) restores everything.
    again = ReMem(store_location("my_memory"))
    assert again.inspect(east).state is State.INVALIDATED
    assert again.inspect(west).overall.credit_sum == receipt.credit[west]
    assert again.search("Where is our server?", now=3000).items[0].id == west
    assert again.verify().ok
    again.close()


def test_wall_clock_quickstart(mem: ReMem) -> None:
    """Without explicit timestamps (the README's form) the later add wins."""
    mem.add("Our server is in east-1.", entity="server", attribute="region")
    between = time.time()
    time.sleep(0.01)
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    assert mem.search("Where is our server?").items[0].text == "Our server moved to west-2."
    assert mem.search("Where is our server?", as_of=between).items[0].text == "Our server is in east-1."


def test_keys_compare_case_insensitively(mem: ReMem) -> None:
    a = mem.add("DB is Postgres 14.", entity="Database", attribute="Version", timestamp=1)
    mem.add("DB is Postgres 16.", entity="database ", attribute="version", timestamp=2)
    assert mem.get(a).state is State.INVALIDATED


def test_preferences_and_notes_never_supersede(mem: ReMem) -> None:
    a = mem.add("Alice likes tea.", entity="alice", attribute="likes", role="preference", timestamp=1)
    b = mem.add("Alice likes coffee.", entity="alice", attribute="likes", role="preference", timestamp=2)
    c = mem.add("Note about alice.", entity="alice", attribute="likes", role="note", timestamp=3)
    assert {mem.get(i).state for i in (a, b, c)} == {State.ACTIVE}


def test_additive_wording_warns_but_still_supersedes(mem: ReMem) -> None:
    a = mem.add("The app uses Redis.", entity="app", attribute="cache", timestamp=1)
    with pytest.warns(UserWarning, match="additional value"):
        mem.add("The app also uses Memcached.", entity="app", attribute="cache", timestamp=2)
    assert mem.get(a).state is State.INVALIDATED


def test_update_wording_is_not_a_warning(mem: ReMem) -> None:
    mem.add("The app uses Redis.", entity="app", attribute="cache", timestamp=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mem.add("The app no longer uses Redis; it migrated to Valkey.", entity="app", attribute="cache", timestamp=2)


def test_restating_a_fact_reconfirms_instead_of_duplicating(mem: ReMem) -> None:
    a = mem.add("Our server is in east-1.", entity="server", attribute="region", timestamp=1)
    again = mem.add("our server is in EAST-1", entity="server", attribute="region", timestamp=2)
    assert again == a
    info = mem.inspect(a)
    assert info.state is State.ACTIVE and [e.kind for e in info.history] == ["add", "reconfirm"]
    assert mem.stats().memories == 1


def test_backdated_fact_is_superseded_on_arrival(mem: ReMem) -> None:
    new = mem.add("Server moved to west-2.", entity="server", attribute="region", timestamp=2000)
    old = mem.add("Server is in east-1.", entity="server", attribute="region", timestamp=1000)
    assert mem.get(new).state is State.ACTIVE
    m_old = mem.get(old)
    assert m_old.state is State.INVALIDATED and m_old.superseded_by == new and m_old.valid_to == 2000
    assert mem.search("server region", as_of=1500).ids == [old]
    assert mem.verify().ok


def test_equally_similar_memories_are_served_in_insertion_order(mem: ReMem) -> None:
    """Ties (frequent with the hashing embedder) resolve the same on both backends: oldest first.

    Regression for PostgreSQL: its HNSW index returned the equally similar notes in graph order, so
    it could serve c or d where SQLite serves b.
    """
    texts = [f"Service {e} runs on host {h}." for e, h in (("a", "one"), ("b", "three"), ("c", "five"), ("d", "seven"))]
    vecs = mem.embedder.embed([*texts, "service host"])
    sims = [float(v @ vecs[-1]) for v in vecs[:-1]]
    assert sims[0] > sims[1] and max(sims[1:]) - min(sims[1:]) < 1e-6  # the premise: b, c, d tie
    ids = [mem.add(t, role="note", timestamp=1) for t in texts]
    assert mem.search("service host", k=2, now=2).ids == ids[:2]


def test_now_hides_facts_from_the_future(mem: ReMem) -> None:
    mem.add("Launch is planned.", timestamp=5000)
    assert mem.search("launch", now=4000).items == ()
    assert len(mem.search("launch", now=6000).items) == 1


def test_add_many_is_one_transaction(mem: ReMem) -> None:
    ids = mem.add_many(
        [
            "plain string note",
            {"text": "Bob owns billing.", "entity": "billing", "attribute": "owner"},
            MemoryInput("Carol owns billing.", entity="billing", attribute="owner", timestamp=time.time() + 1),
        ]
    )
    assert len(ids) == 3
    assert mem.get(ids[1]).state is State.INVALIDATED
    with pytest.raises(UserInputError):
        mem.add_many(["fine", {"text": ""}])
    assert mem.stats().memories == 3  # nothing of the failed batch was written


def test_feedback_credit_and_idempotency(mem: ReMem) -> None:
    a = mem.add("Deploys need approval from Dana.", entity="deploy", attribute="approver", timestamp=1)
    b = mem.add("The office plant needs water.", timestamp=1)
    hits = mem.search("who approves deploys", k=5, task="deploy", now=10)
    assert set(hits.ids) == {a, b}
    r1 = mem.feedback(hits.search_id, success=True, used_ids=[a], cited_ids=[a])
    assert r1.credit == {a: 1.0, b: 0.0}
    r2 = mem.feedback(hits.search_id, success=True, used_ids=[a], cited_ids=[a])
    assert r2.repeated and r2.credit == r1.credit
    with pytest.raises(FeedbackConflictError):
        mem.feedback(hits.search_id, success=False, used_ids=[a])
    info = mem.inspect(a)
    assert info.overall.shown == 1 and info.stats["deploy"].credited == 1
    assert [c.search_id for c in info.credits] == [hits.search_id]
    assert mem.inspect(b).overall.wasted == 1


def test_failure_blames_used_memories(mem: ReMem) -> None:
    a = mem.add("The API key rotates monthly.", timestamp=1)
    hits = mem.search("api key rotation", now=2)
    r = mem.feedback(hits.search_id, success=False, used_ids=[a])
    assert r.blame[a] == 1.0 and r.credit[a] == 0.0
    assert mem.inspect(a).overall.blamed == 1


def test_token_budget_is_respected(mem: ReMem) -> None:
    for i in range(20):
        mem.add(f"Fact number {i} about the deployment pipeline " + "detail " * (i % 7), timestamp=1)
    hits = mem.search("deployment pipeline", k=10, token_budget=30, now=2)
    assert 0 < hits.tokens <= 30
    assert mem.search("deployment pipeline", k=10, token_budget=0, now=2).items == ()


def test_explain_returns_features(mem: ReMem) -> None:
    mem.add("Our server is in east-1.", timestamp=1)
    hit = mem.search("server", explain=True, now=2).items[0]
    assert hit.explain is not None
    assert hit.explain["feature.similarity"] == pytest.approx(hit.similarity)
    assert {"component.prior", "component.contribution", "component.posterior"} <= set(hit.explain)


def test_list_and_stats(mem: ReMem) -> None:
    a = mem.add("x is 1", entity="x", attribute="v", timestamp=1)
    mem.add("x is 2", entity="x", attribute="v", timestamp=2)
    mem.add("a note", role="note", timestamp=3)
    assert [m.id for m in mem.list(State.INVALIDATED)] == [a]
    assert [m.id for m in mem.list("invalidated")] == [a]
    assert len(mem.list(role="note")) == 1
    s = mem.stats()
    assert s.memories == 3 and s.by_state["INVALIDATED"] == 1 and s.by_role["state"] == 2
    with pytest.raises(UserInputError):
        mem.list("GONE")


def test_add_conversation_without_extractor_stores_notes(mem: ReMem) -> None:
    """One note per turn, speaker-attributed (tests/test_transcripts.py has the shapes)."""
    ids = mem.add_conversation(
        [{"role": "user", "content": "I use vim. My laptop is a ThinkPad!"}, {"role": "assistant", "content": "Ok."}]
    )
    assert len(ids) == 2
    assert {mem.get(i).role for i in ids} == {"note"}
    assert [mem.get(i).speaker for i in ids] == ["user", "assistant"]


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.add(""),
        lambda m: m.add("   "),
        lambda m: m.add(42),
        lambda m: m.add("x", role="fact"),
        lambda m: m.add("x", entity=""),
        lambda m: m.add("x", confidence=1.5),
        lambda m: m.add("x", confidence=float("nan")),
        lambda m: m.add("x", timestamp="yesterday"),
        lambda m: m.add("x", timestamp=float("inf")),
        lambda m: m.add("x", task="*"),
        lambda m: m.search(""),
        lambda m: m.search("q", k=0),
        lambda m: m.search("q", k=True),
        lambda m: m.search("q", token_budget=-1),
        lambda m: m.feedback("s_missing", success=True),
        lambda m: m.feedback(123, success=True),
        lambda m: m.inspect("m_missing"),
        lambda m: m.add_many([{"txt": "typo"}]),
    ],
)
def test_bad_input_is_a_typed_error_and_writes_nothing(mem: ReMem, call: object) -> None:
    keep = mem.add("An existing fact.", timestamp=1)
    before = mem.stats()
    with pytest.raises(UserInputError):
        call(mem)  # type: ignore[operator]
    after = mem.stats()
    assert (after.memories, after.events, after.feedbacks) == (before.memories, before.events, before.feedbacks)
    assert mem.get(keep).text == "An existing fact."


def test_unknown_ids_are_key_errors_too(mem: ReMem) -> None:
    with pytest.raises(KeyError):
        mem.inspect("m_nope")
    with pytest.raises(UnknownMemoryError):
        mem.get("m_nope")
    with pytest.raises(UnknownSearchError):
        mem.feedback("s_nope", success=True)


def test_a_transition_that_need_not_wait_is_a_transition_when_nothing_holds_the_row(mem: ReMem) -> None:
    """``transition_unless_busy`` skips only a row another writer holds (PostgreSQL; see
    test_postgres_concurrency): otherwise it moves the state and logs the event as ``transition`` does."""
    from remem_agent.store.lifecycle import LifecycleEvent

    fact = mem.add("The billing service runs in eu-west-1.", entity="billing", attribute="region", timestamp=1)
    with mem.store.write() as tx:
        ev = tx.transition_unless_busy(fact, LifecycleEvent.DEMOTE, reason="test", at=2.0)
    assert ev is not None and (ev.kind, ev.from_state, ev.to_state) == ("demote", State.ACTIVE, State.LOW_VALUE)
    assert mem.get(fact).state is State.LOW_VALUE
    with pytest.raises(UnknownMemoryError), mem.store.write() as tx:
        tx.transition_unless_busy("m_nope", LifecycleEvent.DEMOTE, reason="test", at=3.0)
    assert mem.verify().ok


def test_feedback_ids_must_have_been_served(mem: ReMem) -> None:
    a = mem.add("served fact", timestamp=1)
    other = mem.add("zebra xylophone quartz", timestamp=1)
    hits = mem.search("served fact", k=1, now=2)
    assert hits.ids == [a]
    with pytest.raises(UserInputError, match="not served"):
        mem.feedback(hits.search_id, success=True, used_ids=[other])
    # the search is still open: valid feedback works afterwards
    assert mem.feedback(hits.search_id, success=True, used_ids=[a]).credit[a] > 0
    with pytest.raises(UserInputError):
        mem.feedback(hits.search_id, success="yes")  # type: ignore[arg-type]


def test_two_store_objects_see_each_others_writes(store_location: StoreLocation) -> None:
    """Row caches are invalidated when another connection commits (SQLite: PRAGMA data_version;
    PostgreSQL keeps no row cache and takes candidates from the shared HNSW index)."""
    a, b = ReMem(store_location("s")), ReMem(store_location("s"))
    east = a.add("Our server is in east-1.", entity="server", attribute="region", timestamp=1)
    assert a.search("Where is our server?", now=5).ids == [east]  # rows now cached in a
    west = b.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=2)
    assert a.search("Where is our server?", now=5).ids == [west]  # a sees b's supersession
    res = a.search("Where is our server?", now=5)
    b.feedback(res.search_id, success=True, used_ids=[west])  # feedback through the other object
    assert a.inspect(west).overall.credited == 1
    a.close()
    b.close()
