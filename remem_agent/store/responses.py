"""Stored responses, kept in the ledger (table ``responses``, schema version 8), for the gateway's Responses
protocol: a request that names ``previous_response_id`` continues that response's conversation.

A row keeps only what its own request added (its input items as chat messages, without its instructions,
which OpenAI's protocol does not carry over) and its reply as an assistant message, plus the id of the
response it continued. A conversation is the chain of rows from the newest back to the first, read in one
recursive query on both backends. A chain is only followed inside one scope: another scope's response id
is unknown, exactly like an id that never existed.

Retention: a row older than the retention is cleared (``items`` set to NULL by :func:`expire`, an UPDATE,
so a PostgreSQL role without DELETE can run it) and any chain through it ends there: its id, and the ids
of the responses that continued it, are then unknown. ``remem migrate`` does not copy this table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from remem_agent.store.sql import LedgerTx

MAX_CHAIN = 1_000  # responses followed back from one previous_response_id (a longer chain is refused)


def put(
    tx: LedgerTx,
    *,
    response_id: str,
    scope: str,
    parent_id: str | None,
    items: Sequence[dict[str, Any]],
    created_at: float,
) -> None:
    """Store one response: the chat messages its request added, then its reply."""
    tx.run(
        "INSERT INTO responses (response_id, scope, parent_id, items, created_at) VALUES (?,?,?,?,?)",
        (response_id, scope, parent_id, json.dumps(list(items), ensure_ascii=False), created_at),
    )


def conversation(tx: LedgerTx, response_id: str, *, scope: str, since: float) -> list[dict[str, Any]] | None:
    """The chat messages of the conversation that ``response_id`` ends, oldest first; None when the id is
    unknown, of another scope, older than ``since`` (expired), or continues one that is."""
    rows = tx.run(
        "WITH RECURSIVE chain(response_id, parent_id, items, created_at, depth) AS ("
        " SELECT response_id, parent_id, items, created_at, 0 FROM responses WHERE response_id = ? AND scope = ?"
        " UNION ALL"
        " SELECT r.response_id, r.parent_id, r.items, r.created_at, c.depth + 1 FROM responses r"
        " JOIN chain c ON r.response_id = c.parent_id WHERE r.scope = ? AND c.depth < ?"
        ") SELECT parent_id, items, created_at FROM chain ORDER BY depth DESC",
        (response_id, scope, scope, MAX_CHAIN),
    ).fetchall()
    if not rows or rows[0][0] is not None:  # unknown, or the chain does not reach its first response
        return None
    out: list[dict[str, Any]] = []
    for _, items, created_at in rows:
        if items is None or float(created_at) < since:
            return None
        out += json.loads(items)
    return out


def expire(tx: LedgerTx, *, before: float) -> int:
    """Clear the items of every response created before ``before``; how many were cleared."""
    cur = tx.run("UPDATE responses SET items = NULL WHERE items IS NOT NULL AND created_at < ?", (before,))
    return int(cur.rowcount or 0)
