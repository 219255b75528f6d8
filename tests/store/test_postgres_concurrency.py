"""Four processes learning into one PostgreSQL store at once: no update is lost or counted twice.

Each worker process opens its own ``ReMem`` on the same database and runs search + feedback cycles
(the benchmark's worker, ``evals.perf.postgres.cycle_worker``). The store is small, so the workers
keep serving, crediting and blaming the same memories and hit the same statistics rows; SERIALIZABLE
feedback transactions then conflict with each other and with the searches' counter increments, and
are retried. The parent sums what the workers' receipts say they sent and compares it, per memory
and per task class, with what the ledger holds (through the public ``inspect``). No timing is asserted.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from evals.perf.postgres import run_workers
from remem_agent import ReMem, State
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.types import ALL_TASKS, CreditRecord

WORKERS = 4
CYCLES = 60
TASKS = ("deploy", "billing")
FIELDS = ("retrieved", "shown", "credited", "wasted", "blamed", "credit_sum", "blame_sum")
FACTS = [
    f"The {svc} service {what}."
    for svc in ("billing", "search", "auth", "deploy")
    for what in (
        "runs on port 8080",
        "is owned by the payments team",
        "is deployed in eu-west-1",
        "uses the shared postgres database",
        "has a monthly budget of 400 dollars",
    )
]
QUERIES = [
    "Which port does the billing service use?",
    "who owns the auth service",
    "where is the deploy service deployed",
    "what database does search use",
    "service budget",
]


def _sent(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """memory -> task row -> statistic, from the searches and receipts the workers reported."""
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(lambda: dict.fromkeys(FIELDS, 0)))
    for rec in records:
        for cyc in rec["cycles"]:
            assert set(cyc["credit"]) == set(cyc["blame"]) == set(cyc["served"])
            for row in [ALL_TASKS] + ([cyc["task"]] if cyc["task"] else []):
                for mid in cyc["served"]:
                    credit, blame = cyc["credit"][mid], cyc["blame"][mid]
                    st = out[mid][row]
                    st["retrieved"] += 1
                    st["shown"] += 1
                    st["credited"] += int(credit > 0)
                    st["blamed"] += int(blame > 0)
                    st["wasted"] += int(credit == 0 and blame == 0)
                    st["credit_sum"] += credit
                    st["blame_sum"] += blame
    return out


@pytest.mark.slow
def test_four_processes_feedback_on_shared_rows_loses_no_update(pg_url: str, tmp_path: Path) -> None:
    with ReMem(pg_url) as mem:  # closed before the workers start
        ids = mem.add_many(FACTS)
    assert len(set(ids)) == len(FACTS) == 20
    queries = [(q, task) for q in QUERIES for task in (None, *TASKS)]

    records = run_workers(pg_url, queries, workers=WORKERS, cycles=CYCLES, k=5, seed=3, folder=tmp_path)

    errors = [e for r in records for e in r["errors"]]
    assert not errors, f"{len(errors)} worker exception(s):\n" + "\n".join(errors)
    cycles = [c for r in records for c in r["cycles"]]
    assert len(cycles) == WORKERS * CYCLES
    assert not any(c["repeated"] for c in cycles)
    assert len({c["search_id"] for c in cycles}) == len(cycles)
    # The workers really contended: searches served the same 20 memories, and memories were credited or
    # blamed by all four workers. (A search may serve nothing: once every candidate's learned utility is
    # below p_floor and the similarity guard no longer covers it, nothing is worth the context.)
    assert sum(1 for c in cycles if c["served"]) >= len(cycles) // 2
    workers_per_memory = Counter(mid for r in records for mid in {m for c in r["cycles"] for m in c["served"]})
    assert max(workers_per_memory.values()) == WORKERS
    assert {c["task"] for c in cycles} == {None, *TASKS}

    sent = _sent(records)
    with ReMem(pg_url) as mem:
        report = mem.verify()
        assert report.ok, "verify() failed:\n" + "\n".join(report.problems)
        with mem.store.read() as tx:  # lexical entries equal the texts, compressed by retention or not
            assert tx.lexical_index_problems() == []
        st = mem.stats()
        assert st.searches == st.feedbacks == len(cycles)
        differing = {}
        n_credit_rows = 0
        for mid in ids:
            info = mem.inspect(mid)
            n_credit_rows += len(info.credits)
            got = {row: {f: getattr(ts, f) for f in FIELDS} for row, ts in info.stats.items()}
            want = {row: dict(v) for row, v in sent.get(mid, {}).items()}
            for row in set(got) | set(want):
                g, w = got.get(row, {}), want.get(row, {})
                bad = {
                    f: (g.get(f), w.get(f))
                    for f in FIELDS
                    if g.get(f) is None or w.get(f) is None or abs(g[f] - w[f]) > 1e-9
                }
                if bad:
                    differing[(mid, row)] = bad
        assert not differing, f"ledger statistics differ from what the workers sent, (ledger, sent): {differing}"
        assert n_credit_rows == sum(len(c["served"]) for c in cycles)
        # Per task class, the rows add up to the overall row.
        for mid in ids:
            stats = mem.inspect(mid).stats
            if ALL_TASKS in stats:
                classes = [stats[t] for t in TASKS if t in stats]
                untasked = sum(1 for c in cycles if c["task"] is None and mid in c["served"])
                assert stats[ALL_TASKS].shown == sum(s.shown for s in classes) + untasked


def test_a_transition_does_not_wait_for_rows_being_inserted_for_its_memory(pg_url: str) -> None:
    """Retiring a memory must not queue behind an open transaction that inserts its stats and credits.

    Inserting a stats or credits row takes a KEY SHARE lock on its memory (the foreign-key check). A
    transition locked the memory FOR UPDATE, which waits for KEY SHARE; two feedback transactions, each
    holding stats rows the other needed, then deadlocked (CI, four workers). A transition changes no key
    column, so its lock must not conflict with those inserts: here it finishes while they are still open.
    """
    with ReMem(pg_url) as mem:
        mid = mem.add("The billing service runs on port 8080.")
        sid = mem.search("billing port", k=3).search_id
        credit = CreditRecord(sid, mid, "deploy", 1.0, True, True, True, 1.0, 0.0)

        class Abandon(Exception):
            pass

        with pytest.raises(Abandon), mem.store.write() as inserting:
            inserting.insert_credits([credit])  # still open: its KEY SHARE lock on the memory is held
            with mem.store.write() as retiring:
                retiring.run("SET LOCAL lock_timeout = '5s'")  # FOR UPDATE fails here after 5 s
                event = retiring.transition(mid, LifecycleEvent.DEMOTE, reason="test", at=2.0)
            assert event.to_state is State.LOW_VALUE
            raise Abandon  # roll the insert back
        assert mem.inspect(mid).memory.state is State.LOW_VALUE
        assert mem.inspect(mid).credits == ()
        assert mem.verify().ok


def _run_script_workers(script: str, url: str, *, timeout_s: float) -> list[str]:
    """Run ``script`` in WORKERS Python processes at once (argv: url, worker number); their outputs, all exit 0."""
    import subprocess
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, url, str(w)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for w in range(WORKERS)
    ]
    outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return outs


def _assert_newest_fact_is_the_only_current_one(facts: list[Any]) -> None:
    for entity in {m.entity for m in facts}:
        key = [m for m in facts if m.entity == entity]
        current = [m for m in key if m.state is not State.INVALIDATED]
        newest = max(key, key=lambda m: m.valid_from)
        assert [m.id for m in current] == [newest.id]  # exactly one current fact: the newest
        for m in key:
            if m.id != newest.id:
                assert m.superseded_by is not None and m.valid_to is not None


_ADDER = """
import sys
from remem_agent import ReMem
url, worker = sys.argv[1], int(sys.argv[2])
with ReMem(url) as mem:
    for i in range(30):
        key = f"svc{i % 5}"
        t = 1000 + i * 4 + worker  # every (worker, i) has its own time: the newest fact per key is known
        mem.add(f"The {key} service runs in region r{worker}-{i}.", entity=key, attribute="region", timestamp=t)
