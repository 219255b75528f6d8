"""SQL that turns a current SQLite ledger back into the schema an older remem-agent wrote.

The upgrade tests undo the newest migrations with these statements on a raw connection, then reopen the store
and check that the migrations bring it back with its rows intact. Every such test undoes migrations 16 to 7
first (tests/store/test_key_index.py, test_lexical_store.py, test_scopes.py, test_gateway_responses.py), so their
undoing exists once, here, as in tests/_pg_downgrades.py for PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from remem_agent.store import hashing

# migration 3's trigger on credits, recreated after the rehash below
_CREDITS_TRIGGER = (
    "CREATE TRIGGER credits_append_only_u BEFORE UPDATE ON credits "
    "WHEN OLD.hash IS NOT NULL OR NEW.seq IS NOT OLD.seq OR NEW.search_id IS NOT OLD.search_id "
    "OR NEW.memory_id IS NOT OLD.memory_id OR NEW.task IS NOT OLD.task OR NEW.at IS NOT OLD.at "
    "OR NEW.success IS NOT OLD.success OR NEW.cited IS NOT OLD.cited OR NEW.used IS NOT OLD.used "
    "OR NEW.credit IS NOT OLD.credit OR NEW.blame IS NOT OLD.blame "
    "BEGIN SELECT RAISE(ABORT, 'credits are append-only'); END"
)
SQLITE_16_TO_15 = [  # what migration 16 (each kind's contribution) added
    "DROP TABLE group_contribution",
    "PRAGMA user_version = 15",
]
SQLITE_15_TO_14 = [  # migration 16 undone first, then what migration 15 (exploratory serving's decisions) added
    *SQLITE_16_TO_15,
    "DROP TRIGGER search_decisions_fixed",
    "DROP TABLE search_decisions",
    "PRAGMA user_version = 14",
]
SQLITE_14_TO_13 = [  # migration 15 undone first, then what migration 14 (erasure) changed: its triggers. The
    # state CHECK keeps admitting 'ERASED' (SQLite edits a CHECK only through writable_schema; migration 14 leaves
    # an admitting one as it is).
    *SQLITE_15_TO_14,
    "DROP TRIGGER memories_erased_final",
    "DROP TRIGGER memories_embedding_fixed",
    "CREATE TRIGGER memories_embedding_fixed BEFORE UPDATE OF embedding, id, original_text ON memories "
    "BEGIN SELECT RAISE(ABORT, 'id, original_text and embedding are immutable'); END",
    "DROP TRIGGER memories_conversation_fixed",
    "CREATE TRIGGER memories_conversation_fixed BEFORE UPDATE OF speaker, session ON memories "
    "BEGIN SELECT RAISE(ABORT, 'a memory''s speaker and session are immutable'); END",
    "DROP TRIGGER events_append_only_u",
    "CREATE TRIGGER events_append_only_u BEFORE UPDATE ON events "
    "WHEN OLD.hash IS NOT NULL OR NEW.seq IS NOT OLD.seq OR NEW.memory_id IS NOT OLD.memory_id "
    "OR NEW.at IS NOT OLD.at OR NEW.kind IS NOT OLD.kind OR NEW.from_state IS NOT OLD.from_state "
    "OR NEW.to_state IS NOT OLD.to_state OR NEW.reason IS NOT OLD.reason OR NEW.evidence IS NOT OLD.evidence "
    "BEGIN SELECT RAISE(ABORT, 'events are append-only'); END",
    "PRAGMA user_version = 13",
]
SQLITE_13_TO_12 = [  # migration 14 undone first, then what migration 13 (bounded growth) added
    *SQLITE_14_TO_13,
    "DROP TABLE retrieval_base",
    "DROP INDEX searches_unjudged_at",
    "DROP INDEX pending_outcomes_created",
    "PRAGMA user_version = 12",
]
SQLITE_12_TO_11 = [  # migration 13 undone first, then what migration 12 (conversation turns' context vectors) added
    *SQLITE_13_TO_12,
    "DROP INDEX memories_turns",
    "DELETE FROM meta WHERE key = 'turn_context'",
    "PRAGMA user_version = 11",
]
SQLITE_11_TO_10 = [  # migration 12 undone first, then what migration 11 (the time mentions) added
    *SQLITE_12_TO_11,
    "DROP TABLE memory_times",
    "DELETE FROM meta WHERE key = 'time_resolver'",
    "PRAGMA user_version = 10",
]
SQLITE_10_TO_9 = [  # migration 11 undone first, then what migration 10 (each judged exposure's expected uses) added
    *SQLITE_11_TO_10,
    # credit rows hashed as version 9 wrote them (without the expected uses): see downgrade()
    "DROP TRIGGER credits_append_only_u",
    f"UPDATE credits SET hash = remem_credit_hash_v9({hashing.CREDIT_HASH_COLS_V3})",
    _CREDITS_TRIGGER,
    "ALTER TABLE credits DROP COLUMN expected",
    "ALTER TABLE credits DROP COLUMN prior",
    "DROP TABLE prior_calibration",
    "ALTER TABLE stats DROP COLUMN expected_sum",
    "ALTER TABLE stats DROP COLUMN expected_n",
    "PRAGMA user_version = 9",
]
# migration 10 undone first; migration 9 changes nothing on SQLite (PostgreSQL's lexical postings)
SQLITE_9_TO_8 = [*SQLITE_10_TO_9, "PRAGMA user_version = 8"]
# migration 9 undone first, then what migration 8 (stored responses) added
SQLITE_8_TO_7 = [*SQLITE_9_TO_8, "DROP TABLE responses", "PRAGMA user_version = 7"]
SQLITE_7_TO_6 = [  # migration 8 undone first, then what migration 7 (valid_from in the key index) changed
    *SQLITE_8_TO_7,
    "DROP INDEX memories_scope_key_valid_from",
    "CREATE INDEX memories_scope_key ON memories (scope, entity, attribute) "
    "WHERE entity IS NOT NULL AND attribute IS NOT NULL",
    "CREATE INDEX memories_key ON memories (entity, attribute) WHERE entity IS NOT NULL AND attribute IS NOT NULL",
    "PRAGMA user_version = 6",
]


def downgrade(conn: sqlite3.Connection, statements: Sequence[str]) -> None:
    """Run downgrade ``statements`` on a raw connection (with the version-9 credit hash they call) and commit."""
    conn.create_function("remem_credit_hash_v9", 9, hashing.credit_hash, deterministic=True)
    for sql in statements:
        conn.execute(sql)
    conn.commit()
