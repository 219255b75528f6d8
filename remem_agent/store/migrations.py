"""Numbered schema migrations of the SQLite ledger.

Migration N brings a store from ``user_version`` N-1 to N inside one transaction. Never edit a
released migration; append a new one. A store whose version is higher than ``LATEST`` was written
by a newer remem-agent and is refused (SchemaVersionError) rather than misread. A migration may
have a Python data step (:data:`BACKFILLS`, on both backends), run after its SQL in the same transaction, and
a SQLite step run before its SQL (:data:`SQLITE_FIRST_STEPS`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

from remem_agent.errors import StoreError
from remem_agent.store import hashing, times

if TYPE_CHECKING:
    from remem_agent.store.sql import LedgerTx

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );

        CREATE TABLE memories (
            seq           INTEGER PRIMARY KEY AUTOINCREMENT,
            id            TEXT NOT NULL UNIQUE,
            text          TEXT NOT NULL,
            original_text TEXT NOT NULL,
            entity        TEXT,
            attribute     TEXT,
            role          TEXT NOT NULL CHECK (role IN ('state', 'preference', 'note')),
            tasks         TEXT NOT NULL DEFAULT '[]',
            created_at    REAL NOT NULL,
            valid_from    REAL NOT NULL,
            valid_to      REAL,
            superseded_by TEXT,
            state         TEXT NOT NULL
                          CHECK (state IN ('ACTIVE', 'LOW_VALUE', 'COMPRESSED', 'ARCHIVED', 'INVALIDATED')),
            token_cost    INTEGER NOT NULL CHECK (token_cost >= 0),
            confidence    REAL NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
            embedding     BLOB NOT NULL
        );
        CREATE INDEX memories_key ON memories (entity, attribute)
            WHERE entity IS NOT NULL AND attribute IS NOT NULL;
        CREATE INDEX memories_state ON memories (state);

        -- Append-only: every state change and every other logged fact about a memory.
        CREATE TABLE events (
            seq        INTEGER PRIMARY KEY AUTOINCREMENT,
            memory_id  TEXT NOT NULL REFERENCES memories (id),
            at         REAL NOT NULL,
            kind       TEXT NOT NULL,
            from_state TEXT,
            to_state   TEXT NOT NULL,
            reason     TEXT NOT NULL,
            evidence   TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX events_memory ON events (memory_id, seq);

        CREATE TABLE searches (
            search_id    TEXT PRIMARY KEY,
            at           REAL NOT NULL,
            query        TEXT NOT NULL,
            task         TEXT,
            as_of        REAL,
            now          REAL,
            token_budget INTEGER,
            served       TEXT NOT NULL,
            feedback     TEXT,
            feedback_at  REAL
        );

        -- Append-only: what each feedback attributed to each served memory.
        CREATE TABLE credits (
            seq       INTEGER PRIMARY KEY AUTOINCREMENT,
            search_id TEXT NOT NULL REFERENCES searches (search_id),
            memory_id TEXT NOT NULL REFERENCES memories (id),
            task      TEXT,
            at        REAL NOT NULL,
            success   INTEGER NOT NULL,
            cited     INTEGER NOT NULL,
            used      INTEGER NOT NULL,
            credit    REAL NOT NULL,
            blame     REAL NOT NULL
        );
        CREATE INDEX credits_memory ON credits (memory_id, seq);
        CREATE INDEX credits_search ON credits (search_id);

        -- Aggregates of credits (and of retrievals), per memory and task class ('*' = all).
        CREATE TABLE stats (
            memory_id         TEXT NOT NULL REFERENCES memories (id),
            task              TEXT NOT NULL,
            retrieved         INTEGER NOT NULL DEFAULT 0,
            shown             INTEGER NOT NULL DEFAULT 0,
            credited          INTEGER NOT NULL DEFAULT 0,
            wasted            INTEGER NOT NULL DEFAULT 0,
            blamed            INTEGER NOT NULL DEFAULT 0,
            credit_sum        REAL NOT NULL DEFAULT 0,
            blame_sum         REAL NOT NULL DEFAULT 0,
            last_retrieved_at REAL,
            last_credited_at  REAL,
            PRIMARY KEY (memory_id, task)
        ) WITHOUT ROWID;

        CREATE TRIGGER events_append_only_u BEFORE UPDATE ON events
            BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
        CREATE TRIGGER events_append_only_d BEFORE DELETE ON events
            BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
        CREATE TRIGGER credits_append_only_u BEFORE UPDATE ON credits
            BEGIN SELECT RAISE(ABORT, 'credits are append-only'); END;
        CREATE TRIGGER credits_append_only_d BEFORE DELETE ON credits
            BEGIN SELECT RAISE(ABORT, 'credits are append-only'); END;
        CREATE TRIGGER memories_never_deleted BEFORE DELETE ON memories
            BEGIN SELECT RAISE(ABORT, 'memories are never deleted'); END;
        CREATE TRIGGER memories_embedding_fixed BEFORE UPDATE OF embedding, id, original_text ON memories
            BEGIN SELECT RAISE(ABORT, 'id, original_text and embedding are immutable'); END;
        """,
    ),
    (
        2,
        """
        -- What the ledger has learned about attributes: how often their values changed (drives
        -- confidence decay) and the evidence that they are single-valued (the learned schema).
        CREATE TABLE attributes (
            attribute     TEXT PRIMARY KEY,
            changes       INTEGER NOT NULL DEFAULT 0,
            confirmations INTEGER NOT NULL DEFAULT 0,
            counter       INTEGER NOT NULL DEFAULT 0,
            single_valued INTEGER NOT NULL DEFAULT 0,
            decided_at    REAL
        );
        """,
    ),
    (
        3,
        """
        -- Content hashes (see store/hashing.py): rows carry a SHA-256 of their fields, written by the
        -- transaction that writes the row; events record the mutable memory columns they set. Rows of
        -- older stores are hashed by the migration's Python step (hashing.backfill_hashes).
        ALTER TABLE memories ADD COLUMN content_hash TEXT;
        ALTER TABLE events ADD COLUMN updates TEXT;
        ALTER TABLE events ADD COLUMN hash TEXT;
        ALTER TABLE searches ADD COLUMN hash TEXT;
        ALTER TABLE searches ADD COLUMN feedback_hash TEXT;
        ALTER TABLE credits ADD COLUMN hash TEXT;
        ALTER TABLE attributes ADD COLUMN hash TEXT;

        -- Still append-only, except that a row without a hash (written before version 3) may get its
        -- hash (and an event its updates) once, with every other column unchanged.
        DROP TRIGGER events_append_only_u;
        CREATE TRIGGER events_append_only_u BEFORE UPDATE ON events
            WHEN OLD.hash IS NOT NULL OR NEW.seq IS NOT OLD.seq OR NEW.memory_id IS NOT OLD.memory_id
                OR NEW.at IS NOT OLD.at OR NEW.kind IS NOT OLD.kind OR NEW.from_state IS NOT OLD.from_state
                OR NEW.to_state IS NOT OLD.to_state OR NEW.reason IS NOT OLD.reason
                OR NEW.evidence IS NOT OLD.evidence
            BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
        DROP TRIGGER credits_append_only_u;
        CREATE TRIGGER credits_append_only_u BEFORE UPDATE ON credits
            WHEN OLD.hash IS NOT NULL OR NEW.seq IS NOT OLD.seq OR NEW.search_id IS NOT OLD.search_id
                OR NEW.memory_id IS NOT OLD.memory_id OR NEW.task IS NOT OLD.task OR NEW.at IS NOT OLD.at
                OR NEW.success IS NOT OLD.success OR NEW.cited IS NOT OLD.cited OR NEW.used IS NOT OLD.used
                OR NEW.credit IS NOT OLD.credit OR NEW.blame IS NOT OLD.blame
            BEGIN SELECT RAISE(ABORT, 'credits are append-only'); END;
        """,
    ),
    (
        4,
        """
        -- Scopes (user / agent / run): a memory and a search belong to one scope; existing rows move into
        -- the default scope. A search reads its scope (and, when configured, the shared one); keys,
        -- supersession and statistics are per scope. A row's scope never changes.
        ALTER TABLE memories ADD COLUMN scope TEXT NOT NULL DEFAULT 'default';
        ALTER TABLE searches ADD COLUMN scope TEXT NOT NULL DEFAULT 'default';
        CREATE INDEX memories_scope_key ON memories (scope, entity, attribute)
            WHERE entity IS NOT NULL AND attribute IS NOT NULL;
        CREATE INDEX memories_scope ON memories (scope, seq);
        CREATE TRIGGER memories_scope_fixed BEFORE UPDATE OF scope ON memories
            BEGIN SELECT RAISE(ABORT, 'a memory''s scope is immutable'); END;
        CREATE TRIGGER searches_scope_fixed BEFORE UPDATE OF scope ON searches
            BEGIN SELECT RAISE(ABORT, 'a search''s scope is immutable'); END;
        """,
    ),
    (
        5,
        """
        -- Conversations and the lexical channel. A memory may name who said it and in which
        -- session (both immutable, hashed only when set, so every older hash stays valid).
        ALTER TABLE memories ADD COLUMN speaker TEXT;
        ALTER TABLE memories ADD COLUMN session TEXT;
        CREATE TRIGGER memories_conversation_fixed BEFORE UPDATE OF speaker, session ON memories
            BEGIN SELECT RAISE(ABORT, 'a memory''s speaker and session are immutable'); END;

        -- Full-text index of the served text: FTS5 with external content (content = memories,
        -- rowid = memories.seq), so the text is stored once and bm25() reads the index alone. Kept in
        -- the same transaction as every write by triggers: an insert indexes the row, an update of
        -- text replaces its entry (rows are never deleted). 'rebuild' indexes the existing rows.
        CREATE VIRTUAL TABLE memories_fts USING fts5(
            text, content = 'memories', content_rowid = 'seq', tokenize = 'porter unicode61 remove_diacritics 2'
        );
        INSERT INTO memories_fts (memories_fts) VALUES ('rebuild');
        CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories
            BEGIN INSERT INTO memories_fts (rowid, text) VALUES (NEW.seq, NEW.text); END;
        CREATE TRIGGER memories_fts_update AFTER UPDATE OF text ON memories
            BEGIN
                INSERT INTO memories_fts (memories_fts, rowid, text) VALUES ('delete', OLD.seq, OLD.text);
                INSERT INTO memories_fts (rowid, text) VALUES (NEW.seq, NEW.text);
            END;
        """,
    ),
    (
        6,
        """
        -- Answers waiting for their outcome (store/pending.py), shared by every process serving the store:
        -- the next turn of a conversation, or its feedback, may reach another process than the one that
        -- answered. A row is claimed once (claimed_at set under WHERE claimed_at IS NULL) by whichever verdict
        -- comes first, and released again only if the ledger refused that verdict. Rows are never deleted.
        CREATE TABLE pending_outcomes (
            seq        INTEGER PRIMARY KEY AUTOINCREMENT,
            answer_id  TEXT NOT NULL UNIQUE,
            scope      TEXT NOT NULL,
            thread     TEXT NOT NULL,
            turn       TEXT NOT NULL,
            search_id  TEXT NOT NULL,
            served_ids TEXT NOT NULL,
            cited_ids  TEXT NOT NULL,
            used_ids   TEXT NOT NULL,
            value      TEXT,
            created_at REAL NOT NULL,
            claimed_at REAL,
            claimed_by TEXT
        );
        CREATE INDEX pending_outcomes_thread ON pending_outcomes (thread, seq);
        CREATE INDEX pending_outcomes_waiting ON pending_outcomes (seq) WHERE claimed_at IS NULL;
        """,
    ),
    (
        7,
        """
        -- The key index gains valid_from: re-add detection (sql.CLAIMS_AT: one key, role and
        -- valid_from) seeks straight to the claims stated at that time instead of reading every row of the
        -- key, and the reads of a whole key (equality on its first three columns) get their rows already in
        -- ORDER BY valid_from, seq order. It replaces the index of migration 4, whose columns are its prefix,
        -- and schema 1's memories_key (entity, attribute), which no query used once every key read named its
        -- scope (migration 4): an insert of a keyed memory maintains one key index, not three (about 9% less
        -- CPU per add at 100k memories, measured when it landed).
        DROP INDEX memories_scope_key;
        DROP INDEX memories_key;
        CREATE INDEX memories_scope_key_valid_from ON memories (scope, entity, attribute, valid_from)
            WHERE entity IS NOT NULL AND attribute IS NOT NULL;
        """,
    ),
    (
        8,
        """
        -- Stored responses of the gateway's Responses protocol (store/responses.py): a request naming a
        -- previous_response_id continues that response's conversation. A row keeps only what its request
        -- added (input items as chat messages, without its instructions) and its reply, with a pointer to its
        -- parent; the conversation is the chain of rows. Past the retention, a row's items are cleared
        -- (UPDATE, so no DELETE grant is needed) and the chain through it ends: its id is then unknown.
        CREATE TABLE responses (
            response_id TEXT PRIMARY KEY,
            scope       TEXT NOT NULL,
            parent_id   TEXT,
            items       TEXT,
            created_at  REAL NOT NULL
        );
        CREATE INDEX responses_live ON responses (created_at) WHERE items IS NOT NULL;
        """,
    ),
    (
        9,
        """
        -- PostgreSQL only: its lexical index becomes the postings of this ledger's FTS5 tokenizer
        -- (pg_migrations.py), so that both backends rank alike. The FTS5 index of migration 5 already holds
        -- them here; the number is kept so that schema versions compare across backends.
        """,
    ),
    (
        10,
        """
        -- Each judged exposure's relevance prior and expected uses (ranking/utility.py ContributionUtility):
        -- prior is the served memory's relevance prior at the search, recomputed at feedback from the search's
        -- feature snapshot; expected is that prior as the store's calibration rated it then. The credit row
        -- keeps both, so verify() can replay the aggregates: the stats sum expected, so a memory's
        -- contribution factor compares its uses with what its own exposures promised rather than with
        -- today's prior times the count, and prior_calibration sums, per scope and bin of the prior (0.1
        -- wide), the credit (capped at 1) and the exposures. Rows written before are NULL / 0: the utility
        -- uses the current prior for the exposures expected_n does not cover.
        ALTER TABLE credits ADD COLUMN prior REAL CHECK (prior IS NULL OR (prior >= 0 AND prior <= 1));
        ALTER TABLE credits ADD COLUMN expected REAL CHECK (expected IS NULL OR (expected >= 0 AND expected <= 1));
        ALTER TABLE stats ADD COLUMN expected_sum REAL NOT NULL DEFAULT 0;
        ALTER TABLE stats ADD COLUMN expected_n INTEGER NOT NULL DEFAULT 0;
        CREATE TABLE prior_calibration (
            scope     TEXT NOT NULL,
            bin       INTEGER NOT NULL CHECK (bin >= 0 AND bin < 10),
            uses      REAL NOT NULL DEFAULT 0,
            exposures INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (scope, bin)
        ) WITHOUT ROWID;
        """,
    ),
    (
        11,
        """
        -- The times each memory's text speaks of (remem_agent/temporal.py): "yesterday" in a turn said on 8 May
        -- 2023 is [7 May, 8 May). One row per distinct range, lo inclusive and hi exclusive (epoch seconds,
        -- UTC days), resolved from original_text against valid_from when the memory is inserted. The rows are
        -- derived from those two immutable columns, as the lexical index is from the text: verify() resolves
        -- again and compares, and a store opened by another resolver version (meta time_resolver) is
        -- re-resolved (store/times.py). The migration's data step resolves the memories already stored.
        CREATE TABLE memory_times (
            memory_id TEXT NOT NULL REFERENCES memories (id),
            lo        REAL NOT NULL,
            hi        REAL NOT NULL CHECK (hi > lo),
            grain     TEXT NOT NULL CHECK (grain IN ('day', 'week', 'weekend', 'month', 'year')),
            expr      TEXT NOT NULL,
            PRIMARY KEY (memory_id, lo, hi)
        ) WITHOUT ROWID;
        CREATE INDEX memory_times_lo ON memory_times (lo);
        """,
    ),
    (
        12,
        """
        -- A conversation turn's vector leans toward the turn before it in its scope and session
        -- (remem_agent/embedders/context.py): an add reads that turn's vector through this index. A store
        -- that already holds conversation turns built their vectors without context: it records turn_context 0
        -- and keeps it until ``remem reembed --turn-context`` moves it. Any other store records the configured
        -- weight when ReMem first opens it.
        CREATE INDEX memories_turns ON memories (scope, session, seq) WHERE session IS NOT NULL;
        INSERT INTO meta (key, value) SELECT 'turn_context', '0' WHERE EXISTS (
            SELECT 1 FROM memories WHERE role = 'note' AND speaker IS NOT NULL AND session IS NOT NULL
        );
        """,
    ),
    (
        13,
        """
        -- Bounded growth (remem_agent/store/pruning.py): searches that never got a verdict are pruned once
        -- older than the retention window, and settled or expired waiting answers with them. What a pruned
        -- search fed is kept here: how often it served each memory, per task class, so that stats.retrieved
        -- still equals what the searches served (verify() adds these counts). The two indexes find what is old.
        CREATE TABLE retrieval_base (
            memory_id TEXT NOT NULL REFERENCES memories (id),
            task      TEXT NOT NULL,
            retrieved INTEGER NOT NULL CHECK (retrieved > 0),
            PRIMARY KEY (memory_id, task)
        ) WITHOUT ROWID;
        CREATE INDEX searches_unjudged_at ON searches (at) WHERE feedback IS NULL;
        CREATE INDEX pending_outcomes_created ON pending_outcomes (created_at);
        """,
    ),
    (
        14,
        """
        -- Erasure (remem_agent/store/erasure.py): a memory may be erased on request. Its row stays, redacted
        -- (empty text, zero vector, no key, speaker or session; state ERASED, which the migration's first step
        -- adds to the state CHECK), and its events stay with their reasons, evidence and recorded text redacted
        -- and their hashes recomputed over the redacted record. The triggers allow exactly that: the immutable
        -- columns of a memory may change only in the update that erases it, an erased row never changes again,
        -- and an event's reason, evidence, updates and hash may be rewritten only when it belongs to an erased
        -- memory or names one as its replacement ("by"); its memory, time, kind and states never.
        DROP TRIGGER memories_embedding_fixed;
        CREATE TRIGGER memories_embedding_fixed BEFORE UPDATE OF embedding, id, original_text ON memories
            WHEN NEW.state IS NOT 'ERASED' OR NEW.id IS NOT OLD.id
            BEGIN SELECT RAISE(ABORT, 'id, original_text and embedding are immutable'); END;
        DROP TRIGGER memories_conversation_fixed;
        CREATE TRIGGER memories_conversation_fixed BEFORE UPDATE OF speaker, session ON memories
            WHEN NEW.state IS NOT 'ERASED'
            BEGIN SELECT RAISE(ABORT, 'a memory''s speaker and session are immutable'); END;
        CREATE TRIGGER memories_erased_final BEFORE UPDATE ON memories WHEN OLD.state = 'ERASED'
            BEGIN SELECT RAISE(ABORT, 'an erased memory never changes'); END;
        DROP TRIGGER events_append_only_u;
        CREATE TRIGGER events_append_only_u BEFORE UPDATE ON events
            WHEN NEW.seq IS NOT OLD.seq OR NEW.memory_id IS NOT OLD.memory_id OR NEW.at IS NOT OLD.at
                OR NEW.kind IS NOT OLD.kind OR NEW.from_state IS NOT OLD.from_state
                OR NEW.to_state IS NOT OLD.to_state
                OR NOT (
                    (OLD.hash IS NULL AND NEW.reason IS OLD.reason AND NEW.evidence IS OLD.evidence)
                    OR EXISTS (
                        SELECT 1 FROM memories WHERE state = 'ERASED'
                        AND id IN (OLD.memory_id, json_extract(OLD.evidence, '$.by'))
                    )
                )
            BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
        """,
    ),
    (
        15,
        """
        -- Exploratory serving (remem_agent/ranking/explore.py): a search made with RememConfig.explore_serving > 0
        -- stores its decision here, in the same transaction as its search row: the pool's memory ids and every
        -- feature that scored them, and the served set's distribution (each possible set with its exact
        -- probability, each candidate's inclusion probability, the draw). Off-policy evaluation
        -- (remem_agent/learning/ope.py) re-scores these pools under another configuration. A decision never
        -- changes; it goes when its search is pruned.
        CREATE TABLE search_decisions (
            search_id TEXT PRIMARY KEY REFERENCES searches (search_id),
            decision  TEXT NOT NULL,
            hash      TEXT NOT NULL
        ) WITHOUT ROWID;
        CREATE TRIGGER search_decisions_fixed BEFORE UPDATE ON search_decisions
            BEGIN SELECT RAISE(ABORT, 'a search decision never changes'); END;
        """,
    ),
    (
        16,
        """
        -- What each kind of memory contributes in a scope (ranking/utility.py ContributionUtility): per scope and
        -- role, the credit (capped at 1) and the expected uses (the calibrated prior recorded with each credit
        -- row) of every judged exposure. A memory's contribution factor starts at its kind's, not at 1, so a
        -- look-alike note never served before starts as low as the notes of its scope have proved. Derived from
        -- the credit rows (verify() sums them again); the migration's statement counts those already written.
        CREATE TABLE group_contribution (
            scope     TEXT NOT NULL,
            role      TEXT NOT NULL,
            uses      REAL NOT NULL DEFAULT 0,
            expected  REAL NOT NULL DEFAULT 0,
            exposures INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (scope, role)
        ) WITHOUT ROWID;
        INSERT INTO group_contribution (scope, role, uses, expected, exposures)
            SELECT s.scope, m.role, SUM(MIN(1.0, c.credit)), SUM(c.expected), COUNT(*)
            FROM credits c JOIN searches s ON s.search_id = c.search_id JOIN memories m ON m.id = c.memory_id
            WHERE c.expected IS NOT NULL GROUP BY s.scope, m.role;
        """,
    ),
]

