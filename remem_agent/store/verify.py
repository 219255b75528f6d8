"""Invariants of the ledger, checked by ``verify()``.

Each check is a query that returns the offending rows, so a report names what is wrong rather than
just failing. The invariants:

1. The database's own consistency check passes (SQLite ``integrity_check``; PostgreSQL has none
   that is cheap, its constraints and triggers are checked on every write).
2. Every memory's event log replays through the state machine from ``add`` to its current state,
   with each event's ``from_state`` equal to the previous event's ``to_state``.
3. A superseded memory is INVALIDATED, has ``valid_to >= valid_from`` and points at an existing memory;
   a memory whose invalidation event names a replacement points at exactly that one.
4. At most one current role-'state' fact per (entity, attribute) key.
5. Every embedding has the store's dimension and is finite.
6. The per-class aggregates equal the sums of the append-only credit rows (no lost updates).
7. Every answered search has exactly one credit row per served memory; no credit without feedback.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from remem_agent.errors import InvalidTransition
from remem_agent.learning.lifecycle import LifecycleEvent, next_state
from remem_agent.store.sql import LedgerTx, from_json
from remem_agent.types import ALL_TASKS, State

_LIMIT = 50  # cap the rows reported per check


def verify_ledger(tx: LedgerTx, dim: int | None, problems: list[str] | None = None) -> list[str]:
    """Check invariants 2-7 through ``tx`` (any backend); appends to and returns ``problems``."""
    problems = [] if problems is None else problems
    c = tx.run

    # 2. event replay
    rows = c("SELECT id, state, superseded_by FROM memories").fetchall()
    states = {r[0]: r[1] for r in rows}
    links = {r[0]: r[2] for r in rows}
    replay: dict[str, State | None] = {}
    seen_add: set[str] = set()
    replaced_by: dict[str, str] = {}  # the "by" of each memory's last superseding invalidation
    for mid, kind, frm, to, evidence in c(
        "SELECT memory_id, kind, from_state, to_state, evidence FROM events ORDER BY memory_id, seq"
    ):
        if mid not in states:
            problems.append(f"event for unknown memory {mid}")
            continue
        prev = replay.get(mid)
        frm_state = State(frm) if frm else None
        if frm_state != prev:
            problems.append(f"{mid}: event {kind} starts from {frm} but the previous state was {prev}")
        try:
            expected = next_state(frm_state, LifecycleEvent(kind), memory_id=mid)
        except (InvalidTransition, ValueError):
            problems.append(f"{mid}: illegal event {kind} from {frm}")
            expected = State(to)
        if expected.value != to:
            problems.append(f"{mid}: event {kind} from {frm} should lead to {expected}, logged {to}")
        if kind == LifecycleEvent.ADD.value:
            seen_add.add(mid)
        elif kind == LifecycleEvent.INVALIDATE.value:
            by = from_json(evidence).get("by")
            if by:
                replaced_by[mid] = str(by)
        replay[mid] = State(to)
    for mid, state in states.items():
        if mid not in seen_add:
            problems.append(f"{mid}: no add event")
        elif replay.get(mid) is not None and replay[mid] != State(state):
            problems.append(f"{mid}: state {state} but its event log ends in {replay[mid]}")

    # 3. supersession links (and the link agrees with the event that made it)
    for mid, by in replaced_by.items():
        if links.get(mid) != by:
            problems.append(f"{mid}: its invalidation names {by} as replacement but superseded_by is {links.get(mid)}")
    for mid, state, vf, vt, sup, exists in c(
        "SELECT m.id, m.state, m.valid_from, m.valid_to, m.superseded_by, n.id FROM memories m "
        "LEFT JOIN memories n ON n.id = m.superseded_by WHERE m.superseded_by IS NOT NULL LIMIT ?",
        (_LIMIT * 100,),
    ):
        if state != State.INVALIDATED.value:
            problems.append(f"{mid}: superseded by {sup} but state is {state}")
        if exists is None:
            problems.append(f"{mid}: superseded_by points at missing memory {sup}")
        if vt is None or vt < vf:
            problems.append(f"{mid}: superseded but valid_to={vt} (valid_from={vf})")

    # 4. one current fact per key (in learned-schema mode only once the attribute is known single-valued)
    mode_row = c("SELECT value FROM meta WHERE key = 'supersession'").fetchone()
    learned = mode_row is not None and mode_row[0] == "learned"
    single = {r[0] for r in c("SELECT attribute FROM attributes WHERE single_valued = 1")}
    for ent, attr, n in c(
        "SELECT entity, attribute, COUNT(*) FROM memories WHERE role = 'state' AND entity IS NOT NULL "
        "AND attribute IS NOT NULL AND state != 'INVALIDATED' GROUP BY entity, attribute HAVING COUNT(*) > 1 "
        "LIMIT ?",
        (_LIMIT,),
    ):
        if learned and attr not in single:
            continue  # a pending conflict: the attribute is not (yet) known to be single-valued
        problems.append(f"key ({ent!r}, {attr!r}) has {n} current state facts")

    # 5. embeddings
    if dim is not None:
        for mid, raw in c("SELECT id, embedding FROM memories"):
            vec = tx.load_vector(raw)
            if vec.shape != (dim,):
                problems.append(f"{mid}: embedding has {vec.size} floats, store dim is {dim}")
            elif not np.isfinite(vec).all():
                problems.append(f"{mid}: embedding is not finite")

    # 6. aggregates == sums of credits
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0, 0.0])
    for mid, task, credit, blame in c("SELECT memory_id, task, credit, blame FROM credits"):
        keys = [(mid, ALL_TASKS)] + ([(mid, task)] if task not in (None, ALL_TASKS) else [])
        for key in keys:
            s = sums[key]
            s[0] += 1
            s[1] += credit > 0
            s[2] += credit == 0 and blame == 0
            s[3] += blame > 0
            s[4] += credit
            s[5] += blame
    stat_rows = c(
        "SELECT memory_id, task, shown, credited, wasted, blamed, credit_sum, blame_sum FROM stats"
    ).fetchall()
    seen_keys = set()
    for mid, task, *vals in stat_rows:
        seen_keys.add((mid, task))
        want = sums.get((mid, task), [0, 0, 0, 0, 0.0, 0.0])
        if [int(v) for v in vals[:4]] != [int(v) for v in want[:4]] or any(
            abs(float(a) - float(b)) > 1e-6 for a, b in zip(vals[4:], want[4:], strict=True)
        ):
            problems.append(f"stats ({mid}, {task}) = {vals} but credits sum to {want}")
    for key in sums.keys() - seen_keys:
        problems.append(f"credits for {key} have no stats row")

    # 6b. retrieval counters == how often the searches served each memory
    served_counts: dict[tuple[str, str], int] = defaultdict(int)
    for task, served in c("SELECT task, served FROM searches"):
        for item in from_json(served):
            mid = item["id"]
            served_counts[(mid, ALL_TASKS)] += 1
            if task not in (None, ALL_TASKS):
                served_counts[(mid, task)] += 1
    for mid, task, retrieved in c("SELECT memory_id, task, retrieved FROM stats"):
        if retrieved != served_counts.get((mid, task), 0):
            problems.append(
                f"stats ({mid}, {task}) retrieved={retrieved} but searches served it "
                f"{served_counts.get((mid, task), 0)} times"
            )

    # 7. answered searches have one credit row per served memory
    credit_counts = dict(c("SELECT search_id, COUNT(*) FROM credits GROUP BY search_id").fetchall())
    for sid, served, fb in c("SELECT search_id, served, feedback FROM searches"):
        n_served = len(from_json(served))
        got = credit_counts.pop(sid, 0)
        if fb is not None and got != n_served:
            problems.append(f"search {sid}: {n_served} served but {got} credit rows")
        if fb is None and got:
            problems.append(f"search {sid}: credit rows without feedback")
    for sid in credit_counts:
        problems.append(f"credits for unknown search {sid}")
    return problems