print("OK")
"""


@pytest.mark.slow
def test_four_processes_superseding_the_same_keys_leave_one_current_fact(pg_url: str) -> None:
    """Concurrent adds of the same entity+attribute: supersession must end as if the adds took turns."""
    ReMem(pg_url).close()  # create the store first: this test is about supersession, not first open
    _run_script_workers(_ADDER, pg_url, timeout_s=120)
    with ReMem(pg_url) as mem:
        report = mem.verify()
        assert report.ok, report.problems
        facts = mem.list(role="state")
        assert len(facts) == WORKERS * 30
        with mem.store.read() as tx:  # the lexical column followed every concurrent insert and supersession
            assert tx.lexical_index_problems() == []
            found = {mid for mid, _ in tx.lexical_candidates("Which region?", limit=1000, scopes=None)}
            assert found == {m.id for m in facts}
        assert {m.entity for m in facts} == {f"svc{k}" for k in range(5)}
        _assert_newest_fact_is_the_only_current_one(facts)


_MIXED = """
import json, random, sys
from remem_agent import ReMem
url, worker = sys.argv[1], int(sys.argv[2])
rng = random.Random(worker)
done = {"adds": 0, "searches": 0, "feedbacks": 0, "credited_rows": 0}
with ReMem(url) as mem:
    for i in range(90):
        if i % 3 == 0:  # supersedes the key's current fact: a transition while others credit that memory
            key = f"svc{rng.randrange(5)}"
            t = 1000 + i * 8 + worker
            mem.add(f"The {key} service runs in region r{worker}-{i}.", entity=key, attribute="region", timestamp=t)
            done["adds"] += 1
            continue
        res = mem.search(rng.choice(["which region does svc1 run in", "svc2 region", "where is svc3"]), k=5,
                         task=rng.choice([None, "deploy"]))
        done["searches"] += 1
        if res.ids:
            used = list(res.ids[:2])
            mem.feedback(res.search_id, success=rng.random() < 0.6, used_ids=used, cited_ids=used[:1])
            done["feedbacks"] += 1
            done["credited_rows"] += len(res.ids)
