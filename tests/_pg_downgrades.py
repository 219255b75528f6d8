"""SQL that turns a current PostgreSQL ledger back into the schema an older remem-agent wrote.

The upgrade tests build a store with this version, undo the newest migrations with these statements (run
with ``search_path`` set to the ledger's schema), then reopen it and check that the migrations bring it back
with its rows intact. The statements exist once, here, because two tests start from the same undoing of
migrations 9, 8, 7, 6 and 5: tests/test_lexical_store.py (a version-4 store gains the lexical index) and
tests/test_postgres_store.py (a version-2 store upgrades through every later migration); tests/test_key_index.py
undoes migrations 9, 8 and 7, tests/test_gateway_responses.py migrations 9 and 8, tests/test_lexical_parity.py
migration 9 alone. A change to those migrations is
then one edit here.
"""

from __future__ import annotations

DOWNGRADE_9_TO_8 = [  # what migration 9 (the lexical postings) changed: back to migration 5's tsvector
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
