"""Invariants of the ledger, checked by ``verify()``.

Each check is a query that returns the offending rows, so a report names what is wrong rather than
just failing. The invariants:

1. The database's own consistency check passes (SQLite ``integrity_check``; PostgreSQL has none
   that is cheap, its constraints and triggers are checked on every write).
2. Every memory's event log replays through the state machine from ``add`` to its current state,
   with each event's ``from_state`` equal to the previous event's ``to_state``.
3. A superseded memory is INVALIDATED (or ERASED since), has ``valid_to >= valid_from`` and points at an
   existing memory; a memory whose invalidation event names a replacement points at exactly that one.
4. At most one current role-'state' fact per (entity, attribute) key within each scope.
5. Every embedding has the store's dimension and is finite.
6. The per-class aggregates and the relevance prior's calibration (schema 10) equal the sums of the
   append-only credit rows (no lost updates), and
   every memory a search served has its retrieval counters (a deleted statistics row shows).
7. Every answered search has exactly one credit row per served memory; no credit without feedback.
8. Every row's content hash (schema version 3, ``hashing.py``) matches its fields: memories
   (immutable fields), events, searches, feedback, credits, learned attributes; and each memory's
   mutable columns (text, token_cost, confidence, valid_to, superseded_by) equal what replaying its
   events' recorded updates gives. So an edit of served text, original_text, validity or evidence shows.
9. A store with memories records its embedder and dimension in ``meta``.
10. The lexical index (schema 5, on PostgreSQL schema 9) holds every memory exactly once, with its current
    text: SQLite's FTS5 index equals one rebuilt from ``memories.text`` (rows, terms and positions);
    PostgreSQL's ``memory_terms`` rows and ``n_terms`` equal the tokens of the text.
11. Every answer waiting for its outcome (schema 6, ``pending.py``) points at a search of its own scope.
12. The time mentions (schema 11, ``times.py``) are exactly what resolving each memory's original text
    against its ``valid_from`` gives, under the resolver version the store records.

Each check runs on its own: one that cannot run (a damaged row, a NULL where the schema forbids it)
becomes a problem naming the check, and the others still run. ``verify()`` reports, it never raises.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np

from remem_agent.errors import InvalidTransition
from remem_agent.store import hashing, pending, pruning, times
from remem_agent.store.lifecycle import LifecycleEvent, next_state
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sql_rows import from_json
from remem_agent.types import ALL_TASKS, State, calibration_bin

_LIMIT = 50  # cap the rows reported per check


def verify_ledger(tx: LedgerTx, dim: int | None, problems: list[str] | None = None) -> list[str]:
    """Check invariants 2-12 through ``tx`` (any backend); appends to and returns ``problems``."""
    problems = [] if problems is None else problems
    checks: list[tuple[str, Callable[[LedgerTx, int | None, list[str]], None]]] = [
        ("event replay and supersession", _check_events),
        ("one current fact per key", _check_keys),
        ("embeddings", _check_embeddings),
        ("statistics", _check_stats),
        ("contribution per kind", _check_groups),
        ("credits per search", _check_credits),
        ("content hashes", _check_hashes),
        ("meta", _check_meta),
        ("lexical index", _check_lexical),
        ("pending outcomes", _check_pending),
        ("time mentions", _check_times),
    ]
    for name, check in checks:
        found: list[str] = []
        try:
            check(tx, dim, found)
        except Exception as exc:  # noqa: BLE001 - a check that cannot run is itself a finding
            found.append(f"check '{name}' could not run ({type(exc).__name__}: {exc}): the ledger is damaged")
        problems += found
    return problems


def _check_events(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
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
        if state not in (State.INVALIDATED.value, State.ERASED.value):  # an erased fact keeps its link
            problems.append(f"{mid}: superseded by {sup} but state is {state}")
        if exists is None:
            problems.append(f"{mid}: superseded_by points at missing memory {sup}")
        if vt is None or vf is None or vt < vf:
            problems.append(f"{mid}: superseded but valid_to={vt} (valid_from={vf})")


def _check_keys(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    c = tx.run
    # 4. one current fact per key (in learned-schema mode only once the attribute is known single-valued)
    mode_row = c("SELECT value FROM meta WHERE key = 'supersession'").fetchone()
    learned = mode_row is not None and mode_row[0] == "learned"
    single = {r[0] for r in c("SELECT attribute FROM attributes WHERE single_valued = 1")}
    for scope, ent, attr, n in c(
        "SELECT scope, entity, attribute, COUNT(*) FROM memories WHERE role = 'state' AND entity IS NOT NULL "
        "AND attribute IS NOT NULL AND state != 'INVALIDATED' GROUP BY scope, entity, attribute "
        "HAVING COUNT(*) > 1 LIMIT ?",
        (_LIMIT,),
    ):
        if learned and attr not in single:
            continue  # a pending conflict: the attribute is not (yet) known to be single-valued
        problems.append(f"key ({ent!r}, {attr!r}) has {n} current state facts in scope {scope!r}")


def _check_embeddings(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    # 5. embeddings
    if dim is not None:
        for mid, raw in tx.run("SELECT id, embedding FROM memories"):
            try:
                vec = tx.load_vector(raw)
            except (TypeError, ValueError) as exc:
                problems.append(f"{mid}: embedding cannot be read ({exc})")
                continue
            if vec.shape != (dim,):
                problems.append(f"{mid}: embedding has {vec.size} floats, store dim is {dim}")
            elif not np.isfinite(vec).all():
                problems.append(f"{mid}: embedding is not finite")


def _check_stats(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    c = tx.run
    # 6. aggregates == sums of credits: shown, credited, wasted, blamed, credit_sum, blame_sum, expected_sum,
    # expected_n (an exposure's expected uses counts where the credit row recorded one)
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0, 0.0, 0.0, 0])
    for mid, task, credit, blame, expected in c("SELECT memory_id, task, credit, blame, expected FROM credits"):
        keys = [(mid, ALL_TASKS)] + ([(mid, task)] if task not in (None, ALL_TASKS) else [])
        for key in keys:
            s = sums[key]
            s[0] += 1
            s[1] += credit > 0
            s[2] += credit == 0 and blame == 0
            s[3] += blame > 0
            s[4] += credit
            s[5] += blame
            if expected is not None:
                s[6] += expected
                s[7] += 1
    stat_rows = c(
        "SELECT memory_id, task, shown, credited, wasted, blamed, credit_sum, blame_sum, expected_sum, expected_n "
        "FROM stats"
    ).fetchall()
    seen_keys = set()
    counts, amounts = (0, 1, 2, 3, 7), (4, 5, 6)
    for mid, task, *vals in stat_rows:
        seen_keys.add((mid, task))
        want = sums.get((mid, task), [0, 0, 0, 0, 0.0, 0.0, 0.0, 0])
        if any(int(vals[i]) != int(want[i]) for i in counts) or any(
            abs(float(vals[i]) - float(want[i])) > 1e-6 for i in amounts
        ):
            problems.append(f"stats ({mid}, {task}) = {vals} but credits sum to {want}")
    for key in sums.keys() - seen_keys:
        problems.append(f"credits for {key} have no stats row")

    # 6c. the relevance prior's calibration == its judged exposures, per scope and bin of the prior
    want_cal: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0])
    for scope, prior, credit in c(
        "SELECT s.scope, c.prior, c.credit FROM credits c JOIN searches s ON s.search_id = c.search_id "
        "WHERE c.prior IS NOT NULL"
    ):
        acc = want_cal[(str(scope), calibration_bin(float(prior)))]
        acc[0] += min(1.0, float(credit))
        acc[1] += 1
    for scope, b, uses, exposures in c("SELECT scope, bin, uses, exposures FROM prior_calibration"):
        want = want_cal.pop((str(scope), int(b)), [0.0, 0])
        if int(exposures) != int(want[1]) or abs(float(uses) - float(want[0])) > 1e-6:
            problems.append(
                f"prior calibration ({scope}, bin {b}) = ({uses}, {exposures}) but its credits sum to "
                f"({want[0]}, {want[1]})"
            )
    for (scope, b), want in sorted(want_cal.items())[:_LIMIT]:
        problems.append(f"credits of scope {scope} in prior bin {b} ({want[1]}) have no calibration row")

    # 6b. retrieval counters == how often the searches served each memory, the pruned ones included
    served_counts: dict[tuple[str, str], int] = defaultdict(int, pruning.retrieval_base(tx))
    for task, served in c("SELECT task, served FROM searches"):
        for item in from_json(served):
            mid = item["id"]
            served_counts[(mid, ALL_TASKS)] += 1
            if task not in (None, ALL_TASKS):
                served_counts[(mid, task)] += 1
    have_row = set()
    for mid, task, retrieved in c("SELECT memory_id, task, retrieved FROM stats"):
        have_row.add((mid, task))
        if retrieved != served_counts.get((mid, task), 0):
            problems.append(
                f"stats ({mid}, {task}) retrieved={retrieved} but searches served it "
                f"{served_counts.get((mid, task), 0)} times"
            )
    for mid, task in sorted(served_counts.keys() - have_row)[:_LIMIT]:
        problems.append(
            f"searches served {mid} (task {task}) {served_counts[(mid, task)]} times but it has no stats row"
        )


def _check_groups(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    """6d. each kind's contribution (``group_contribution``) == its judged exposures, per scope and role."""
    c = tx.run
    want_group: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for scope, role, credit, expected in c(
        "SELECT s.scope, m.role, c.credit, c.expected FROM credits c JOIN searches s ON s.search_id = c.search_id "
        "JOIN memories m ON m.id = c.memory_id WHERE c.expected IS NOT NULL"
    ):
        acc = want_group[(str(scope), str(role))]
        acc[0] += min(1.0, float(credit))
        acc[1] += float(expected)
        acc[2] += 1
    for scope, role, uses, expected, exposures in c(
        "SELECT scope, role, uses, expected, exposures FROM group_contribution"
    ):
        want = want_group.pop((str(scope), str(role)), [0.0, 0.0, 0])
        if (
            int(exposures) != int(want[2])
            or abs(float(uses) - float(want[0])) > 1e-6
            or abs(float(expected) - float(want[1])) > 1e-6
        ):
            problems.append(
                f"contribution of {role} memories in scope {scope} = ({uses}, {expected}, {exposures}) but their "
                f"credits sum to ({want[0]}, {want[1]}, {want[2]})"
            )
    for (scope, role), want in sorted(want_group.items())[:_LIMIT]:
        problems.append(f"credits of {role} memories in scope {scope} ({want[2]}) have no contribution row")