print(json.dumps(done))
"""


@pytest.mark.slow
def test_four_processes_adding_searching_and_learning_at_once(pg_url: str) -> None:
    """Supersession, searches and feedback interleaved on the same keys: no worker gives up, nothing is lost.

    Superseding retires the key's current fact (a transition on its row) while other workers serve, credit
    and blame that same memory (stats and credits rows that reference it): the pair that deadlocked in CI.
    Deadlocks are retried, so this test passes with them too (only slower); the deterministic check of that
    lock is ``test_a_transition_does_not_wait_for_rows_being_inserted_for_its_memory``.
    """
    import json

    with ReMem(pg_url) as mem:
        for k in range(5):  # older than every worker's fact, so each key's newest fact is a worker's
            mem.add(
                f"The svc{k} service runs in region start-{k}.", entity=f"svc{k}", attribute="region", timestamp=500
            )
    outs = _run_script_workers(_MIXED, pg_url, timeout_s=300)
    done = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    with ReMem(pg_url) as mem:
        report = mem.verify()
        assert report.ok, report.problems
        with mem.store.read() as tx:
            assert tx.lexical_index_problems() == []
        st = mem.stats()
        assert st.searches == sum(d["searches"] for d in done)
        assert st.feedbacks == sum(d["feedbacks"] for d in done) > 0
        facts = mem.list(role="state")
        assert len(facts) == 5 + sum(d["adds"] for d in done)
        assert sum(len(mem.inspect(m.id).credits) for m in mem.list()) == sum(d["credited_rows"] for d in done)
        _assert_newest_fact_is_the_only_current_one(facts)


_BATCH_ADDER = """
import random, sys
from remem_agent import ReMem
url, worker = sys.argv[1], int(sys.argv[2])
rng = random.Random(worker)
with ReMem(url) as mem:
    for b in range(30):
        keys = list(range(10))
        rng.shuffle(keys)  # every worker supersedes the same keys, each batch in its own order
        mem.add_many([
            {"text": f"The svc{k} service runs in region r{worker}-{b}.", "entity": f"svc{k}", "attribute": "region",
             "timestamp": 1000 + b * 8 + worker}
            for k in keys
        ])
