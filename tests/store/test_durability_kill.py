"""SIGKILL crash test of the SQLite ledger.

A forked child opens one store folder (reused across all iterations, so later kills hit a bigger
ledger) and loops over ``add``, ``add_many``, ``search`` and ``feedback``. After each call *returns*
it appends an acknowledgement line to a file with one ``os.write`` (the line is in the page cache as
soon as the syscall returns, so it survives the kill). The parent kills the child with SIGKILL after
a random delay, reopens the store and checks:

* ``verify()`` is ok (SQLite integrity, event replay, supersession, aggregates == credit rows);
* every acknowledged ``add`` id is present with its text;
* every acknowledged ``add_many`` batch is present, and every attempted batch is all-or-nothing
  (memories are counted by a marker unique to the batch);
* every acknowledged search is in the ledger with the served ids the child saw;
* every acknowledged feedback is recorded: repeating it returns ``repeated=True`` with exactly the
  credit and blame the ``CreditPolicy`` assigns; an unacknowledged feedback is absent or complete.

Every ``FRESH_EVERY``-th iteration targets a brand-new folder and mostly kills the child inside its
first open, while it creates and migrates the ledger (the open's duration is measured as the test
goes, so this holds on slow and fast machines). On the main store, a third of the kills aim at an
announced ``add``/``add_many``/``feedback`` call, since those are too short for plain random delays.
Feedback payloads are a deterministic function of the search id, so a child may safely retry
feedback whose acknowledgement was lost. Run with ``-s`` to see where the kills landed.

Randomness affects only timing (kill delays and therefore how far each child gets); every assertion
is deterministic given what was acknowledged.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from remem_agent import ReMem, UnknownMemoryError
from remem_agent.store.migrations import LATEST

MIN_KILLS = 200
TIME_CAP_S = 150.0
FRESH_EVERY = 4  # every 4th iteration kills a child that is opening a brand-new store
CHILD_MAX_S = 20.0  # a child that was somehow never killed stops on its own
ERROR_EXIT = 70
SEED = int(os.environ.get("REMEM_KILL_SEED", "20240611"))

ENTITIES = ("server", "database", "cache", "gateway")
ATTRIBUTES = ("region", "owner")
VALUES = ("alpha", "beta", "gamma")
WORDS = ("deploy", "outage", "budget", "customer", "password", "meeting", "cache", "region")
QUERIES = (
    "Where is the server?",
    "Who owns the database?",
    "cache region",
    "gateway owner",
    "deploy outage budget",
    "customer meeting notes",
)
MARKER_RE = re.compile(r"^\[(b[0-9]+-[0-9]+)\] ")


def feedback_payload(search_id: str, served: list[str]) -> dict[str, Any]:
    """The one feedback ever sent for ``search_id`` (deterministic, so retries are identical)."""
    h = int.from_bytes(hashlib.blake2b(search_id.encode(), digest_size=8).digest(), "big")
    return {
        "success": h % 3 != 0,
        "used": served[:1] if h % 2 == 0 else [],
        "cited": served[1:2] if (h >> 3) % 3 == 0 else [],
    }


# -- the child --------------------------------------------------------------------------------------
def _child(folder: str, ack_path: str, seed: int, tag: int, pending: list[tuple[str, list[str]]]) -> None:
    fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def ack(**rec: Any) -> None:
        os.write(fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())

    try:
        rng = random.Random(seed)
        todo = list(pending)
        rng.shuffle(todo)
        ack(op="opening", t=time.monotonic())
        mem = ReMem(folder)
        ack(op="opened", t=time.monotonic())
        deadline = time.monotonic() + CHILD_MAX_S
        step = 0
        while time.monotonic() < deadline:
            step += 1
            r = rng.random()
            if r < 0.30:
                if rng.random() < 0.6:
                    ent, attr = rng.choice(ENTITIES), rng.choice(ATTRIBUTES)
                    text = f"The {ent} {attr} is {rng.choice(VALUES)}."
                    ack(op="call", what="add")
                    mid = mem.add(text, entity=ent, attribute=attr)
                else:
                    text = f"Note {tag}-{step}: the {rng.choice(WORDS)} needs {rng.choice(WORDS)} attention."
                    role = rng.choice(("note", "preference"))
                    ack(op="call", what="add")
                    mid = mem.add(text, role=role)
                ack(op="add", id=mid, text=text)
            elif r < 0.48:
                marker = f"b{tag}-{step}"
                size = rng.randint(2, 30)
                items: list[Any] = []
                for j in range(size):
                    if j % 4 == 0:
                        ent, attr = rng.choice(ENTITIES), rng.choice(ATTRIBUTES)
                        items.append(
                            {
                                "text": f"[{marker}] The {ent} {attr} is {rng.choice(VALUES)} ({j}).",
                                "entity": ent,
                                "attribute": attr,
                            }
                        )
                    else:
                        items.append(f"[{marker}] item {j} about the {rng.choice(WORDS)}.")
                ack(op="call", what="add_many", marker=marker, n=size)
                ids = mem.add_many(items)
                ack(op="add_many", marker=marker, ids=ids)
            elif r < 0.66 or not todo:
                ack(op="call", what="search")
                res = mem.search(rng.choice(QUERIES), k=rng.randint(1, 6))
                ack(op="search", search_id=res.search_id, served=res.ids)
                todo.append((res.search_id, res.ids))
            else:
                sid, served = todo.pop(rng.randrange(len(todo)))
                fb = feedback_payload(sid, served)
                ack(op="call", what="feedback", search_id=sid)
                receipt = mem.feedback(sid, success=fb["success"], used_ids=fb["used"], cited_ids=fb["cited"])
                ack(op="feedback", search_id=sid, repeated=receipt.repeated, **fb)
        ack(op="done")
        mem.close()
        os._exit(0)
    except BaseException:  # noqa: BLE001 - the parent fails the test with this traceback
        try:
            ack(op="error", tb=traceback.format_exc())
        finally:
            os._exit(ERROR_EXIT)


def _read_acks(path: Path) -> list[dict[str, Any]]:
    """Complete acknowledgement lines (a kill may cut the very last line short: it is ignored)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n"):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# -- what the parent knows ----------------------------------------------------------------------------
