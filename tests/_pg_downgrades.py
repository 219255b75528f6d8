"""SQL that turns a current PostgreSQL ledger back into the schema an older remem-agent wrote.

The upgrade tests build a store with this version, undo the newest migrations with these statements (run
with ``search_path`` set to the ledger's schema), then reopen it and check that the migrations bring it back
with its rows intact (``downgrade`` runs them; one step, the version-9 hashes of credit rows, is Python). The
statements exist once, here, because two tests start from the same undoing of migrations 16 to 5:
tests/store/test_lexical_store.py (a version-4 store gains the lexical index) and
tests/store/test_postgres_store.py (a version-2 store upgrades through every later migration);
tests/store/test_key_index.py undoes migrations 16 to 7, tests/gateway/test_gateway_responses.py migrations 16
to 8, tests/store/test_lexical_parity.py migrations 16 to 9. A change to those migrations is then one edit here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from remem_agent.store import hashing

REHASH_CREDITS_V9 = "-- credit rows hashed as version 9 wrote them"  # done in Python by downgrade()
DOWNGRADE_16_TO_15 = [  # what migration 16 (each kind's contribution) added
    "DROP TABLE group_contribution",
    "DELETE FROM schema_migrations WHERE version = 16",
]
DOWNGRADE_15_TO_14 = [  # migration 16 undone first, then what migration 15 (exploratory serving's decisions) added
    *DOWNGRADE_16_TO_15,
    "DROP TABLE search_decisions",
    "DROP FUNCTION remem_decision_fixed()",
    "DELETE FROM schema_migrations WHERE version = 15",
]
DOWNGRADE_14_TO_13 = [  # migration 15 undone first, then what migration 14 (erasure) changed: the state CHECK
    # and the triggers' functions
    *DOWNGRADE_15_TO_14,
    "ALTER TABLE memories DROP CONSTRAINT memories_state_check",
    "ALTER TABLE memories ADD CONSTRAINT memories_state_check "
    "CHECK (state IN ('ACTIVE', 'LOW_VALUE', 'COMPRESSED', 'ARCHIVED', 'INVALIDATED'))",
    "CREATE OR REPLACE FUNCTION remem_immutable_memory() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.id IS DISTINCT FROM OLD.id OR NEW.original_text IS DISTINCT FROM OLD.original_text "
    "OR NEW.embedding IS DISTINCT FROM OLD.embedding THEN "
    "RAISE EXCEPTION 'id, original_text and embedding are immutable'; END IF; "
    "IF NEW.speaker IS DISTINCT FROM OLD.speaker OR NEW.session IS DISTINCT FROM OLD.session THEN "
    "RAISE EXCEPTION 'a memory''s speaker and session are immutable'; END IF; RETURN NEW; END $$",
    "DROP TRIGGER events_append_only_u ON events",
    "CREATE TRIGGER events_append_only_u BEFORE UPDATE ON events "
    "FOR EACH ROW EXECUTE FUNCTION remem_append_only_hashed()",
    "DROP FUNCTION remem_events_redactable()",
    "DELETE FROM schema_migrations WHERE version = 14",
]
DOWNGRADE_13_TO_12 = [  # migration 14 undone first, then what migration 13 (bounded growth) added
    *DOWNGRADE_14_TO_13,
    "DROP TABLE retrieval_base",
    "DROP INDEX searches_unjudged_at",
    "DROP INDEX pending_outcomes_created",
    "DELETE FROM schema_migrations WHERE version = 13",
]
DOWNGRADE_12_TO_11 = [  # migration 13 undone first, then what migration 12 (turns' context vectors) added
    *DOWNGRADE_13_TO_12,
    "DROP INDEX memories_turns",
    "DELETE FROM meta WHERE key = 'turn_context'",
    "DELETE FROM schema_migrations WHERE version = 12",
]
DOWNGRADE_11_TO_10 = [  # migration 12 undone first, then what migration 11 (the time mentions) added
    *DOWNGRADE_12_TO_11,
    "DROP TABLE memory_times",
    "DELETE FROM meta WHERE key = 'time_resolver'",
    "DELETE FROM schema_migrations WHERE version = 11",
]
DOWNGRADE_10_TO_9 = [  # migration 11 undone first, then what migration 10 (each judged exposure's expected uses) added
    *DOWNGRADE_11_TO_10,
    REHASH_CREDITS_V9,
    "ALTER TABLE credits DROP COLUMN expected, DROP COLUMN prior",
    "DROP TABLE prior_calibration",
    "ALTER TABLE stats DROP COLUMN expected_sum, DROP COLUMN expected_n",
    "DELETE FROM schema_migrations WHERE version = 10",
]
DOWNGRADE_9_TO_8 = [  # migration 10 undone first, then what migration 9 (the lexical postings) changed
    *DOWNGRADE_10_TO_9,
    "DROP TABLE memory_terms",
    "ALTER TABLE memories DROP COLUMN n_terms",
    "ALTER TABLE memories ADD COLUMN lexemes tsvector "
    "GENERATED ALWAYS AS (to_tsvector('english'::regconfig, left(text, 100000))) STORED",
    "CREATE INDEX memories_lexemes ON memories USING gin (lexemes)",
    "DELETE FROM schema_migrations WHERE version = 9",
]
DOWNGRADE_8_TO_7 = [  # migration 9 undone first, then what migration 8 (stored responses) added
    *DOWNGRADE_9_TO_8,
    "DROP TABLE responses",
    "DELETE FROM schema_migrations WHERE version = 8",
]
DOWNGRADE_7_TO_6 = [  # migration 8 undone first, then what migration 7 (valid_from in the key index) changed
    *DOWNGRADE_8_TO_7,
    "DROP INDEX memories_scope_key_valid_from",
    "CREATE INDEX memories_scope_key ON memories (scope, entity, attribute) "
    "WHERE entity IS NOT NULL AND attribute IS NOT NULL",
    "CREATE INDEX memories_key ON memories (entity, attribute) WHERE entity IS NOT NULL AND attribute IS NOT NULL",
    "DELETE FROM schema_migrations WHERE version = 7",
]
DOWNGRADE_6_TO_5 = [  # migration 7 undone first, then what migration 6 (the shared pending outcomes) added
    *DOWNGRADE_7_TO_6,
    "DROP TABLE pending_outcomes",
    "DELETE FROM schema_migrations WHERE version = 6",
]
DOWNGRADE_5_TO_4 = [  # from the latest schema: migrations 9 to 6 undone first, then what migration 5 added
    *DOWNGRADE_6_TO_5,
    # migration 5: speaker, session, the lexical column and its index; the memory trigger of version 4
    "DROP INDEX memories_lexemes",
    "ALTER TABLE memories DROP COLUMN lexemes, DROP COLUMN speaker, DROP COLUMN session",
    "CREATE OR REPLACE FUNCTION remem_immutable_memory() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.id IS DISTINCT FROM OLD.id OR NEW.original_text IS DISTINCT FROM OLD.original_text "
    "OR NEW.embedding IS DISTINCT FROM OLD.embedding THEN "
    "RAISE EXCEPTION 'id, original_text and embedding are immutable'; END IF; RETURN NEW; END $$",
    "DELETE FROM schema_migrations WHERE version = 5",
]


def downgrade(conn: Any, statements: Sequence[str]) -> None:
    """Run downgrade ``statements`` on a psycopg connection inside a transaction with ``search_path`` set to the
    ledger's schema; the credit rows are rehashed in Python (their hash without the expected uses)."""
    with conn.transaction():
        conn.execute("SET LOCAL search_path TO remem, public")
        for sql in statements:
            if sql != REHASH_CREDITS_V9:
                conn.execute(sql)
                continue
            rows = conn.execute(f"SELECT seq, {hashing.CREDIT_HASH_COLS_V3} FROM credits").fetchall()
            conn.execute("ALTER TABLE credits DISABLE TRIGGER credits_append_only_u")
            with conn.cursor() as cur:
                cur.executemany(
                    "UPDATE credits SET hash = %s WHERE seq = %s", [(hashing.credit_hash(*r[1:]), r[0]) for r in rows]
                )
            conn.execute("ALTER TABLE credits ENABLE TRIGGER credits_append_only_u")
