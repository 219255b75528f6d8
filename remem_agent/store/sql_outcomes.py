"""The ledger's queries of searches, feedback and what feedback teaches: credits, per-class statistics, the
relevance prior's calibration and the learned attributes (one half of :class:`~remem_agent.store.sql.LedgerTx`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from remem_agent.store import hashing
from remem_agent.store.sql_rows import (
    _CHUNK,
    STAT_COLS,
    TxHooks,
    _marks,
    from_json,
    task_rows,
)
from remem_agent.types import (
    ALL_TASKS,
    DEFAULT_SCOPE,
    AttributeInfo,
    CreditRecord,
    SearchRecord,
    TaskStats,
)


class OutcomeQueries(TxHooks):
    """Searches and their outcomes, as ``LedgerTx`` reads and writes them."""

    # -- searches and feedback ------------------------------------------------------------------
    def insert_search(
        self,
        search_id: str,
        *,
        at: float,
        query: str,
        task: str | None,
        as_of: float | None,
        now: float | None,
        token_budget: int | None,
        served: Sequence[Mapping[str, Any]],
        scope: str = DEFAULT_SCOPE,
        decision: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a search (and, with exploratory serving, its ``decision``: the pool and the served set's
        distribution, ranking/explore.py) and count what it served."""
        served = list(served)
        # hashed from the list itself: the JSON text read back is the same value (finite floats, ints and
        # strings round-trip exactly), without parsing it again on every search
        served_json, row_hash = hashing.search_row(search_id, at, query, task, as_of, now, token_budget, served)
        self.run(
            "INSERT INTO searches (search_id, at, query, task, as_of, now, token_budget, served, hash, scope) "
            "VALUES (?,?,?,?,?,?,?,?,?,?)",
            (search_id, at, query, task, as_of, now, token_budget, served_json, row_hash, scope),
        )
        if decision is not None:
            text = json.dumps(decision, sort_keys=True, separators=(",", ":"), allow_nan=False)
            self.run(
                "INSERT INTO search_decisions (search_id, decision, hash) VALUES (?,?,?)",
                (search_id, text, hashing.decision_hash(search_id, text)),
            )
        tasks = task_rows(task)
        rows = sorted((s["id"], t, at) for s in served for t in tasks)  # one lock order for every writer
        if rows:
            self.run_many(
                "INSERT INTO stats (memory_id, task, retrieved, last_retrieved_at) VALUES (?,?,1,?) "
                "ON CONFLICT (memory_id, task) DO UPDATE SET retrieved = stats.retrieved + 1, "
                "last_retrieved_at = excluded.last_retrieved_at",
                rows,
            )

    def search(self, search_id: str) -> SearchRecord | None:
        r = self.run(
            "SELECT search_id, at, query, task, as_of, now, token_budget, served, feedback, feedback_at, scope "
            "FROM searches WHERE search_id = ?",
            (search_id,),
        ).fetchone()
        if r is None:
            return None
        return SearchRecord(
            search_id=r[0],
            at=r[1],
            query=r[2],
            task=r[3],
            as_of=r[4],
            now=r[5],
            token_budget=r[6],
            served=tuple(from_json(r[7])),
            feedback=from_json(r[8]) if r[8] is not None else None,
            feedback_at=r[9],
            scope=r[10],
        )

    def answered_searches(
        self, latest: int | None = None
    ) -> Iterator[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
        """(search_id, served, feedback) of every answered search (or of the ``latest`` ones), in the order they
        were made."""
        order = self.search_order
        if latest is None:
            rows = self.run(
                f"SELECT search_id, served, feedback FROM searches WHERE feedback IS NOT NULL ORDER BY {order}"
            ).fetchall()
        else:
            rows = self.run(
                f"SELECT search_id, served, feedback FROM (SELECT search_id, served, feedback, {order} AS o "
                f"FROM searches WHERE feedback IS NOT NULL ORDER BY {order} DESC LIMIT ?) t ORDER BY o",
                (max(0, int(latest)),),
            ).fetchall()
        for sid, served, feedback in rows:
            yield str(sid), from_json(served), from_json(feedback)

    def decisions(
        self, scope: str | None = None, *, judged: bool = False
    ) -> Iterator[tuple[str, str | None, str, Any, dict[str, Any]]]:
        """(search_id, task, scope, feedback or None, decision) of every search that stored a decision (of
        ``scope``, when given; only those with a verdict when ``judged``), in the order they were made."""
        conds, args = (["s.scope = ?"], (scope,)) if scope is not None else ([], ())
        if judged:
            conds.append("s.feedback IS NOT NULL")
        where = f"WHERE {' AND '.join(conds)}" if conds else ""
        rows = self.run(
            "SELECT s.search_id, s.task, s.scope, s.feedback, d.decision FROM searches s "
            f"JOIN search_decisions d ON d.search_id = s.search_id {where} ORDER BY s.{self.search_order}",
            args,
        ).fetchall()
        for sid, task, sc, feedback, decision in rows:
            yield str(sid), task, str(sc), None if feedback is None else from_json(feedback), json.loads(decision)

    def search_counts(self, scope: str | None = None) -> tuple[int, int]:
        """(searches, answered searches), of ``scope`` when given."""
        where, args = ("WHERE scope = ?", (scope,)) if scope is not None else ("", ())
        r = self.run(f"SELECT COUNT(*), COUNT(feedback) FROM searches {where}", args).fetchone()
        return int(r[0]), int(r[1])

    def record_feedback(self, search_id: str, payload: Mapping[str, Any], at: float) -> bool:
        """Mark a search as answered; False when another writer got there first."""
        fb_json = json.dumps(payload, sort_keys=True)
        cur = self.run(
            "UPDATE searches SET feedback = ?, feedback_at = ?, feedback_hash = ? WHERE search_id = ? "
            "AND feedback IS NULL",
            (fb_json, at, hashing.feedback_hash(search_id, fb_json, at), search_id),
        )
        return bool(cur.rowcount == 1)

    def insert_credits(self, records: Iterable[CreditRecord]) -> None:
        """Append credit rows and fold them into the per-class aggregates with SQL increments."""
        recs = list(records)
        if not recs:
            return
        credit_rows = [
            (
                r.search_id,
                r.memory_id,
                r.task,
                r.at,
                int(r.success),
                int(r.cited),
                int(r.used),
                r.credit,
                r.blame,
                r.prior,
                r.expected,
            )
            for r in recs
        ]
        self.run_many(
            "INSERT INTO credits (search_id, memory_id, task, at, success, cited, used, credit, blame, prior, "
            "expected, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [(*row, hashing.credit_hash(*row)) for row in credit_rows],
        )
        rows = []
        for r in recs:
            credited = 1 if r.credit > 0 else 0
            blamed = 1 if r.blame > 0 else 0
            wasted = 1 if (r.credit == 0 and r.blame == 0) else 0
            last_credit = r.at if credited else None
            expected, expected_n = (0.0, 0) if r.expected is None else (r.expected, 1)
            for t in task_rows(r.task):
                rows.append(
                    (r.memory_id, t, credited, wasted, blamed, r.credit, r.blame, last_credit, expected, expected_n)
                )
        rows.sort(key=lambda row: (row[0], row[1]))  # one lock order for every writer: no deadlocks
        self.run_many(
            "INSERT INTO stats (memory_id, task, shown, credited, wasted, blamed, credit_sum, blame_sum, "
            "last_credited_at, expected_sum, expected_n) VALUES (?,?,1,?,?,?,?,?,?,?,?) "
            "ON CONFLICT (memory_id, task) DO UPDATE SET shown = stats.shown + 1, "
            "credited = stats.credited + excluded.credited, wasted = stats.wasted + excluded.wasted, "
            "blamed = stats.blamed + excluded.blamed, credit_sum = stats.credit_sum + excluded.credit_sum, "
            "blame_sum = stats.blame_sum + excluded.blame_sum, "
            "last_credited_at = COALESCE(excluded.last_credited_at, stats.last_credited_at), "
            "expected_sum = stats.expected_sum + excluded.expected_sum, "
            "expected_n = stats.expected_n + excluded.expected_n",
            rows,
        )

    def _credit_rows(self, where: str, arg: str) -> list[CreditRecord]:
        rows = self.run(
            "SELECT search_id, memory_id, task, at, success, cited, used, credit, blame, prior, expected "
            f"FROM credits WHERE {where} = ? ORDER BY seq",
            (arg,),
        )
        return [
            CreditRecord(r[0], r[1], r[2], r[3], bool(r[4]), bool(r[5]), bool(r[6]), r[7], r[8], r[9], r[10])
            for r in rows
        ]

    def prior_calibration(self, scope: str) -> dict[int, tuple[float, int]]:
        """The relevance prior's calibration in ``scope``: ``{bin: (uses, exposures)}`` of its judged exposures."""
        rows = self.run("SELECT bin, uses, exposures FROM prior_calibration WHERE scope = ?", (scope,))
        return {int(b): (float(u), int(n)) for b, u, n in rows}

    def add_to_calibration(self, scope: str, exposures: Iterable[tuple[int, float]]) -> None:
        """Count judged exposures, each ``(bin of its prior, use in [0, 1])``, into ``scope``'s calibration."""
        per_bin: dict[int, list[float]] = {}
        for b, use in exposures:
            acc = per_bin.setdefault(b, [0.0, 0.0])
            acc[0] += use
            acc[1] += 1
        if per_bin:
            self.run_many(
                "INSERT INTO prior_calibration (scope, bin, uses, exposures) VALUES (?,?,?,?) "
                "ON CONFLICT (scope, bin) DO UPDATE SET uses = prior_calibration.uses + excluded.uses, "
                "exposures = prior_calibration.exposures + excluded.exposures",
                [(scope, b, u, int(n)) for b, (u, n) in sorted(per_bin.items())],  # one lock order for every writer
            )

    def group_contribution(self, scope: str) -> dict[str, tuple[float, float]]:
        """What each kind of memory contributed in ``scope``: ``{role: (uses, expected uses)}`` of its judged
        exposures (ranking/utility.py ``ContributionUtility``)."""
        rows = self.run("SELECT role, uses, expected FROM group_contribution WHERE scope = ?", (scope,))
        return {str(r): (float(u), float(e)) for r, u, e in rows}

    def add_to_groups(self, scope: str, exposures: Iterable[tuple[str, float, float]]) -> None:
        """Count judged exposures, each ``(role of the memory, use in [0, 1], expected uses)``, into ``scope``'s
        per-role contribution."""
        per_role: dict[str, list[float]] = {}
        for role, use, expected in exposures:
            acc = per_role.setdefault(role, [0.0, 0.0, 0.0])
            acc[0] += use
            acc[1] += expected
            acc[2] += 1
        if per_role:
            self.run_many(
                "INSERT INTO group_contribution (scope, role, uses, expected, exposures) VALUES (?,?,?,?,?) "
                "ON CONFLICT (scope, role) DO UPDATE SET uses = group_contribution.uses + excluded.uses, "
                "expected = group_contribution.expected + excluded.expected, "
                "exposures = group_contribution.exposures + excluded.exposures",
                [(scope, r, u, e, int(n)) for r, (u, e, n) in sorted(per_role.items())],  # one lock order
            )

    def credits_for(self, memory_id: str) -> list[CreditRecord]:
        return self._credit_rows("memory_id", memory_id)

    def credits_for_search(self, search_id: str) -> list[CreditRecord]:
        return self._credit_rows("search_id", search_id)

    def credits_of_searches(self, search_ids: Sequence[str]) -> dict[tuple[str, str], float]:
        """``{(search_id, memory_id): credit}`` of the credit rows of ``search_ids`` (a later row of the same pair
        wins, as in :meth:`credit_values`), read in chunks of ids rather than one statement per search."""
        out: dict[tuple[str, str], float] = {}
        ids = list(dict.fromkeys(search_ids))
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            q = (
                "SELECT search_id, memory_id, credit FROM credits "
                f"WHERE search_id IN ({_marks(len(chunk))}) ORDER BY seq"
            )
            for sid, mid, cr in self.run(q, tuple(chunk)).fetchall():
                out[(str(sid), str(mid))] = float(cr)
        return out

    def credit_values(self) -> Iterator[tuple[str, str, float]]:
        """(search_id, memory_id, credit) of every credit row, oldest first."""
        for sid, mid, cr in self.run("SELECT search_id, memory_id, credit FROM credits ORDER BY seq").fetchall():
            yield str(sid), str(mid), float(cr)

    def stats(self, ids: Sequence[str], tasks: Sequence[str] = (ALL_TASKS,)) -> dict[tuple[str, str], TaskStats]:
        out: dict[tuple[str, str], TaskStats] = {}
        ids = list(ids)
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            q = (
                f"SELECT memory_id, task, {STAT_COLS} FROM stats WHERE memory_id IN ({_marks(len(chunk))}) "
                f"AND task IN ({_marks(len(tasks))})"
            )
            for r in self.run(q, (*chunk, *tasks)):
                out[(r[0], r[1])] = TaskStats(r[1], *r[2:])
        return out

    def all_stats(self, memory_id: str) -> dict[str, TaskStats]:
        rows = self.run(f"SELECT task, {STAT_COLS} FROM stats WHERE memory_id = ?", (memory_id,))
        return {r[0]: TaskStats(r[0], *r[1:]) for r in rows}

    def stats_all_classes(self, ids: Sequence[str]) -> dict[str, dict[str, TaskStats]]:
        out: dict[str, dict[str, TaskStats]] = {i: {} for i in ids}
        ids = list(ids)
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            q = f"SELECT memory_id, task, {STAT_COLS} FROM stats WHERE memory_id IN ({_marks(len(chunk))})"
            for r in self.run(q, chunk):
                out[r[0]][r[1]] = TaskStats(r[1], *r[2:])
        return out

    # -- attributes (learned schema, change counts) --------------------------------------------
    def attributes(self, names: Sequence[str]) -> dict[str, AttributeInfo]:
        names = sorted(set(names))
        if not names:
            return {}
        rows = self.run(
            "SELECT attribute, changes, confirmations, counter, single_valued, decided_at FROM attributes "
            f"WHERE attribute IN ({_marks(len(names))})",
            names,
        )
        return {r[0]: AttributeInfo(r[0], r[1], r[2], r[3], bool(r[4]), r[5]) for r in rows}

    def bump_attribute(self, name: str, *, changes: int = 0, confirmations: int = 0, counter: int = 0) -> None:
        row = self.run(
            "INSERT INTO attributes (attribute, changes, confirmations, counter) VALUES (?,?,?,?) "
            "ON CONFLICT (attribute) DO UPDATE SET changes = attributes.changes + excluded.changes, "
            "confirmations = attributes.confirmations + excluded.confirmations, "
            f"counter = attributes.counter + excluded.counter RETURNING {hashing.ATTRIBUTE_HASH_COLS}",
            (name, changes, confirmations, counter),
        ).fetchone()
        # the row as written, so its hash needs no second read (hashing.rehash_attribute)
        self.run("UPDATE attributes SET hash = ? WHERE attribute = ?", (hashing.attribute_hash(*row), name))

    def mark_single_valued(self, name: str, at: float) -> None:
        self.run("UPDATE attributes SET single_valued = 1, decided_at = ? WHERE attribute = ?", (at, name))
        hashing.rehash_attribute(self, name)

    def current_keys(self, attribute: str) -> list[tuple[str, str]]:
        """(scope, entity) pairs with more than one current role-'state' fact for ``attribute`` (pending conflicts)."""
        rows = self.run(
            "SELECT scope, entity FROM memories WHERE attribute = ? AND role = 'state' AND entity IS NOT NULL "
            "AND state != 'INVALIDATED' GROUP BY scope, entity HAVING COUNT(*) > 1 ORDER BY scope, entity",
            (attribute,),
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    def key_summary(self, keys: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], tuple[int, float]]:
        """For each (scope, entity, attribute): (number of current state facts, latest valid_from among them)."""
        keys = sorted(set(keys))
        out: dict[tuple[str, str, str], tuple[int, float]] = {}
        for start in range(0, len(keys), 300):
            chunk = keys[start : start + 300]
            cond = " OR ".join("(scope = ? AND entity = ? AND attribute = ?)" for _ in chunk)
            q = (
                "SELECT scope, entity, attribute, COUNT(*), MAX(valid_from) FROM memories WHERE role = 'state' "
                f"AND state != 'INVALIDATED' AND ({cond}) GROUP BY scope, entity, attribute"
            )
            for r in self.run(q, [v for k in chunk for v in k]):
                out[(r[0], r[1], r[2])] = (int(r[3]), float(r[4]))
        return out