@dataclass
class Expected:
    adds: dict[str, str] = field(default_factory=dict)  # acknowledged add id -> text
    batches: dict[str, list[str]] = field(default_factory=dict)  # acknowledged batch marker -> ids
    searches: dict[str, list[str]] = field(default_factory=dict)  # acknowledged search -> served
    answered: dict[str, dict[str, Any]] = field(default_factory=dict)  # acknowledged feedback payloads
    pending: dict[str, list[str]] = field(default_factory=dict)  # searches without acknowledged feedback
    attempted: dict[str, int] = field(default_factory=dict)  # every batch a child started -> its size

    def apply(self, acks: list[dict[str, Any]]) -> tuple[dict[str, int], list[dict[str, Any]]]:
        """Fold one child's acknowledgements in; returns the attempted batches and the new acks."""
        attempted: dict[str, int] = {}
        new: list[dict[str, Any]] = []
        for a in acks:
            op = a["op"]
            if op == "error":
                pytest.fail(f"child raised:\n{a['tb']}")
            if op == "call" and a["what"] == "add_many":
                attempted[a["marker"]] = self.attempted[a["marker"]] = a["n"]
            elif op == "add":
                self.adds[a["id"]] = a["text"]
                new.append(a)
            elif op == "add_many":
                assert len(a["ids"]) == attempted[a["marker"]]
                self.batches[a["marker"]] = a["ids"]
                new.append(a)
            elif op == "search":
                self.searches[a["search_id"]] = a["served"]
                self.pending[a["search_id"]] = a["served"]
                new.append(a)
            elif op == "feedback":
                sid = a["search_id"]
                payload = {"success": a["success"], "used": a["used"], "cited": a["cited"]}
                assert payload == feedback_payload(sid, self.searches[sid])
                self.answered[sid] = payload
                self.pending.pop(sid, None)
                new.append(a)
        return attempted, new


def _phase(acks: list[dict[str, Any]]) -> str:
    """Where the kill landed, judged from the last acknowledgement."""
    if not acks:
        return "before-open"
    last = acks[-1]["op"]
    if last == "opening":
        return "during-open"
    if last == "call":
        return f"inside-{acks[-1]['what']}"
    return "between-calls"