print("OK")
"""


@pytest.mark.slow
def test_four_processes_superseding_the_same_keys_in_different_orders(pg_url: str) -> None:
    """Batches that supersede the same keys in different orders must take turns, not deadlock.

    Each superseding add locks the old fact's row and bumps its attribute's counter row. Before writers took
    their attributes' locks first, one batch held a fact another needed while waiting for the counter row
    the other held: deadlocks every few batches, and workers gave up after the 60 s retry window (3 of 4
    in an ad hoc run of this workload). Without the locks this test failed in one of two runs (after 66 s;
    the other passed in 18 s of retried deadlocks); the deterministic check of the locks is
    ``test_writers_of_an_attribute_take_its_lock_before_any_memory_row``.
    """
    ReMem(pg_url).close()
    _run_script_workers(_BATCH_ADDER, pg_url, timeout_s=300)
    with ReMem(pg_url) as mem:
        report = mem.verify()
        assert report.ok, report.problems
        facts = mem.list(role="state")
        assert len(facts) == WORKERS * 30 * 10
        _assert_newest_fact_is_the_only_current_one(facts)


def _with_lock_timeout(url: str, ms: int) -> str:
    """The URL with a session lock_timeout (libpq's options parameter): a lock wait fails instead of hanging."""
    return url + ("&" if "?" in url else "?") + f"options=-c%20lock_timeout%3D{ms}"


def test_writers_of_an_attribute_take_its_lock_before_any_memory_row(pg_url: str) -> None:
    """add_many and feedback wait for an attribute's lock when they may touch its facts, and only then."""
    from remem_agent.errors import StoreBusyError

    with ReMem(pg_url) as mem:
        old = mem.add("The billing service runs in eu-west-1.", entity="billing", attribute="region", timestamp=100)
        res = mem.search("where does billing run", k=3)
        assert old in res.ids
    with ReMem(_with_lock_timeout(pg_url, 200)) as mem, mem.store.write() as holder:
        holder.lock_attributes(["region"])  # another writer of 'region', still open
        with pytest.raises(StoreBusyError, match="lock_timeout"):
            mem.add("The billing service runs in us-east-1.", entity="billing", attribute="region", timestamp=200)
        with pytest.raises(StoreBusyError, match="lock_timeout"):
            mem.feedback(res.search_id, success=False, used_ids=[old])
        mem.add("The billing service listens on port 8080.", entity="billing", attribute="port", timestamp=200)
        mem.add("Billing was discussed on Monday.", role="note")
    with ReMem(pg_url) as mem:  # the refused writes left nothing; the others landed
        assert mem.get(old).state is State.ACTIVE
        assert [m.attribute for m in mem.list(role="state")] == ["region", "port"]
        assert mem.stats().feedbacks == 0
        assert mem.verify().ok


def test_a_feedback_waiting_for_an_attribute_holds_nothing_searches_need(pg_url: str) -> None:
    """A feedback that waits for an attribute's lock has not written yet, so searches serving the same
    memories go on (their counter upserts would otherwise queue behind its statistics rows)."""
    import threading
    import time

    import psycopg

    with ReMem(pg_url) as mem:
        fact = mem.add("The billing service runs in eu-west-1.", entity="billing", attribute="region", timestamp=100)
        first = mem.search("where does billing run", k=3)
    with ReMem(pg_url) as waiting, ReMem(_with_lock_timeout(pg_url, 2000)) as searching:
        outcome: list[object] = []
        with waiting.store.write() as holder:
            holder.lock_attributes(["region"])
            worker = threading.Thread(
                target=lambda: outcome.append(waiting.feedback(first.search_id, success=True, used_ids=[fact]))
            )
            worker.start()
            give_up = time.monotonic() + 60  # a guard against hanging, not a timing assertion
            with psycopg.connect(pg_url, autocommit=True) as probe:  # until the feedback waits for the lock
                while not probe.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                    "WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()"
                ).fetchone()[0]:
                    assert time.monotonic() < give_up and worker.is_alive(), "the feedback never waited for the lock"
                    time.sleep(0.01)
            again = searching.search("where does billing run", k=3)  # would hit lock_timeout behind its rows
            assert fact in again.ids and worker.is_alive()
        worker.join(timeout=60)
        assert not worker.is_alive() and len(outcome) == 1
    with ReMem(pg_url) as mem:
        stats = mem.inspect(fact).stats
        assert stats[ALL_TASKS].retrieved == 2 and stats[ALL_TASKS].shown == 1
        assert mem.verify().ok


def test_retention_steps_over_a_memory_another_writer_is_changing(pg_url: str) -> None:
    """Demoting, compressing, archiving or reviving is a policy a later feedback can apply as well; waiting for
    a memory row another writer holds (an add superseding that fact) could close a deadlock cycle, since the
    feedback takes no attribute lock for facts it did not use. So retention skips such a memory this time."""
    from dataclasses import replace

    from remem_agent import RememConfig
    from remem_agent.learning.retention import RetentionPolicy

    config = replace(RememConfig(), retention=RetentionPolicy(min_exposures=1, low_rate=0.9))
    with ReMem(pg_url, config=config) as mem:
        fact = mem.add("The billing service runs in eu-west-1.", entity="billing", attribute="region", timestamp=100)
        note = mem.add("Billing was discussed on Monday.", role="note", timestamp=100)
        first = mem.search("billing service region", k=3)
        second = mem.search("billing service region monday", k=3)
        assert {fact, note} <= set(first.ids) and {fact, note} <= set(second.ids)
    with ReMem(_with_lock_timeout(pg_url, 200), config=config) as mem:
        with mem.store.write() as holder:  # another writer, e.g. an add superseding the fact, still open
            holder.run("SELECT state FROM memories WHERE id = ? FOR NO KEY UPDATE", (fact,))
            receipt = mem.feedback(first.search_id, success=False)  # would wait, then hit lock_timeout
        assert [(e.memory_id, e.kind) for e in receipt.transitions] == [(note, "demote")]
        assert set(receipt.blame) == {fact, note}  # the verdict and its blame were recorded
        assert mem.get(fact).state is State.ACTIVE
        later = mem.feedback(second.search_id, success=False)  # nobody holds the row now
        assert [(e.memory_id, e.kind) for e in later.transitions] == [(fact, "demote")]
        assert mem.get(fact).state is State.LOW_VALUE
        assert mem.verify().ok