LATEST = MIGRATIONS[-1][0]

# Python steps of numbered migrations (both backends), run right after the migration's SQL in the same
# transaction: version 3 hashes the rows written before it, version 11 resolves the stored memories' times.
BACKFILLS: dict[int, Callable[[LedgerTx], None]] = {3: hashing.backfill_hashes, 11: times.reindex}


def allow_erased_state(conn: sqlite3.Connection) -> None:
    """Migration 14's first step (SQLite only, in its transaction): the memories table's CHECK on ``state``
    admits 'ERASED'.

    SQLite cannot alter a CHECK constraint, and rebuilding the table would mean rebuilding its indexes,
    triggers and full-text index. A change that every stored row already satisfies may instead edit the
    table's definition in the schema table: SQLite's documented procedure for such changes (ALTER TABLE,
    "making other kinds of table schema changes": writable_schema, a new schema_version, an integrity check).
    Only the CHECK's list of states changes; a definition that already admits 'ERASED' is left as it is.
    """
    (sql,) = conn.execute("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'memories'").fetchone()
    if "'ERASED'" in sql:
        return
    before, after = "'ARCHIVED', 'INVALIDATED')", "'ARCHIVED', 'INVALIDATED', 'ERASED')"
    if sql.count(before) != 1:
        raise StoreError("the memories table's state CHECK is not the one remem-agent wrote; cannot migrate it")
    (version,) = conn.execute("PRAGMA schema_version").fetchone()
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute(
            "UPDATE sqlite_schema SET sql = ? WHERE type = 'table' AND name = 'memories'", (sql.replace(before, after),)
        )
        conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    problems = [r[0] for r in conn.execute("PRAGMA integrity_check")]
    if problems != ["ok"]:
        raise StoreError(f"the ledger failed its integrity check after migration 14's schema edit: {problems[:5]}")


# SQLite steps of numbered migrations, run first in the migration's transaction (schema edits SQL cannot make).
SQLITE_FIRST_STEPS: dict[int, Callable[[sqlite3.Connection], None]] = {14: allow_erased_state}