def _check_credits(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    c = tx.run
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


def _report(problems: list[str], bad: list[str], what: str) -> None:
    problems += bad[:_LIMIT]
    if len(bad) > _LIMIT:
        problems.append(f"... and {len(bad) - _LIMIT} more {what}")


def _check_hashes(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    """8. content hashes and the replay of each memory's mutable columns from its events."""
    c = tx.run
    edited = "was edited outside remem-agent or damaged"
    bad: list[str] = []
    rows = c(f"SELECT {hashing.MEMORY_HASH_COLS}, content_hash, {', '.join(hashing.MUTABLE)} FROM memories").fetchall()
    current: dict[str, tuple[object, ...]] = {}
    w = hashing.MEMORY_HASH_WIDTH
    for r in rows:
        mid, stored = r[0], r[w]
        current[mid] = tuple(r[w + 1 :])
        if stored is None:
            bad.append(f"{mid}: memory has no content hash")
        elif not hashing.matches(stored, hashing.memory_hash, *r[:w]):
            bad.append(
                f"{mid}: memory content (original_text, key, role, tasks, created_at, valid_from, speaker or "
                f"session) {edited}"
            )
    _report(problems, bad, "memories with a bad hash")

    bad = []
    replayed: dict[str, dict[str, object]] = defaultdict(dict)
    for seq, *fields, stored in c(f"SELECT seq, {hashing.EVENT_HASH_COLS}, hash FROM events ORDER BY seq"):
        mid, updates = fields[0], fields[7]
        if stored is None:
            bad.append(f"{mid}: event {seq} has no content hash")
        elif not hashing.matches(stored, hashing.event_hash, *fields):
            bad.append(f"{mid}: event {seq} ({fields[2]}: reason, evidence, states or time) {edited}")
        if updates is not None:
            replayed[mid].update(from_json(updates))
    _report(problems, bad, "events with a bad hash")

    bad = []
    for mid, values in current.items():
        want = replayed.get(mid, {})
        for col, have in zip(hashing.MUTABLE, values, strict=True):
            if col not in want:
                continue
            exp = want[col]
            same = (
                abs(float(have) - float(exp)) <= 1e-9
                if isinstance(have, int | float) and isinstance(exp, int | float)
                else have == exp
            )
            if not same:
                bad.append(f"{mid}: {col} is {have!r} but its events set it to {exp!r} ({edited})")
    _report(problems, bad, "memories whose columns disagree with their events")

    bad = []
    for r in c(f"SELECT {hashing.SEARCH_HASH_COLS}, hash, feedback, feedback_at, feedback_hash FROM searches"):
        sid = r[0]
        if r[8] is None:
            bad.append(f"search {sid} has no content hash")
        elif not hashing.matches(r[8], hashing.search_hash, *r[:8]):
            bad.append(f"search {sid}: its record (query, task, time or served memories) {edited}")
        answered = r[9] is not None or r[11] is not None
        if answered and not hashing.matches(r[11], hashing.feedback_hash, sid, r[9], r[10]):
            bad.append(f"search {sid}: its feedback {edited}")
    _report(problems, bad, "searches with a bad hash")

    bad = []
    for seq, *fields, stored in c(f"SELECT seq, {hashing.CREDIT_HASH_COLS}, hash FROM credits ORDER BY seq"):
        if not hashing.matches(stored, hashing.credit_hash, *fields):
            bad.append(f"credit row {seq} (search {fields[0]}, memory {fields[1]}) {edited}")
    _report(problems, bad, "credit rows with a bad hash")

    bad = []
    for *fields, stored in c(f"SELECT {hashing.ATTRIBUTE_HASH_COLS}, hash FROM attributes"):
        if not hashing.matches(stored, hashing.attribute_hash, *fields):
            bad.append(f"learned attribute {fields[0]!r} {edited}")
    _report(problems, bad, "attributes with a bad hash")

    bad = []
    for sid, text, stored in c("SELECT search_id, decision, hash FROM search_decisions"):
        if stored != hashing.decision_hash(sid, text):
            bad.append(f"the decision of search {sid} {edited}")
    _report(problems, bad, "search decisions with a bad hash")


def _check_meta(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    """9. a store that holds memories names its embedder and dimension."""
    if tx.max_seq() == 0:
        return
    for key in ("embedder", "dim"):
        if tx.get_meta(key) is None:
            problems.append(f"meta has no {key!r} although the store holds memories (the row was deleted)")


def _check_lexical(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    """10. every memory in the full-text index exactly once, with its current text (per backend)."""
    _report(problems, tx.lexical_index_problems(), "memories with a bad full-text index entry")


def _check_pending(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    # 11. every waiting answer points at a search of its own scope
    problems += pending.problems(tx, _LIMIT)


def _check_times(tx: LedgerTx, dim: int | None, problems: list[str]) -> None:
    # 12. each memory's time mentions are what its text resolves to
    _report(problems, times.problems(tx), "memories with wrong time mentions")
