"""Several processes and threads writing one store: no lost updates, no "database is locked".

Two forked processes with four threads each run ``N_ITER`` rounds against ONE store folder. Every
worker records what it sent and what came back; the parent then checks the ledger against the sum of
those records:

* no worker raised (a "database is locked" / ``StoreBusyError`` would show up here);
* ``verify()`` is ok and every added memory is present, with exactly one current fact per key;
* the number of searches, feedbacks and credit rows, and every memory's per-class statistics
  (``retrieved``, ``shown``, ``credited``, ``wasted``, ``blamed``, ``credit_sum``, ``blame_sum``),
  equal exactly what the ``CreditPolicy`` assigns to the recorded feedback.

In the "own" workload each thread adds its own facts (some on shared entity+attribute keys, so
supersession races across processes) and the store is created by both processes at once. In the
"shared" workload every search serves the same five seeded memories, so all eight threads update
the same statistics rows concurrently; on top, both processes send identical feedback for the same
pre-made searches, which must count once.

Feedback payloads are deterministic functions of (process, thread, round); only timing varies.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from remem_agent import FeedbackConflictError, ReMem, RememConfig, State
from remem_agent.learning.credit import CreditPolicy
from remem_agent.learning.retention import RetentionPolicy
from remem_agent.types import ALL_TASKS

N_PROCS = 2
N_THREADS = 4
N_ITER = 60
KEYS = [("service", "port"), ("service", "owner"), ("queue", "region")]
QUERIES = ("Which port does the service use?", "who owns the queue", "deploy budget", "server region")
SEEDS = [
    "The billing service runs on port 8080.",
    "The billing service is owned by the payments team.",
    "The billing service is deployed in eu-west-1.",
    "The billing service uses the shared postgres database.",
    "The billing service has a monthly budget of 400 dollars.",
]
SHARED_QUERY = "Tell me about the billing service"
N_DUP_SEARCHES = 16  # pre-made searches that both processes answer identically


def _payload(p: int, t: int, i: int, served: list[str]) -> dict[str, Any]:
    return {
        "success": (p + t + i) % 3 != 0,
        "used": served[: i % 3],
        "cited": served[1:2] if i % 4 == 1 else [],
    }


def _task(p: int, i: int) -> str | None:
    return None if i % 3 == 0 else f"class{(p + i) % 2}"


def _config(mode: str) -> RememConfig | None:
    """Shared workload: retention off and no utility floor, so every search serves all seeds."""
    return RememConfig(retention=RetentionPolicy(enabled=False), p_floor=0.0) if mode == "shared" else None


# -- the workers (forked: nothing is pickled, the parent holds no store open) -----------------------
def _worker(
    folder: str,
    p: int,
    mode: str,
    per_thread_store: bool,
    out_path: str,
    open_barrier: Any,
    go_barrier: Any,
    dup: list[tuple[str, list[str]]],
    dup_barriers: list[Any],
) -> None:
    rec: dict[str, list[Any]] = {"adds": [], "feedbacks": [], "dups": [], "errors": []}
    lock = threading.Lock()

    def note(kind: str, item: Any) -> None:
        with lock:
            rec[kind].append(item)

    def run(t: int, shared: ReMem | None) -> None:
        mem = None
        try:
            mem = shared if shared is not None else ReMem(folder, config=_config(mode))
            go_barrier.wait(60)
            for i in range(N_ITER):
                task = _task(p, i)
                if mode == "own":
                    text = f"Fact {p}-{t}-{i}: the service {QUERIES[i % 4].lower().rstrip('?')} number {i}."
                    if i % 3 == 0:
                        ent, attr = KEYS[(t + i) % len(KEYS)]
                        mid = mem.add(text, entity=ent, attribute=attr)
                        note("adds", {"id": mid, "text": text, "key": [ent, attr]})
                    else:
                        mid = mem.add(text, role="note", task=task)
                        note("adds", {"id": mid, "text": text, "key": None})
                    res = mem.search(QUERIES[(t + i) % len(QUERIES)], k=4, task=task)
                else:
                    res = mem.search(SHARED_QUERY, k=len(SEEDS), task=task)
                fb = _payload(p, t, i, res.ids)
                receipt = mem.feedback(res.search_id, success=fb["success"], used_ids=fb["used"], cited_ids=fb["cited"])
                note(
                    "feedbacks",
                    {"search_id": res.search_id, "task": task, "served": res.ids, "repeated": receipt.repeated, **fb},
                )
                # Both processes answer the same pre-made searches with the same payload.
                for j in range(t, len(dup), N_THREADS):
                    if j % N_ITER == i:
                        sid, served = dup[j]
                        fb = _payload(0, 0, j, served)
                        dup_barriers[t].wait(60)  # line up with the same thread of the other process
                        receipt = mem.feedback(sid, success=fb["success"], used_ids=fb["used"], cited_ids=fb["cited"])
                        note(
                            "dups",
                            {
                                "search_id": sid,
                                "repeated": receipt.repeated,
                                "credit": dict(receipt.credit),
                                "blame": dict(receipt.blame),
                            },
                        )
        except BaseException:  # noqa: BLE001 - every worker exception is reported by the parent
            note("errors", f"process {p} thread {t}:\n{traceback.format_exc()}")
            for b in (go_barrier, dup_barriers[t]):
                b.abort()  # do not leave the other threads waiting
        finally:
            if shared is None and mem is not None:
                mem.close()

    shared: ReMem | None = None
    try:
        open_barrier.wait(60)  # both processes open (and, in "own", create and migrate) at once
        shared = None if per_thread_store else ReMem(folder, config=_config(mode))
        threads = [threading.Thread(target=run, args=(t, shared)) for t in range(N_THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    except BaseException:  # noqa: BLE001 - reported by the parent
        rec["errors"].append(f"process {p}:\n{traceback.format_exc()}")
        for b in (go_barrier, *dup_barriers):
            b.abort()
    finally:
        if shared is not None:
            shared.close()
        Path(out_path).write_text(json.dumps(rec))


def _run_workers(
    folder: Path, tmp_path: Path, mode: str, per_thread_store: bool, dup: list[tuple[str, list[str]]]
) -> list[dict[str, list[Any]]]:
    ctx = mp.get_context("fork")
    open_barrier = ctx.Barrier(N_PROCS)
    go_barrier = ctx.Barrier(N_PROCS * N_THREADS)
    dup_barriers = [ctx.Barrier(N_PROCS) for _ in range(N_THREADS)]
    outs = [tmp_path / f"worker{p}.json" for p in range(N_PROCS)]
    procs = [
        ctx.Process(
            target=_worker,
            args=(str(folder), p, mode, per_thread_store, str(outs[p]), open_barrier, go_barrier, dup, dup_barriers),
        )
        for p in range(N_PROCS)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(300)
    for p, proc in enumerate(procs):
        if proc.is_alive():
            proc.kill()
            proc.join()
        assert proc.exitcode == 0, f"worker {p} exited with {proc.exitcode}"
        assert outs[p].exists(), f"worker {p} wrote no record"
    records = [json.loads(o.read_text()) for o in outs]
    errors = [e for r in records for e in r["errors"]]
    locked = [e for e in errors if "database is locked" in e or "StoreBusyError" in e]
    assert not locked, f"{len(locked)} worker(s) hit a locked database:\n" + "\n".join(locked)
    assert not errors, f"{len(errors)} worker exception(s):\n" + "\n".join(errors)
    return records


# -- the expected ledger --------------------------------------------------------------------------
_FIELDS = ("retrieved", "shown", "credited", "wasted", "blamed", "credit_sum", "blame_sum")


def _rows(task: str | None) -> tuple[str, ...]:
    return (ALL_TASKS,) if task is None else (ALL_TASKS, task)


def _expected_stats(policy: CreditPolicy, searches: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """memory id -> task row -> field -> value, for searches given as {task, served, feedback|None}."""
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(lambda: dict.fromkeys(_FIELDS, 0)))
    for s in searches:
        for mid in s["served"]:
            for row in _rows(s["task"]):
                out[mid][row]["retrieved"] += 1
        fb = s["feedback"]
        if fb is None:
            continue
        assigned = policy.assign(s["served"], success=fb["success"], cited=fb["cited"], used=fb["used"])
        for mid, (credit, blame) in assigned.items():
            for row in _rows(s["task"]):
                st = out[mid][row]
                st["shown"] += 1
                st["credited"] += credit > 0
                st["wasted"] += credit == 0 and blame == 0
                st["blamed"] += blame > 0
                st["credit_sum"] += credit
                st["blame_sum"] += blame
    return out


def _check_ledger(folder: Path, searches: list[dict[str, Any]], adds: list[dict[str, Any]], n_seeds: int) -> None:
    with ReMem(folder) as mem:
        report = mem.verify()
        assert report.ok, "verify() failed:\n" + "\n".join(report.problems)

        for a in adds:
            assert mem.get(a["id"]).original_text == a["text"]
        # The lexical index (schema 5) kept up with every concurrent write: verify() compared it entry by
        # entry, and each added fact is found by its own words.
        with mem.store.read() as tx:
            assert tx.lexical_index_problems() == []
            everything = tx.max_seq()
            for a in adds:
                found = {mid for mid, _ in tx.lexical_candidates(a["text"], limit=everything, scopes=None)}
                assert a["id"] in found, f"{a['id']} ({a['text']!r}) is missing from the lexical index"
        assert len({a["id"] for a in adds}) == len(adds), "two distinct facts got the same id"
        memories = mem.list()
        assert len(memories) == len(adds) + n_seeds
        for key in {tuple(a["key"]) for a in adds if a["key"]}:
            current = [m for m in memories if m.key == key and m.state is not State.INVALIDATED]
            assert len(current) == 1, f"key {key}: {len(current)} current facts"

        answered = [s for s in searches if s["feedback"] is not None]
        st = mem.stats()
        assert st.searches == len(searches)
        assert st.feedbacks == len(answered)

        want = _expected_stats(mem.config.credit, searches)
        n_credit_rows = 0
        for m in memories:
            info = mem.inspect(m.id)
            n_credit_rows += len(info.credits)
            got = {row: {f: getattr(ts, f) for f in _FIELDS} for row, ts in info.stats.items()}
            expected = {row: dict(v) for row, v in want.get(m.id, {}).items()}
            if got != expected:
                diff = {
                    row: {
                        f: (got.get(row, {}).get(f), expected.get(row, {}).get(f))
                        for f in _FIELDS
                        if got.get(row, {}).get(f) != expected.get(row, {}).get(f)
                    }
                    for row in sorted(set(got) | set(expected))
                }
                pytest.fail(f"statistics of {m.id} ({m.text!r}) differ from what was sent, (got, sent): {diff}")
        assert n_credit_rows == sum(len(s["served"]) for s in answered)


# -- the tests ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("per_thread_store", [False, True], ids=["store-per-process", "store-per-thread"])
def test_two_processes_own_facts_no_lost_updates(tmp_path: Path, per_thread_store: bool) -> None:
    folder = tmp_path / "store"  # does not exist yet: both processes create and migrate it at once
    records = _run_workers(folder, tmp_path, "own", per_thread_store, [])
    adds = [a for r in records for a in r["adds"]]
    fbs = [f for r in records for f in r["feedbacks"]]
    assert len(adds) == len(fbs) == N_PROCS * N_THREADS * N_ITER
    assert not any(f["repeated"] for f in fbs)
    searches = [{"task": f["task"], "served": f["served"], "feedback": f} for f in fbs]
    _check_ledger(folder, searches, adds, n_seeds=0)


@pytest.mark.slow
@pytest.mark.parametrize("per_thread_store", [False, True], ids=["store-per-process", "store-per-thread"])
def test_two_processes_shared_memories_no_lost_updates(tmp_path: Path, per_thread_store: bool) -> None:
    folder = tmp_path / "store"
    with ReMem(folder) as mem:  # closed again before the fork
        seed_ids = mem.add_many(SEEDS)
        dup = [(r.search_id, r.ids) for r in (mem.search(SHARED_QUERY, k=len(SEEDS)) for _ in range(N_DUP_SEARCHES))]
    assert all(sorted(served) == sorted(seed_ids) for _, served in dup)

    records = _run_workers(folder, tmp_path, "shared", per_thread_store, dup)
    fbs = [f for r in records for f in r["feedbacks"]]
    assert len(fbs) == N_PROCS * N_THREADS * N_ITER
    assert not any(f["repeated"] for f in fbs)
    # Every search served all seeds, so every feedback hit the same statistics rows.
    assert all(sorted(f["served"]) == sorted(seed_ids) for f in fbs)

    # The pre-made searches were answered once per process: exactly one answer counted.
    dups = [d for r in records for d in r["dups"]]
    assert len(dups) == N_PROCS * N_DUP_SEARCHES
    by_sid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in dups:
        by_sid[d["search_id"]].append(d)
    for sid, answers in by_sid.items():
        assert sorted(a["repeated"] for a in answers) == [False] + [True] * (N_PROCS - 1), sid
        assert all(a["credit"] == answers[0]["credit"] and a["blame"] == answers[0]["blame"] for a in answers)

    searches = [{"task": f["task"], "served": f["served"], "feedback": f} for f in fbs]
    searches += [
        {"task": None, "served": served, "feedback": _payload(0, 0, j, served)} for j, (_, served) in enumerate(dup)
    ]
    _check_ledger(folder, searches, [], n_seeds=len(SEEDS))
    with ReMem(folder) as mem:
        total = len(fbs) + N_DUP_SEARCHES
        for mid in seed_ids:
            assert mem.inspect(mid).stats[ALL_TASKS].shown == total


def _race(fns: list[Any]) -> list[Any]:
    """Run the callables at the same moment on threads; returns each one's result or exception."""
    barrier = threading.Barrier(len(fns))
    out: list[Any] = [None] * len(fns)

    def run(n: int) -> None:
        barrier.wait(10)
        try:
            out[n] = fns[n]()
        except Exception as exc:  # noqa: BLE001 - the caller inspects what each thread got
            out[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(fns))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


