"""SQL that turns a current SQLite ledger back into the schema an older remem-agent wrote.

The upgrade tests undo the newest migrations with these statements on a raw connection, then reopen the store
and check that the migrations bring it back with its rows intact. Every such test undoes migrations 8 and 7
first (tests/test_key_index.py, test_lexical_store.py, test_scopes.py, test_gateway_responses.py), so their
undoing exists once, here, as in tests/_pg_downgrades.py for PostgreSQL.
"""

from __future__ import annotations

SQLITE_9_TO_8 = ["PRAGMA user_version = 8"]  # migration 9 changes nothing on SQLite (PostgreSQL's lexical postings)
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