def _check_store(
    folder: Path,
    exp: Expected,
    attempted: dict[str, int],
    new: list[dict[str, Any]],
    *,
    full: bool,
    outcomes: Counter[str] | None = None,
    in_flight_feedback: str | None = None,
) -> None:
    """Reopen the store and check it against what was acknowledged (``full``: everything ever acked)."""
    outcomes = Counter() if outcomes is None else outcomes
    try:
        mem = ReMem(folder)
    except Exception as exc:  # noqa: BLE001 - any failure to reopen is the finding
        pytest.fail(f"the store could not be reopened after a kill: {exc!r}")
    with mem:
        policy = mem.config.credit
        report = mem.verify()
        assert report.ok, "verify() failed after a kill:\n" + "\n".join(report.problems)
        assert mem.store.schema_version == LATEST

        # All-or-nothing batches, and acknowledged batches complete.
        by_marker: dict[str, list[str]] = {}
        for m in mem.list():
            if mt := MARKER_RE.match(m.original_text):
                by_marker.setdefault(mt.group(1), []).append(m.id)
        for marker, n in (exp.attempted if full else attempted).items():
            got = by_marker.get(marker, [])
            assert len(got) in (0, n), f"batch {marker}: {len(got)} of {n} memories survived (not atomic)"
            if marker not in exp.batches and not full:
                outcomes["unacked batch committed" if got else "unacked batch rolled back"] += 1
            if marker in exp.batches:
                assert sorted(got) == sorted(exp.batches[marker]), f"acknowledged batch {marker} lost"

        # The lexical index (schema 5) follows the rows through every kill: verify() compared it entry by
        # entry; and each acknowledged batch is found by the words of its marker.
        with mem.store.read() as tx:
            assert tx.lexical_index_problems() == []
            everything = tx.max_seq()
            acked = exp.batches if full else {a["marker"]: a["ids"] for a in new if a["op"] == "add_many"}
            for marker, ids in acked.items():
                found = {mid for mid, _ in tx.lexical_candidates(marker, limit=everything, scopes=None)}
                assert set(ids) <= found, f"batch {marker} is missing from the lexical index"

        # Acknowledged adds.
        add_ids = exp.adds if full else {a["id"]: a["text"] for a in new if a["op"] == "add"}
        for mid, text in add_ids.items():
            try:
                stored = mem.get(mid).original_text
            except UnknownMemoryError:
                pytest.fail(f"acknowledged add {mid} ({text!r}) was lost")
            assert stored == text, f"acknowledged add {mid} has the wrong text"

        # Acknowledged searches, and unacknowledged feedback is absent or complete.
        sids = exp.searches if full else {a["search_id"]: a["served"] for a in new if a["op"] == "search"}
        with mem.store.read() as tx:
            for sid, served in sids.items():
                rec = tx.search(sid)
                assert rec is not None, f"acknowledged search {sid} lost"
                assert rec.served_ids == served
            for sid, served in exp.pending.items():
                rec = tx.search(sid)
                assert rec is not None, f"acknowledged search {sid} lost"
                assert rec.feedback in (None, feedback_payload(sid, served))
                if sid == in_flight_feedback:
                    outcomes["unacked feedback committed" if rec.feedback else "unacked feedback rolled back"] += 1

        # Acknowledged feedback: repeating it is a no-op that returns the recorded credit.
        fbs = (
            exp.answered
            if full
            else {a["search_id"]: exp.answered[a["search_id"]] for a in new if a["op"] == "feedback"}
        )
        for sid, fb in fbs.items():
            receipt = mem.feedback(sid, success=fb["success"], used_ids=fb["used"], cited_ids=fb["cited"])
            assert receipt.repeated, f"acknowledged feedback for {sid} was not recorded"
            want = policy.assign(exp.searches[sid], success=fb["success"], cited=fb["cited"], used=fb["used"])
            assert dict(receipt.credit) == {m: c for m, (c, _) in want.items()}
            assert dict(receipt.blame) == {m: b for m, (_, b) in want.items()}