@pytest.mark.parametrize("separate_stores", [False, True], ids=["one-store-object", "two-store-objects"])
def test_concurrent_identical_feedback_counts_once_and_different_feedback_conflicts(
    tmp_path: Path, separate_stores: bool
) -> None:
    folder = tmp_path / "store"
    mems = [ReMem(folder)]
    mems.append(ReMem(folder) if separate_stores else mems[0])
    try:
        mem = mems[0]
        ids = mem.add_many(SEEDS)
        policy = mem.config.credit
        rounds = 25
        shown = dict.fromkeys(ids, 0)
        for r in range(rounds):
            # Identical payload from two threads (used ids in a different order: still identical).
            res = mem.search(SHARED_QUERY, k=len(SEEDS))
            used = res.ids[: 1 + r % 3]
            got = _race(
                [
                    lambda m=m, u=u, sid=res.search_id: m.feedback(sid, success=True, used_ids=u)
                    for m, u in ((mems[0], used), (mems[1], used[::-1]))
                ]
            )
            assert all(not isinstance(g, BaseException) for g in got), got
            assert sorted(g.repeated for g in got) == [False, True]
            want = policy.assign(res.ids, success=True, cited=[], used=used)
            for g in got:
                assert dict(g.credit) == {m: c for m, (c, _) in want.items()}
            credits = [c for mid in res.ids for c in mem.inspect(mid).credits if c.search_id == res.search_id]
            assert len(credits) == len(res.ids), "identical feedback was counted twice"
            for mid in res.ids:
                shown[mid] += 1

            # Different payloads from two threads: exactly one wins, the other conflicts.
            res = mem.search(SHARED_QUERY, k=len(SEEDS))
            payloads = [{"success": True, "used_ids": res.ids[:1]}, {"success": False, "used_ids": res.ids[:2]}]
            got = _race(
                [lambda m=m, p=p, sid=res.search_id: m.feedback(sid, **p) for m, p in zip(mems, payloads, strict=True)]
            )
            conflicts = [n for n, g in enumerate(got) if isinstance(g, FeedbackConflictError)]
            winners = [n for n, g in enumerate(got) if not isinstance(g, BaseException)]
            assert len(conflicts) == 1 and len(winners) == 1, got
            w, lose = winners[0], conflicts[0]
            assert got[w].repeated is False
            assert mem.feedback(res.search_id, **payloads[w]).repeated is True
            with pytest.raises(FeedbackConflictError):
                mem.feedback(res.search_id, **payloads[lose])
            credits = [c for mid in res.ids for c in mem.inspect(mid).credits if c.search_id == res.search_id]
            assert len(credits) == len(res.ids)
            assert all(c.success is payloads[w]["success"] for c in credits)
            for mid in res.ids:
                shown[mid] += 1

        report = mem.verify()
        assert report.ok, "\n".join(report.problems)
        for mid in ids:
            assert mem.inspect(mid).stats[ALL_TASKS].shown == shown[mid]
    finally:
        for m in {id(m): m for m in mems}.values():
            m.close()
