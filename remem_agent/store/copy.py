"""``remem migrate``: copy a store with its full history into another backend (or folder).

The copy is row for row: memories with their sequence numbers, every event, search, credit row,
statistic and learned attribute, the retrieval counts of pruned searches, and the meta keys (embedder,
dimension, supersession mode). Nothing is recomputed, so the target's ``verify()`` checks the same history
the source recorded. The target must be empty; the source is only read (one consistent snapshot).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent.embedders import context
from remem_agent.embedders.base import Embedder, check_vectors
from remem_agent.errors import UserInputError
from remem_agent.store.base import Store, is_postgres_url
from remem_agent.store.factory import open_store
from remem_agent.store.sql import LedgerTx
from remem_agent.store.sql_rows import from_json

log = logging.getLogger("remem_agent.store.copy")

# Every ledger table with its columns, in dependency order: what `remem migrate` copies.
TABLES: dict[str, tuple[str, ...]] = {
    "meta": ("key", "value"),
    "memories": (
        "seq",
        "id",
        "text",
        "original_text",
        "entity",
        "attribute",
        "role",
        "tasks",
        "created_at",
        "valid_from",
        "valid_to",
        "superseded_by",
        "state",
        "token_cost",
        "confidence",
        "embedding",
        "content_hash",
        "scope",
        "speaker",
        "session",
    ),
    "events": ("seq", "memory_id", "at", "kind", "from_state", "to_state", "reason", "evidence", "updates", "hash"),
    "searches": (
        "search_id",
        "at",
        "query",
        "task",
        "as_of",
        "now",
        "token_budget",
        "served",
        "feedback",
        "feedback_at",
        "hash",
        "feedback_hash",
        "scope",
    ),
    "credits": (
        "seq",
        "search_id",
        "memory_id",
        "task",
        "at",
        "success",
        "cited",
        "used",
        "credit",
        "blame",
        "prior",
        "expected",
        "hash",
    ),
    "stats": (
        "memory_id",
        "task",
        "retrieved",
        "shown",
        "credited",
        "wasted",
        "blamed",
        "credit_sum",
        "blame_sum",
        "last_retrieved_at",
        "last_credited_at",
        "expected_sum",
        "expected_n",
    ),
    "attributes": ("attribute", "changes", "confirmations", "counter", "single_valued", "decided_at", "hash"),
    "prior_calibration": ("scope", "bin", "uses", "exposures"),
    "memory_times": ("memory_id", "lo", "hi", "grain", "expr"),
    "retrieval_base": ("memory_id", "task", "retrieved"),
    "search_decisions": ("search_id", "decision", "hash"),
    "group_contribution": ("scope", "role", "uses", "expected", "exposures"),
}
JSON_COLUMNS = frozenset(
    {
        ("memories", "tasks"),
        ("events", "evidence"),
        ("events", "updates"),
        ("searches", "served"),
        ("searches", "feedback"),
    }
)


def copy_store(
    source: str | Path,
    target: str | Path,
    *,
    batch: int = 2000,
    embedder: Embedder | None = None,
    turn_context: float | None = None,
) -> dict[str, Any]:
    """Copy ``source`` into the empty store ``target``; returns row counts and the target's verify result.

    With ``embedder`` (``remem reembed``) every memory's vector is computed anew from its original text by that
    embedder and the target records it as the store's embedder; everything else (ids, texts, every event,
    search, credit and statistic) is copied as it is, so the history and every ``as_of`` answer are kept.
    The target's meta key ``reembedded_from`` names the embedder (and dimension) the source was built with.
    Conversation turns' vectors lean on the turn before them (``embedders/context.py``) by ``turn_context``
    (default: the source's weight), recomputed in ledger order; the target records the weight.
    """
    if turn_context is not None:
        turn_context = context.check_weight(turn_context)
        if embedder is None:
            raise UserInputError("turn_context changes vectors: it needs an embedder (remem reembed)")
    if not is_postgres_url(source):
        source = Path(source).expanduser()
    if not is_postgres_url(target):
        target = Path(target).expanduser()
    if str(source) == str(target):
        raise UserInputError("source and target are the same store")
    src: Store = open_store(source, create=False)
    try:
        dim_text = src.get_meta("dim")
        if dim_text is None:
            raise UserInputError(f"{src.location} has no embedder dimension recorded: open it with ReMem once first")
        dim = int(dim_text)
        vectors: _Reembed | None = None
        if embedder is not None:
            weight = context.parse_weight(src.get_meta(context.META_KEY)) if turn_context is None else turn_context
            vectors = _Reembed(embedder, src.get_meta("embedder") or "", dim, weight)
            dim = vectors.dim
        dst: Store = open_store(target)
        try:
            with dst.read() as tx:
                if tx.max_seq() or tx.search_counts()[0] or tx.get_meta("dim") is not None:
                    raise UserInputError(f"target {dst.location} is not empty; migrate into a new store")
            copied = _copy_rows(src, dst, batch, vectors)
            dst.bind_dimension(dim)  # after the bulk load: building the HNSW index once is faster
            problems = dst.verify(dim)
        finally:
            dst.close()
    finally:
        src.close()
    report = {
        "source": str(src.location),
        "target": str(dst.location),
        "rows": copied,
        "verify_ok": not problems,
        "problems": problems[:20],
    }
    log.info("migrated %s -> %s: %s", src.location, dst.location, copied)
    return report


def export_rows(tx: LedgerTx, table: str, batch: int = 2000) -> Iterator[list[tuple[Any, ...]]]:
    """Every row of ``table`` read through ``tx`` as portable Python values (JSON decoded, embeddings as arrays)."""
    cols = TABLES[table]
    order = {
        "meta": "key",
        "searches": tx.search_order,
        "stats": "memory_id, task",
        "attributes": "attribute",
        "prior_calibration": "scope, bin",
        "memory_times": "memory_id, lo, hi",
        "retrieval_base": "memory_id, task",
        "search_decisions": "search_id",
        "group_contribution": "scope, role",
    }
    cur = tx.run(f"SELECT {', '.join(cols)} FROM {table} ORDER BY {order.get(table, 'seq')}")
    json_idx = [i for i, c in enumerate(cols) if (table, c) in JSON_COLUMNS]
    vec_idx = cols.index("embedding") if table == "memories" else -1
    while True:
        rows = cur.fetchmany(batch)
        if not rows:
            return
        out = []
        for r in rows:
            vals = list(r)
            for i in json_idx:
                vals[i] = None if vals[i] is None else from_json(vals[i])
            if vec_idx >= 0:
                vals[vec_idx] = tx.load_vector(vals[vec_idx])
            out.append(tuple(vals))
        yield out


def import_rows(tx: LedgerTx, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """Insert rows produced by ``export_rows`` (of any backend) verbatim, history included."""
    cols = TABLES[table]
    json_idx = [i for i, c in enumerate(cols) if (table, c) in JSON_COLUMNS]
    vec_idx = cols.index("embedding") if table == "memories" else -1
    enc = []
    for r in rows:
        vals = list(r)
        for i in json_idx:
            vals[i] = None if vals[i] is None else json.dumps(vals[i])
        if vec_idx >= 0:
            vals[vec_idx] = tx.dump_vector(np.asarray(vals[vec_idx], dtype=np.float32))
        enc.append(tuple(vals))
    if enc:
        # a new store already holds the meta keys its migrations write (time_resolver): the source's value wins
        upsert = " ON CONFLICT (key) DO UPDATE SET value = excluded.value" if table == "meta" else ""
        tx.run_many(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({','.join('?' * len(cols))}){upsert}", enc)


class _Reembed:
    """What ``remem reembed`` changes in the copied rows: each memory's vector, and the embedder meta keys."""

    def __init__(self, embedder: Embedder, source_name: str, source_dim: int, turn_context: float = 0.0) -> None:
        self.embedder = embedder
        self.dim = int(embedder.dim)
        self.provenance = json.dumps({"embedder": source_name, "dim": source_dim})
        self.turn_context = turn_context
        self.last_turns: dict[context.TurnKey, NDArray[np.floating]] = {}  # across batches, in ledger order

    def meta(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        new = {
            "embedder": self.embedder.name,
            "dim": str(self.dim),
            "reembedded_from": self.provenance,
            context.META_KEY: str(self.turn_context),
        }
        kept = [r for r in rows if r[0] not in new]
        return kept + sorted(new.items())

    def memories(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        cols = TABLES["memories"]
        text_i, vec_i = cols.index("original_text"), cols.index("embedding")
        texts = [r[text_i] for r in rows]
        vecs = check_vectors(self.embedder.embed(texts), len(texts), self.dim, source=self.embedder.name)
        if self.turn_context:
            at = {name: cols.index(name) for name in ("scope", "role", "speaker", "session")}
            keys = [context.turn_key(r[at["scope"]], r[at["role"]], r[at["speaker"]], r[at["session"]]) for r in rows]
            vecs = context.chain_vectors(keys, vecs, self.turn_context, self.last_turns)
        return [(*r[:vec_i], vecs[i], *r[vec_i + 1 :]) for i, r in enumerate(rows)]


def _copy_rows(src: Store, dst: Store, batch: int, vectors: _Reembed | None = None) -> dict[str, int]:
    copied: dict[str, int] = {}

    def load(tx: Any) -> None:
        copied.clear()  # a retried transaction starts over
        with src.read() as stx:  # one snapshot of the source for every table
            for table in TABLES:
                n = 0
                for rows in export_rows(stx, table, batch):
                    if vectors is not None and table == "meta":
                        rows = vectors.meta(rows)
                    elif vectors is not None and table == "memories":
                        rows = vectors.memories(rows)
                    import_rows(tx, table, rows)
                    n += len(rows)
                copied[table] = n
        tx.after_import()

    dst.transact(load)
    return copied
