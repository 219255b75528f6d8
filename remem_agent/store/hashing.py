"""Content hashes of ledger rows (schema version 3), the same on every backend.

Why: the database's constraints and triggers stop the library (and careless tools) from rewriting
history, but an edit made with the triggers dropped, a restored half-backup or a disk that flips bits
in a text column would still verify. Each row now carries a SHA-256 of its fields, computed by the
write that creates the row, in the same transaction; ``verify()`` recomputes them.

* ``memories.content_hash`` covers the fields that never change: id, original_text, entity, attribute,
  role, tasks, created_at, valid_from, and (schema 5, only when set) speaker and session. The mutable
  ones (text after compression, token_cost, confidence, valid_to, superseded_by, state) are not hashed
  on the row: every event records in ``events.updates`` the values it set (the ``add`` event all of
  them), and ``verify()`` checks that replaying the events gives the row's current values. So
  legitimate lifecycle changes keep verifying and an edit of served text or validity does not.
* ``events.hash`` covers memory_id, at, kind, from_state, to_state, reason, evidence and updates.
* ``searches.hash`` covers what a search recorded; ``searches.feedback_hash`` the feedback set once later.
* ``credits.hash`` covers a credit row; ``attributes.hash`` a learned-attribute row (rewritten with
  the row by each increment).

Values are hashed in a canonical JSON form (numbers as floats, keys sorted, -0.0 as 0.0), computed from the
values as read back, so a row copied between SQLite and PostgreSQL (jsonb reorders keys) keeps its hash.
Why -0.0 is folded: jsonb stores numbers as ``numeric``, which has no negative zero, so a served similarity
rounded to -0.0 read back as 0.0 and ``verify()`` reported the search record as edited (one of 2,000 searches
in a benchmark run). Rows hashed before the folding keep their hash: :func:`matches` also accepts it.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol


class LedgerTx(Protocol):
    """What the hashing steps need of a ledger transaction (``store.sql.LedgerTx`` has it; named
    structurally so that this module, which ``store.sql`` imports, does not import it back)."""

    def run(self, sql: str, args: Sequence[Any] = ()) -> Any: ...

    def update_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


# The mutable columns of a memory, as recorded in events.updates.
MUTABLE = ("text", "token_cost", "confidence", "valid_to", "superseded_by")


def _canon(value: Any) -> Any:
    """The backend-independent form of a field (every number a float, every mapping key a string).

    Exact type checks first: this runs over every served list of every search record, whose feature
    snapshots are plain lists of floats, so the common cases must not walk an isinstance chain.
    """
    t = type(value)
    if t is float or t is str or value is None or t is bool:
        return value
    if t is int:
        return float(value)
    if t is list or t is tuple:
        if all(type(v) is float for v in value):
            return list(value)
        return [_canon(v) for v in value]
    if t is dict:
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canon(v) for v in value]
    if hasattr(value, "item"):  # a numpy scalar
        return _canon(value.item())
    return str(value)


# The encoder ``json.dumps(..., sort_keys=True, ensure_ascii=False, separators=(",", ":"))`` builds on every
# call, built once (the same text; every add hashes two records, so the construction showed in profiles).
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# A negative zero as the encoder writes it (repr): "-0.0" not followed by more digits or an exponent.
_NEGATIVE_ZERO = re.compile(r"-0\.0(?![0-9eE])")
_SIGNED_ZEROS = contextvars.ContextVar("remem_hash_signed_zeros", default=False)


def digest(kind: str, *fields: Any) -> str:
    """SHA-256 (hex) of ``fields`` in canonical JSON, tagged with the row ``kind``."""
    return _digest_text(_CANONICAL_JSON.encode([kind, *[_canon(f) for f in fields]]))


def _digest_text(text: str) -> str:
    """SHA-256 (hex) of a canonical JSON text, negative zeros folded (see ``digest``)."""
    if "-0.0" in text and not _SIGNED_ZEROS.get():  # the substring test keeps the common case one scan
        text = _NEGATIVE_ZERO.sub("0.0", text)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@contextmanager
def _signed_zeros() -> Iterator[None]:
    """Hash as before negative zeros were folded (``-0.0`` kept as written)."""
    token = _SIGNED_ZEROS.set(True)
    try:
        yield
    finally:
        _SIGNED_ZEROS.reset(token)


def matches(stored: str | None, row_hash: Callable[..., str], *fields: Any) -> bool:
    """Whether ``stored`` is ``row_hash(*fields)`` as computed now, or as computed before -0.0 was folded
    (a SQLite row written then keeps "-0.0" in its JSON text and in its hash)."""
    if stored is None:
        return False
    if stored == row_hash(*fields):
        return True
    with _signed_zeros():
        return stored == row_hash(*fields)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def memory_hash(
    memory_id: str,
    original_text: str,
    entity: str | None,
    attribute: str | None,
    role: str,
    tasks: Any,
    created_at: float,
    valid_from: float,
    speaker: str | None = None,
    session: str | None = None,
) -> str:
    """The hash of a memory's immutable fields. ``speaker`` and ``session`` (schema 5) are hashed only
    when set, as one trailing mapping of the set ones, so every hash written before they existed (and
    every memory without them) keeps its value."""
    fields: list[Any] = [memory_id, original_text, entity, attribute, role, _json(tasks), created_at, valid_from]
    if speaker is not None or session is not None:
        fields.append({k: v for k, v in (("speaker", speaker), ("session", session)) if v is not None})
    return digest("memory", *fields)


def event_hash(
    memory_id: str,
    at: float,
    kind: str,
    from_state: str | None,
    to_state: str,
    reason: str,
    evidence: Any,
    updates: Any,
) -> str:
    ev = _json(evidence)
    up = None if updates is None else _json(updates)
    return digest("event", memory_id, at, kind, from_state, to_state, reason, ev, up)


# A served entry's rank in canonical JSON text (sorted keys, no spaces). Inside a JSON string every quote is
# escaped, so ``"rank":`` followed by digits can only be the key itself.
_RANK_VALUE = re.compile(r'"rank":(\d+)(?=[,}])')


def _plain_served(served: Sequence[Any]) -> bool:
    """Whether ``served`` is a search record's usual served list: mappings with string keys whose values are
    strings, floats, None, booleans or lists of floats, and a small non-negative int only under "rank"."""
    for entry in served:
        if type(entry) is not dict:
            return False
        for key, value in entry.items():
            t = type(value)
            if type(key) is not str:
                return False
            if t is float or t is str or t is bool or value is None:
                continue
            if t is int:
                if key != "rank" or not 0 <= value < 10**15:
                    return False
            elif t is not list or not all(type(v) is float for v in value):
                return False
    return True


def search_row(
    search_id: str,
    at: float,
    query: str,
    task: str | None,
    as_of: float | None,
    now: float | None,
    token_budget: int | None,
    served: Sequence[Any],
) -> tuple[str, str]:
    """The served list's JSON text as a search row stores it, and the row's hash (``search_hash``'s value).

    Why not ``json.dumps`` and ``search_hash``: that writes every float of the served feature snapshots
    twice (float formatting was most of the ~95 us the two took per search). Here the list is written once,
    in canonical form (sorted keys, no spaces: the same JSON value), and the hash's text is made from it: it
    differs from canonical-of-``_canon`` only in the ranks, ints that ``_canon`` makes floats ("rank":2 ->
    "rank":2.0, what ``repr(2.0)`` writes). A list of another shape is hashed the general way.
    """
    served_json = _CANONICAL_JSON.encode(served)
    if not _plain_served(served):
        return served_json, search_hash(search_id, at, query, task, as_of, now, token_budget, served)
    # ``digest("search", ...)``'s text: the other fields' canonical list with the served list's text spliced in
    head = _CANONICAL_JSON.encode(
        ["search", *[_canon(f) for f in (search_id, at, query, task, as_of, now, token_budget)]]
    )
    served_text = _RANK_VALUE.sub(r'"rank":\1.0', served_json)  # the ranks as ``_canon`` writes them
    return served_json, _digest_text(f"{head[:-1]},{served_text}]")


def search_hash(
    search_id: str,
    at: float,
    query: str,
    task: str | None,
    as_of: float | None,
    now: float | None,
    token_budget: int | None,
    served: Any,
) -> str:
    return digest("search", search_id, at, query, task, as_of, now, token_budget, _json(served))


def decision_hash(search_id: str, decision_text: str) -> str:
    """A search decision's hash (schema 15): over its id and its JSON text as stored (text on both backends)."""
    return digest("decision", search_id, decision_text)


def feedback_hash(search_id: str, feedback: Any, feedback_at: float | None) -> str:
    return digest("feedback", search_id, None if feedback is None else _json(feedback), feedback_at)


def credit_hash(
    search_id: str,
    memory_id: str,
    task: str | None,
    at: float,
    success: Any,
    cited: Any,
    used: Any,
    credit: float,
    blame: float,
    prior: float | None = None,
    expected: float | None = None,
) -> str:
    """A credit row's hash; ``prior`` and ``expected`` (schema 10) are hashed only when recorded, so a row
    written before them keeps its hash."""
    fields = (search_id, memory_id, task, at, int(success), int(cited), int(used), credit, blame)
    if prior is None and expected is None:
        return digest("credit", *fields)
    return digest("credit", *fields, prior, expected)


def attribute_hash(
    attribute: str, changes: int, confirmations: int, counter: int, single_valued: Any, decided_at: float | None
) -> str:
    return digest("attribute", attribute, changes, confirmations, counter, int(single_valued), decided_at)


# The columns memory_hash takes, in order. Migration 3's backfill runs before schema 5 added speaker and
# session, so it reads the first eight only (its rows have neither).
MEMORY_HASH_COLS_V3 = "id, original_text, entity, attribute, role, tasks, created_at, valid_from"
MEMORY_HASH_COLS = MEMORY_HASH_COLS_V3 + ", speaker, session"
MEMORY_HASH_WIDTH = MEMORY_HASH_COLS.count(",") + 1
EVENT_HASH_COLS = "memory_id, at, kind, from_state, to_state, reason, evidence, updates"
SEARCH_HASH_COLS = "search_id, at, query, task, as_of, now, token_budget, served"
# Migration 3's backfill runs before schema 10 added the exposure's prior and expected uses (its rows have none).
CREDIT_HASH_COLS_V3 = "search_id, memory_id, task, at, success, cited, used, credit, blame"
CREDIT_HASH_COLS = CREDIT_HASH_COLS_V3 + ", prior, expected"
ATTRIBUTE_HASH_COLS = "attribute, changes, confirmations, counter, single_valued, decided_at"


def rehash_attribute(tx: LedgerTx, name: str) -> None:
    """Recompute one attributes row's hash after it changed (same transaction)."""
    r = tx.run(f"SELECT {ATTRIBUTE_HASH_COLS} FROM attributes WHERE attribute = ?", (name,)).fetchone()
    if r is not None:
        tx.run("UPDATE attributes SET hash = ? WHERE attribute = ?", (attribute_hash(*r), name))


def backfill_hashes(tx: LedgerTx) -> None:
    """Migration 3's data step: hash every existing row (same transaction as the DDL, either backend).

    Events written before version 3 did not record the values they set, so the last event of each
    memory gets the row's current mutable values as its ``updates`` (true: nothing but events changes
    a row); from then on an edit of those columns is detected.
    """
    rows = tx.run(f"SELECT {MEMORY_HASH_COLS_V3} FROM memories WHERE content_hash IS NULL").fetchall()
    tx.update_many("UPDATE memories SET content_hash = ? WHERE id = ?", [(memory_hash(*r), r[0]) for r in rows])

    current = {
        str(r[0]): dict(zip(MUTABLE, r[1:], strict=True))
        for r in tx.run(f"SELECT id, {', '.join(MUTABLE)} FROM memories").fetchall()
    }
    last = {str(r[0]): int(r[1]) for r in tx.run("SELECT memory_id, MAX(seq) FROM events GROUP BY memory_id")}
    ev_rows = tx.run(f"SELECT seq, {EVENT_HASH_COLS} FROM events WHERE hash IS NULL ORDER BY seq").fetchall()
    out = []
    for seq, mid, at, kind, frm, to, reason, evidence, updates in ev_rows:
        if updates is None and last.get(mid) == seq and mid in current:
            updates = current[mid]
        up_json = None if updates is None else json.dumps(_json(updates), sort_keys=True)
        out.append((up_json, event_hash(mid, at, kind, frm, to, reason, evidence, updates), seq))
    tx.update_many("UPDATE events SET updates = ?, hash = ? WHERE seq = ?", out)

    rows = tx.run(f"SELECT {SEARCH_HASH_COLS}, feedback, feedback_at FROM searches WHERE hash IS NULL").fetchall()
    tx.update_many(
        "UPDATE searches SET hash = ?, feedback_hash = ? WHERE search_id = ?",
        [(search_hash(*r[:8]), None if r[8] is None else feedback_hash(r[0], r[8], r[9]), r[0]) for r in rows],
    )
    rows = tx.run(f"SELECT seq, {CREDIT_HASH_COLS_V3} FROM credits WHERE hash IS NULL").fetchall()
    tx.update_many("UPDATE credits SET hash = ? WHERE seq = ?", [(credit_hash(*r[1:]), r[0]) for r in rows])
    rows = tx.run(f"SELECT {ATTRIBUTE_HASH_COLS} FROM attributes").fetchall()
    tx.update_many("UPDATE attributes SET hash = ? WHERE attribute = ?", [(attribute_hash(*r), r[0]) for r in rows])