def _wait_for(ack_path: Path, proc: Any, needle: bytes, nth: int, limit_s: float = 2.0) -> None:
    """Poll the child's acknowledgements until ``needle`` appeared ``nth`` times (or time is up)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end and proc.is_alive():
        if ack_path.exists() and ack_path.read_bytes().count(needle) >= nth:
            return
        time.sleep(0.0002)


@pytest.mark.slow
def test_sigkill_never_loses_acknowledged_work_or_breaks_invariants(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    rng = random.Random(SEED)
    main = tmp_path / "main_store"
    exp = Expected()
    kills = 0
    phases: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    t0 = time.monotonic()
    i = 0
    open_s = 0.02  # estimate of the first open's duration in a child, refined from observations
    while kills < MIN_KILLS and time.monotonic() - t0 < TIME_CAP_S:
        i += 1
        fresh = i % FRESH_EVERY == 0
        folder = tmp_path / f"fresh_{i}" if fresh else main
        target = Expected() if fresh else exp
        ack_path = tmp_path / f"acks_{i}.jsonl"
        # Fresh store: mostly kill inside the first open (creating and migrating the ledger), whose
        # duration is measured as the test goes. Main store: a third of the delays count from the
        # fork, a third from the end of the open, and a third aim at a call (feedback and add are
        # short, so a plain random delay rarely lands inside them).
        mode = ("opening" if rng.random() < 0.8 else "fork") if fresh else rng.choice(("fork", "opened", "call"))
        needle, nth = b"", 0
        if mode == "opening":
            needle, nth, delay = b'"opening"', 1, rng.uniform(0.0, 1.2 * open_s)
        elif fresh:
            delay = rng.uniform(0.0, 0.005 + 1.5 * open_s)
        elif mode == "fork":
            delay = rng.uniform(0.0, 0.005) if rng.random() < 0.3 else rng.uniform(0.005, 0.15)
        elif mode == "opened":
            needle, nth, delay = b'"opened"', 1, rng.uniform(0.0, 0.04)
        else:
            what = rng.choice(("feedback", "add", "add_many"))
            needle, nth, delay = f'"what":"{what}"'.encode(), rng.randint(1, 3), rng.uniform(0.0, 0.0005)
        pending = list(target.pending.items())[-200:]
        # The parent holds no store open here: every check below runs inside `with ReMem(...)`.
        proc = ctx.Process(target=_child, args=(str(folder), str(ack_path), SEED + i, i, pending), daemon=True)
        proc.start()
        if needle:
            _wait_for(ack_path, proc, needle, nth)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        acks = _read_acks(ack_path)
        attempted, new = target.apply(acks)  # fails on a child's error line
        assert proc.exitcode == -signal.SIGKILL, f"child exited with {proc.exitcode} before the kill"
        kills += 1
        phases[("fresh:" if fresh else "") + _phase(acks)] += 1
        if fresh and [a["op"] for a in acks[:2]] == ["opening", "opened"]:
            open_s = 0.7 * open_s + 0.3 * (acks[1]["t"] - acks[0]["t"])  # how long a first open takes
        in_flight = acks[-1].get("search_id") if acks and acks[-1]["op"] == "call" else None
        _check_store(folder, target, attempted, new, full=fresh, outcomes=outcomes, in_flight_feedback=in_flight)
        ack_path.unlink(missing_ok=True)
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)

    elapsed = time.monotonic() - t0
    with ReMem(main) as mem:
        size = mem.stats()
    summary = (
        f"{kills} kills in {elapsed:.1f}s (seed {SEED}); main store: {size.memories} memories, "
        f"{size.searches} searches, {size.feedbacks} feedbacks; acknowledged: {len(exp.adds)} adds, "
        f"{len(exp.batches)} batches, {len(exp.answered)} feedbacks; kill points: {dict(sorted(phases.items()))}; "
        f"in-flight calls: {dict(sorted(outcomes.items()))}; first open takes ~{1000 * open_s:.1f} ms"
    )
    print(summary)
    assert kills >= MIN_KILLS, f"only {summary}"
    # Everything ever acknowledged on the main store, once more at the end.
    _check_store(main, exp, {}, [], full=True)
