"""The PostgreSQL store against a real server: bad input, ledger invariants, migration, the first-open race, the CLI.

Everything runs on the session's pgserver (PostgreSQL 16 + pgvector, see ``conftest.py``); nothing is
mocked. Each test gets fresh databases; the one test that edits ``pg_hba.conf`` restores it.

Several tests reproduce library bugs found while writing this file (first-open races, URL parsing,
password redaction, privilege messages); they were fixed in the library and now guard against regressions.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import _pg_downgrades
import numpy as np
import psycopg
import pytest
from _pg_downgrades import DOWNGRADE_5_TO_4
from psycopg import errors as pg_errors

from evals.harness import runner
from evals.harness.embedders import embedder_for
from evals.harness.families import make_world
from evals.harness.reader import ReaderParams
from evals.harness.systems import System, load_systems
from evals.harness.world import World
from remem_agent import ReMem
from remem_agent.cli import main
from remem_agent.errors import (
    MissingExtensionError,
    RememError,
    SchemaVersionError,
    StoreBusyError,
    StoreConnectionError,
    StoreError,
    UserInputError,
)
from remem_agent.store.copy import TABLES, copy_store, export_rows
from remem_agent.store.factory import open_store
from remem_agent.store.pg_migrations import LATEST as PG_LATEST
from remem_agent.types import State

ROOT = Path(__file__).resolve().parents[2]


# -- helpers -----------------------------------------------------------------------------------
def _socket_dir(pg_server: Any) -> str:
    return parse_qs(urlsplit(pg_server.get_uri()).query)["host"][0]


def _db_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def _url(pg_server: Any, db: str, user: str = "postgres", password: str | None = None) -> str:
    """A URL for ``db`` on the session server as ``user`` (over its unix socket)."""
    auth = user if password is None else f"{user}:{password}"
    return f"postgresql://{auth}@/{db}?host={_socket_dir(pg_server)}"


def _admin(url: str) -> psycopg.Connection[Any]:
    """A superuser connection to the database of ``url`` (autocommit)."""
    return psycopg.connect(url, autocommit=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def _has_remem_schema(url: str) -> bool:
    with _admin(url) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'remem'").fetchone() is not None


def _plain(value: Any) -> Any:
    """Exported row values made comparable with ``==`` (embeddings as float lists)."""
    if isinstance(value, np.ndarray):
        return [float(x) for x in value.ravel()]
    return value


def _dump(location: str | Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every ledger table, through the backend's own export (what ``migrate`` copies)."""
    store = open_store(location, create=False)
    try:
        with store.read() as tx:
            return {
                table: [tuple(_plain(v) for v in row) for rows in export_rows(tx, table) for row in rows]
                for table in TABLES
            }
    finally:
        store.close()


def _assert_same_ledger(a: str | Path, b: str | Path) -> dict[str, int]:
    """Same row counts and the same rows, table by table; returns the counts."""
    rows_a, rows_b = _dump(a), _dump(b)
    counts_a = {t: len(r) for t, r in rows_a.items()}
    assert counts_a == {t: len(r) for t, r in rows_b.items()}
    for table in TABLES:
        assert rows_a[table] == rows_b[table], f"table {table} differs"
    return counts_a


def _assert_same_memories(a: ReMem, b: ReMem) -> int:
    """Every memory's inspect() (state, text, stats, history, credits, supersedes) is equal on both stores."""
    ids = [m.id for m in a.list()]
    assert ids == [m.id for m in b.list()]
    for mid in ids:
        ia, ib = a.inspect(mid), b.inspect(mid)
        assert ia.memory == ib.memory
        assert dict(ia.stats) == dict(ib.stats)
        assert [(e.seq, e.kind, e.from_state, e.to_state, e.reason, dict(e.evidence)) for e in ia.history] == [
            (e.seq, e.kind, e.from_state, e.to_state, e.reason, dict(e.evidence)) for e in ib.history
        ]
        assert ia.history == ib.history
        assert ia.credits == ib.credits
        assert ia.supersedes == ib.supersedes
    return len(ids)


# -- 1. bad input: a typed error that names the fix, nothing lost ---------------------------------
def test_unreachable_server_fails_fast_naming_host_and_port() -> None:
    port = _free_port()
    url = f"postgresql://postgres:pw@127.0.0.1:{port}/postgres"
    t0 = time.monotonic()
    with pytest.raises(StoreConnectionError) as info:
        open_store(url)
    assert time.monotonic() - t0 < 5
    msg = str(info.value)
    assert "127.0.0.1" in msg and str(port) in msg
    assert "check host and port" in msg
    assert "pw@" not in msg and ":***@" in msg  # the password is redacted
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


def test_silent_server_times_out_instead_of_hanging() -> None:
    """A port that accepts TCP but never speaks PostgreSQL: connect_timeout bounds the wait."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(StoreConnectionError) as info:
            open_store(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout_s=1)
        elapsed = time.monotonic() - t0
    # libpq/psycopg never wait less than 2 s, whatever connect_timeout says
    assert elapsed < 6, f"took {elapsed:.1f}s"
    assert "timeout" in str(info.value) and str(port) in str(info.value)


@pytest.fixture()
def password_role(pg_server: Any, pg_url: str) -> Iterator[tuple[str, str]]:
    """(role, database): a login role that must authenticate with the password 'right'.

    ``pg_hba.conf`` gets scram-sha-256 lines for this role only (prepended, so they win over the
    server's ``trust`` lines); the original file is restored and reloaded afterwards.
    """
    role, db = _unique("r"), _db_name(pg_url)
    with _admin(pg_server.get_uri()) as conn:
        hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'right'")
    original = hba.read_text()
    try:
        hba.write_text(
            f"local all {role} scram-sha-256\nhost all {role} 127.0.0.1/32 scram-sha-256\n"
            f"host all {role} ::1/128 scram-sha-256\n" + original
        )
        with _admin(pg_server.get_uri()) as conn:
            assert conn.execute("SELECT pg_reload_conf()").fetchone()[0]
        deadline = time.monotonic() + 10  # the postmaster applies the reload asynchronously
        while True:
            try:
                psycopg.connect(_url(pg_server, db, role, "wrong"), connect_timeout=2).close()
            except psycopg.OperationalError:
                break
            assert time.monotonic() < deadline, "pg_hba.conf reload did not take effect"
            time.sleep(0.05)
        yield role, db
    finally:
        hba.write_text(original)
        with _admin(pg_server.get_uri()) as conn:
            conn.execute("SELECT pg_reload_conf()")
        with _admin(pg_url) as conn:
            conn.execute(f"REASSIGN OWNED BY {role} TO postgres")
            conn.execute(f"DROP OWNED BY {role}")
        with _admin(pg_server.get_uri()) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_timeouts_and_a_full_disk_are_not_called_unreachable_servers(pg_url: str) -> None:
    """Both are OperationalErrors in psycopg, but the server answered: they must not read "cannot reach"."""
    with ReMem(pg_url) as mem:
        mid = mem.add("The billing service runs on port 8080.")
        with mem.store.write() as holder:
            holder.run("SELECT id FROM memories WHERE id = ? FOR UPDATE", (mid,))
            with pytest.raises(StoreBusyError, match="lock_timeout") as busy, mem.store.write() as waiter:
                waiter.run("SET LOCAL lock_timeout = '50ms'")
                waiter.run("UPDATE memories SET confidence = 0.5 WHERE id = ?", (mid,))
        assert isinstance(busy.value.__cause__, pg_errors.LockNotAvailable)
        with pytest.raises(StoreError, match="statement_timeout") as canceled, mem.store.write() as slow:
            slow.run("SET LOCAL statement_timeout = '50ms'")
            slow.run("SELECT pg_sleep(5)")
        assert not isinstance(canceled.value, StoreConnectionError | StoreBusyError)
        with pytest.raises(StoreError, match=r"(?s)SQLSTATE 53100.*administrator") as full, mem.store.write() as tx:
            tx.run("UPDATE memories SET confidence = 0.5 WHERE id = ?", (mid,))
            tx.run("DO $$ BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = 'disk_full'; END $$")
        assert isinstance(full.value.__cause__, pg_errors.DiskFull)
        assert not isinstance(full.value, StoreConnectionError | StoreBusyError)
        assert mem.inspect(mid).memory.confidence != 0.5  # nothing of the timed-out writer landed
        assert mem.verify().ok


def test_conflicts_past_the_retry_window_say_how_long_they_were_retried(pg_url: str) -> None:
    """A body that keeps losing serialization conflicts is rerun until retry_s, then reported with the count."""
    from remem_agent.store.postgres import PostgresStore

    runs = 0

    def always_conflicting(tx: Any) -> None:
        nonlocal runs
        runs += 1
        tx.run("INSERT INTO meta (key, value) VALUES (?, ?)", (f"probe-{runs}", "x"))  # rolled back each time
        raise pg_errors.SerializationFailure("could not serialize access (simulated)")

    ReMem(pg_url).close()
    store = PostgresStore(pg_url, retry_s=1.0)
    try:
        with pytest.raises(StoreBusyError, match=r"still conflicting after (\d+) attempts over \d+\.\d s") as info:
            store.transact(always_conflicting)
        with store.read() as tx:
            assert tx.run("SELECT count(*) FROM meta WHERE key LIKE 'probe-%'").fetchone()[0] == 0
    finally:
        store.close()
    assert runs >= 2 and f"after {runs} attempts" in str(info.value)


def test_wrong_password_is_a_login_error_and_the_right_one_works(
    pg_server: Any, pg_url: str, password_role: tuple[str, str]
) -> None:
    role, db = password_role
    with _admin(pg_url) as conn:  # what the role needs: pgvector present, CREATE for the ledger schema
        conn.execute("CREATE EXTENSION vector")
        conn.execute(f'GRANT CREATE ON DATABASE "{db}" TO {role}')

    for url in (_url(pg_server, db, role, "wrong"), _url(pg_server, db, role)):
        t0 = time.monotonic()
        with pytest.raises(StoreConnectionError) as info:
            ReMem(url)
        assert time.monotonic() - t0 < 5
        msg = str(info.value)
        assert "refused the login" in msg and "check the user and password" in msg
        assert "wrong" not in msg
    assert not _has_remem_schema(pg_url)  # nothing was created by the refused logins

    good = _url(pg_server, db, role, "right")
    with ReMem(good) as mem:
        assert "right" not in str(mem.path) and ":***@" in str(mem.path)
        mid = mem.add("The billing service runs in region eu-west-1.", entity="billing", attribute="region")
        res = mem.search("Which region does billing run in?")
        assert [h.id for h in res.items][:1] == [mid]
        mem.feedback(res.search_id, success=True, used_ids=[mid])
        assert mem.verify().ok
    with pytest.raises(StoreConnectionError):  # a wrong password after the fact still loses nothing
        ReMem(_url(pg_server, db, role, "wrong"))
    with ReMem(good) as mem:
        assert [m.id for m in mem.list()] == [mid]
        assert mem.inspect(mid).overall.credited == 1


def test_missing_pgvector_for_a_non_superuser_names_create_extension(pg_server: Any, pg_url: str) -> None:
    """pgvector 0.6 is not a trusted extension: even the database's owner may not create it."""
    role, db = _unique("o"), _db_name(pg_url)
    with _admin(pg_server.get_uri()) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f'ALTER DATABASE "{db}" OWNER TO {role}')
    try:
        with pytest.raises(MissingExtensionError) as info:
            ReMem(_url(pg_server, db, role))
        msg = str(info.value)
        assert "CREATE EXTENSION vector" in msg and "administrator" in msg
        assert isinstance(info.value.__cause__, pg_errors.InsufficientPrivilege)
        assert not _has_remem_schema(pg_url)
        # the fix the message names works: an administrator creates it, the same user then opens the store
        with _admin(pg_url) as conn:
            conn.execute("CREATE EXTENSION vector")
        with ReMem(_url(pg_server, db, role)) as mem:
            mem.add("The auth service is owned by team-a.", entity="auth", attribute="owner")
            assert mem.verify().ok
    finally:
        with _admin(pg_url) as conn:
            conn.execute(f"REASSIGN OWNED BY {role} TO postgres")
            conn.execute(f"DROP OWNED BY {role}")
        with _admin(pg_server.get_uri()) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_no_create_privilege_on_the_database_is_a_clear_error(pg_server: Any, pg_url: str) -> None:
    role, db = _unique("n"), _db_name(pg_url)
    with _admin(pg_server.get_uri()) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    with _admin(pg_url) as conn:
        conn.execute("CREATE EXTENSION vector")
    try:
        with pytest.raises(StoreConnectionError) as info:
            open_store(_url(pg_server, db, role))
        assert "grant it CREATE on the database" in str(info.value)
        assert not _has_remem_schema(pg_url)
    finally:
        with _admin(pg_server.get_uri()) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_user_without_privileges_on_an_existing_store_is_told_what_to_grant(pg_server: Any, pg_url: str) -> None:
    ReMem(pg_url).close()  # an administrator created the store
    role, db = _unique("a"), _db_name(pg_url)
    with _admin(pg_server.get_uri()) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        with _admin(pg_url) as conn:
            conn.execute(f'GRANT CONNECT, CREATE ON DATABASE "{db}" TO {role}')
        for create in (False, True):
            with pytest.raises(RememError) as info:
                open_store(_url(pg_server, db, role), create=create)
            msg = str(info.value)
            assert "holds no remem store" not in msg and "grant it CREATE on the database" not in msg, msg
            assert "remem" in msg and ("USAGE" in msg or "privilege" in msg), msg
    finally:
        with _admin(pg_url) as conn:
            conn.execute(f'REVOKE ALL ON DATABASE "{db}" FROM {role}')
        with _admin(pg_server.get_uri()) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_superuser_creates_pgvector_automatically(pg_url: str) -> None:
    with _admin(pg_url) as conn:
        assert conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None
    with ReMem(pg_url) as mem:
        mem.add("The search service runs in region ap-south-1.")
        assert mem.verify().ok
    with _admin(pg_url) as conn:
        assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone() is not None


def test_schema_newer_than_the_code_is_refused_and_the_data_survives(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with ReMem(pg_url) as mem:
        ids = mem.add_many(["The email service runs in region us-west-2.", "The cache is warmed nightly."])
    with _admin(pg_url) as conn:
        conn.execute("INSERT INTO remem.schema_migrations VALUES (99, now())")

    for opener in (lambda: ReMem(pg_url), lambda: open_store(pg_url, create=False)):
        with pytest.raises(SchemaVersionError) as info:
            opener()
        assert info.value.found == 99 and "upgrade remem-agent" in str(info.value)
    assert main(["verify", pg_url]) == 2  # the CLI reports it, no traceback
    assert "schema version 99" in capsys.readouterr().err

    with _admin(pg_url) as conn:
        conn.execute("DELETE FROM remem.schema_migrations WHERE version = 99")
    with ReMem(pg_url) as mem:
        assert [m.id for m in mem.list()] == ids
        assert mem.verify().ok
        assert mem.stats().schema_version == PG_LATEST


@pytest.mark.parametrize(
    ("url", "expect"),
    [
        ("postgresql://u@/db?host=/tmp/nowhere&bogus=1", "invalid URI query parameter"),
        ("postgresql://u@127.0.0.1:99999/db", "port out of range"),
        ("postgresql://u@localhost:notaport/db", "port could not be cast"),
        ("postgresql://u@/db?host=/tmp/nowhere&sslmode=bogus", "sslmode"),
        ("postgresql://u:pw@localhost:notaport/db", "port"),
        ("postgresql://u@[::1/db", "URL"),
    ],
)
def test_malformed_url_is_a_remem_error_with_a_helpful_message(
    url: str, expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(Exception) as info:  # the point is *which* exception
        open_store(url)
    assert isinstance(info.value, UserInputError | StoreConnectionError), repr(info.value)
    assert isinstance(info.value, RememError)
    assert expect.lower() in str(info.value).lower()
    assert main(["verify", url]) == 2  # the CLI prints the message instead of a traceback
    assert expect.lower() in capsys.readouterr().err.lower()


@pytest.mark.parametrize(
    "where",
    [
        "netloc",
        "query",
    ],
)
def test_location_never_shows_the_password(pg_server: Any, pg_url: str, where: str) -> None:
    db = _db_name(pg_url)
    if where == "netloc":
        url = _url(pg_server, db, "postgres", "s3cret")
    else:
        url = _url(pg_server, db) + "&password=s3cret"
    store = open_store(url)  # trust authentication ignores the password
    try:
        assert "s3cret" not in store.location
    finally:
        store.close()


def test_read_only_tools_on_a_database_without_a_store(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UserInputError) as info:
        open_store(pg_url, create=False)
    assert "holds no remem store" in str(info.value)
    for argv in (["verify", pg_url], ["stats", pg_url], ["ledger", pg_url, "--list"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("remem: error:") and "holds no remem store" in err
        assert "Traceback" not in err
    assert not _has_remem_schema(pg_url)  # the read-only tools created no ledger


# -- 2. ledger invariants enforced by the database ---------------------------------------------------
def _store_with_history(url: str) -> tuple[str, str]:
    """A small store with a supersession, a search, feedback and credits; returns (old id, new id)."""
    with ReMem(url) as mem:
        old = mem.add("The billing service runs in region us-east-1.", entity="billing", attribute="region")
        mem.add("The auth service is owned by team-a.", entity="auth", attribute="owner")
        new = mem.add("The billing service moved to region eu-west-1.", entity="billing", attribute="region")
        res = mem.search("Which region does the billing service run in?")
        mem.feedback(res.search_id, success=True, used_ids=[new])
        assert mem.get(old).state is State.INVALIDATED
    return old, new


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET reason = 'rewritten'",
        "UPDATE events SET to_state = 'ACTIVE' WHERE kind = 'invalidate'",
        "DELETE FROM events",
        "TRUNCATE events",
        "UPDATE credits SET credit = 0",
        "DELETE FROM credits",
        "TRUNCATE credits",
        "DELETE FROM memories",
        "TRUNCATE memories CASCADE",
        "UPDATE memories SET id = id || 'x'",
        "UPDATE memories SET original_text = 'forged'",
        "UPDATE memories SET embedding = (SELECT embedding FROM memories ORDER BY seq DESC LIMIT 1)",
    ],
)
def test_ledger_rewrites_are_refused_by_the_database(pg_url: str, statement: str) -> None:
    _store_with_history(pg_url)
    before = _dump(pg_url)
    with _admin(pg_url) as conn:
        conn.execute("SET search_path TO remem, public")
        with pytest.raises(pg_errors.RaiseException) as info:
            conn.execute(statement)
        assert any(w in str(info.value) for w in ("append-only", "never deleted", "immutable"))
    assert _dump(pg_url) == before
    with ReMem(pg_url) as mem:
        assert mem.verify().ok


def test_allowed_updates_still_work_and_verify(pg_url: str) -> None:
    """The triggers stop rewrites of history, not the ledger's own mutable columns (text, state); an edit
    of those outside the library is caught by verify() instead (events record what each change set)."""
    old, _ = _store_with_history(pg_url)
    with _admin(pg_url) as conn:
        conn.execute("SET search_path TO remem, public")
        conn.execute("UPDATE memories SET embedding = embedding")  # unchanged values are fine
    with ReMem(pg_url) as mem:
        assert mem.verify().ok
    with _admin(pg_url) as conn:
        conn.execute("SET search_path TO remem, public")
        conn.execute("UPDATE memories SET text = 'compressed' WHERE id = %s", (old,))
    with ReMem(pg_url) as mem:
        assert mem.get(old).text == "compressed"
        report = mem.verify()
    assert not report.ok
    assert any(f"{old}: text is 'compressed'" in p for p in report.problems), report.problems


@pytest.mark.parametrize(
    ("statements", "problem"),
    [
        (["UPDATE memories SET state = 'ACTIVE' WHERE id = %(old)s"], "event log ends in INVALIDATED"),
        (["UPDATE stats SET credited = credited + 5"], "but credits sum to"),
        (["UPDATE searches SET feedback = NULL"], "credit rows without feedback"),
        (["UPDATE memories SET superseded_by = NULL WHERE id = %(old)s"], "names m_"),
        # a superuser can switch the triggers off; verify() is the second line of defence
        (["SET session_replication_role = replica", "DELETE FROM credits"], "credit rows"),
        (
            ["SET session_replication_role = replica", "DELETE FROM events WHERE memory_id = %(old)s AND seq > 0"],
            "no add event",
        ),
    ],
)
def test_tampering_the_triggers_allow_or_miss_is_caught_by_verify(
    pg_url: str, statements: list[str], problem: str
) -> None:
    old, _ = _store_with_history(pg_url)
    with _admin(pg_url) as conn:
        conn.execute("SET search_path TO remem, public")
        for sql in statements:
            conn.execute(sql, {"old": old} if "%(old)s" in sql else None)
    with ReMem(pg_url) as mem:
        report = mem.verify()
    assert not report.ok
    assert any(problem in p for p in report.problems), report.problems


_REPLICA = "SET session_replication_role = replica"  # a superuser switching the triggers off


@pytest.mark.parametrize(
    ("statements", "problem"),
    [
        (["UPDATE memories SET text = 'forged' WHERE id = %(new)s"], "text is 'forged' but its events set it"),
        (["UPDATE memories SET valid_to = 12345 WHERE id = %(new)s"], "valid_to is 12345"),
        (["UPDATE memories SET valid_from = valid_from - 1000 WHERE id = %(new)s"], "memory content"),
        ([_REPLICA, "UPDATE memories SET original_text = 'forged' WHERE id = %(new)s"], "memory content"),
        ([_REPLICA, """UPDATE events SET evidence = '{"forged": true}' WHERE memory_id = %(old)s"""], "event"),
        ([_REPLICA, "UPDATE events SET reason = 'forged' WHERE memory_id = %(new)s"], "(add: reason, evidence"),
        (["UPDATE searches SET query = 'forged'"], "its record (query"),
        (["UPDATE searches SET feedback_at = feedback_at + 1 WHERE feedback IS NOT NULL"], "its feedback"),
        ([_REPLICA, "UPDATE credits SET used = 1 - used"], "credit row"),
        (["UPDATE attributes SET changes = changes + 3"], "learned attribute 'region'"),
        (["DELETE FROM stats"], "has no stats row"),
        (["UPDATE memories SET content_hash = NULL WHERE id = %(new)s"], "no content hash"),
    ],
)
def test_edits_of_hashed_rows_are_caught_by_verify(pg_url: str, statements: list[str], problem: str) -> None:
    """Schema version 3: content hashes per memory, event, search, feedback, credit and attribute."""
    old, new = _store_with_history(pg_url)
    with ReMem(pg_url) as mem:
        assert mem.verify().ok
    with _admin(pg_url) as conn:
        conn.execute("SET search_path TO remem, public")
        for sql in statements:
            conn.execute(sql, {"old": old, "new": new} if "%(" in sql else None)
    with ReMem(pg_url) as mem:
        report = mem.verify()
    assert not report.ok
    assert any(problem in p for p in report.problems), report.problems


_DOWNGRADE_4_TO_3 = [  # what migration 4 (scopes) added
    *DOWNGRADE_5_TO_4,
    "DROP TRIGGER memories_scope_fixed ON memories",
    "DROP TRIGGER searches_scope_fixed ON searches",
    "DROP FUNCTION remem_scope_fixed()",
    "DROP INDEX memories_scope_key",
    "DROP INDEX memories_scope",
    "ALTER TABLE memories DROP COLUMN scope",
    "ALTER TABLE searches DROP COLUMN scope",
    "DELETE FROM schema_migrations WHERE version = 4",
]
_DOWNGRADE_TO_V2 = [
    *_DOWNGRADE_4_TO_3,
    "DROP TRIGGER events_append_only_u ON events",
    "DROP TRIGGER credits_append_only_u ON credits",
    "DROP TRIGGER events_append_only ON events",
    "CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events FOR EACH ROW "
    "EXECUTE FUNCTION remem_append_only()",
    "DROP TRIGGER credits_append_only ON credits",
    "CREATE TRIGGER credits_append_only BEFORE UPDATE OR DELETE ON credits FOR EACH ROW "
    "EXECUTE FUNCTION remem_append_only()",
    "DROP FUNCTION remem_append_only_hashed()",
    "ALTER TABLE memories DROP COLUMN content_hash",
    "ALTER TABLE events DROP COLUMN updates, DROP COLUMN hash",
    "ALTER TABLE searches DROP COLUMN hash, DROP COLUMN feedback_hash",
    "ALTER TABLE credits DROP COLUMN hash",
    "ALTER TABLE attributes DROP COLUMN hash",
    "DELETE FROM schema_migrations WHERE version = 3",
]


def test_migration_3_backfills_the_hashes_of_a_version_2_store(pg_url: str) -> None:
    _, new = _store_with_history(pg_url)
    with _admin(pg_url) as conn:
        _pg_downgrades.downgrade(conn, _DOWNGRADE_TO_V2)  # the schema exactly as version 2 left it
    with ReMem(pg_url) as mem:
        assert mem.stats().schema_version == PG_LATEST
        assert mem.verify().ok
        mem.feedback(mem.search("Which region does billing run in?").search_id, success=True)
        assert mem.verify().ok
    with _admin(pg_url) as conn:
        conn.execute("SET search_path TO remem, public")
        for table in ("memories", "events", "searches", "credits", "attributes"):
            col = "content_hash" if table == "memories" else "hash"
            assert conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {col} IS NULL").fetchone() == (0,)
        with pytest.raises(pg_errors.RaiseException):  # hashed rows are append-only again
            conn.execute("UPDATE events SET hash = 'x'")
        conn.execute("UPDATE memories SET text = 'forged' WHERE id = %s", (new,))
    with ReMem(pg_url) as mem:
        assert any("text is 'forged'" in p for p in mem.verify().problems)


# -- 3. remem migrate: a benchmark store, folder -> PostgreSQL -> folder ----------------------------
@pytest.fixture(scope="module")
def bench_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, World, System]:
    """The store the synthetic benchmark leaves behind: contradiction world, system C, seed 0, 120 tasks."""
    world = make_world("contradiction", 0)
    world = make_world("contradiction", 0, replace(world.params, n_tasks=120))
    system = load_systems()["C"]
    folder = tmp_path_factory.mktemp("bench") / "store"
    result = runner.run(world, system, ReaderParams(), keep_store=folder)
    assert result.n_tasks == 120
    return folder, world, system


def _open(location: str | Path, world: World, system: System) -> ReMem:
    return ReMem(location, embedder=embedder_for(world), config=system.config)


def _compare_searches(a: ReMem, b: ReMem, world: World, n: int = 6) -> list[str]:
    """Run the world's last ``n`` queries on both stores; returns the queries whose served lists differ.

    Candidate generation must agree exactly (pgvector's HNSW against the exact flat index, over the whole
    store): same ids, same similarities, and the same lexical candidates with the same scores. The served
    lists must agree on the first hit, and any other difference may only involve memories whose similarity
    is tied with another candidate's: the hash embedder gives many equal similarities, the similarity guard
    keeps the first ``guard_top`` of them in candidate order, and the two indexes order equal distances
    differently.
    """
    differ: list[str] = []
    for t in list(world.tasks())[-n:]:
        q = a.embedder.embed([t.query])[0]
        ids_a, sims_a = a.index.candidates(q, len(a.index))
        ids_b, sims_b = b.index.candidates(q, len(b.index))
        sim_a = dict(zip(ids_a, sims_a.tolist(), strict=True))
        sim_b = dict(zip(ids_b, sims_b.tolist(), strict=True))
        assert set(sim_a) == set(sim_b), t.tid
        assert all(abs(sim_a[i] - sim_b[i]) < 1e-5 for i in sim_a), t.tid
        # The lexical channel is one computation on both backends: the same scores, bit for bit, in one order.
        with a.store.read() as ta, b.store.read() as tb:
            lex_a = ta.lexical_candidates(t.query, limit=100, scopes=None)
            lex_b = tb.lexical_candidates(t.query, limit=100, scopes=None)
        assert lex_a and lex_a == lex_b, t.tid
        ra = a.search(t.query, k=world.params.k, task=t.task_class, now=t.t)
        rb = b.search(t.query, k=world.params.k, task=t.task_class, now=t.t)
        served_a, served_b = [h.id for h in ra.items], [h.id for h in rb.items]
        assert served_a[:1] == served_b[:1], t.tid
        if served_a != served_b:
            differ.append(t.tid)
            rounded = [round(v, 5) for v in sim_a.values()]
            for mid in set(served_a) ^ set(served_b):
                assert rounded.count(round(sim_a[mid], 5)) > 1, (t.tid, mid, "differs without a similarity tie")
    return differ


def test_migrate_benchmark_store_to_postgres_and_back(
    bench_store: tuple[Path, World, System], pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, world, system = bench_store
    counts_before = {t: len(r) for t, r in _dump(folder).items()}
    # the store really has the history the test is about
    assert counts_before["searches"] == 120 and counts_before["credits"] > 0 and counts_before["attributes"] > 0
    with _open(folder, world, system) as src:
        kinds = {e.kind for m in src.list() for e in src.inspect(m.id).history}
        assert {"add", "invalidate", "demote"} <= kinds
        assert any(src.inspect(m.id).supersedes for m in src.list())

    # folder -> PostgreSQL
    assert main(["migrate", str(folder), pg_url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verify_ok"] is True and report["problems"] == []
    assert report["rows"] == counts_before
    assert _assert_same_ledger(folder, pg_url) == counts_before
    assert {t: len(r) for t, r in _dump(folder).items()} == counts_before  # the source was only read

    with _open(folder, world, system) as src, _open(pg_url, world, system) as dst:
        assert dst.verify().ok
        assert _assert_same_memories(src, dst) == counts_before["memories"]
        assert dst.stats() == src.stats()

    tmp_copy = tmp_path / "src-copy"  # searches write to the ledger: search a copy of the source
    assert main(["migrate", str(folder), str(tmp_copy)]) == 0
    capsys.readouterr()
    with _open(tmp_copy, world, system) as src, _open(pg_url, world, system) as dst:
        # HNSW (pgvector) against the exact flat index: same candidates, same results up to similarity ties
        _compare_searches(src, dst, world)

        # the migrated store keeps working: supersede a migrated fact, search, feedback, verify
        key_mem = next(m for m in dst.list(State.ACTIVE) if m.attribute == "region" and m.role == "state")
        assert key_mem.entity is not None and key_mem.attribute is not None
        last_t = max(t.t for t in world.tasks())
        new = dst.add(
            f"Update: the {key_mem.entity} service {key_mem.attribute} changed to migrated-value.",
            entity=key_mem.entity,
            attribute=key_mem.attribute,
            timestamp=last_t + 3600,
        )
        assert dst.get(key_mem.id).state is State.INVALIDATED
        assert key_mem.id in dst.inspect(new).supersedes
        res = dst.search(f"What is the {key_mem.attribute} of the {key_mem.entity} service?", now=last_t + 7200)
        assert new in [h.id for h in res.items]
        receipt = dst.feedback(res.search_id, success=True, used_ids=[new])
        assert receipt.credit.get(new, 0) > 0
        assert dst.verify().ok

    # PostgreSQL -> a new folder (full round trip), compared with the PostgreSQL store it came from
    back = tmp_path / "back"
    assert main(["migrate", pg_url, str(back)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verify_ok"] is True
    counts_pg = _assert_same_ledger(pg_url, back)
    assert counts_pg["memories"] == counts_before["memories"] + 1
    assert counts_pg["searches"] == counts_before["searches"] + 6 + 1
    with _open(pg_url, world, system) as pg, _open(back, world, system) as fs:
        _assert_same_memories(pg, fs)
        assert fs.verify().ok
        _compare_searches(pg, fs, world, 3)
    # and the original history is still in the round-tripped folder: the append-only tables row for row,
    # the memories' immutable columns (seq, id, original_text, embedding) unchanged
    original, returned = _dump(folder), _dump(back)
    for table in ("events", "credits"):
        assert returned[table][: len(original[table])] == original[table], table
    cols = TABLES["memories"]
    fixed = [cols.index(c) for c in ("seq", "id", "original_text", "embedding")]
    assert [[r[i] for i in fixed] for r in returned["memories"][: len(original["memories"])]] == [
        [r[i] for i in fixed] for r in original["memories"]
    ]


def test_migrate_into_a_non_empty_target_is_refused(
    bench_store: tuple[Path, World, System], pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, world, system = bench_store
    copy_store(folder, pg_url)
    before = _dump(pg_url)
    with pytest.raises(UserInputError) as info:
        copy_store(folder, pg_url)
    assert "not empty" in str(info.value) and "new store" in str(info.value)
    assert main(["migrate", str(folder), pg_url]) == 2
    assert "not empty" in capsys.readouterr().err
    assert _dump(pg_url) == before

    # a target that holds only a fresh ReMem (meta, no memories) counts as non-empty too
    other = tmp_path / "fresh"
    ReMem(other).close()
    fresh_before = _dump(other)
    with pytest.raises(UserInputError):
        copy_store(pg_url, other)
    assert _dump(other) == fresh_before
    with pytest.raises(UserInputError, match="same store"):
        copy_store(pg_url, pg_url)
    with _open(pg_url, world, system) as mem:
        assert mem.verify().ok


# -- 4. two processes opening a fresh database at once ---------------------------------------------
_CHILD = textwrap.dedent(
    """
    import sys, time
    from remem_agent import ReMem
    url, start = sys.argv[1], float(sys.argv[2])
    time.sleep(max(0.0, start - time.time()))
    try:
        with ReMem(url) as mem:
            mem.add("The billing service runs in region us-east-1.", entity="billing", attribute="region")
    except Exception as exc:
        print("ERROR", type(exc).__name__, exc)
        sys.exit(3)
    print("OK")
    """
)


def test_two_processes_opening_a_fresh_database_at_once(pg_url_factory: Callable[[], str]) -> None:
    for _ in range(2):
        url = pg_url_factory()
        start = time.time() + 1.5  # both children are imported and waiting by then
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, url, str(start)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        for p, out in zip(procs, outs, strict=True):
            assert p.returncode == 0, out  # no UniqueViolation on pgvector, no unretried conflict on meta
        with _admin(url) as conn:
            versions = conn.execute("SELECT version FROM remem.schema_migrations ORDER BY version").fetchall()
            assert versions == [(v,) for v in range(1, PG_LATEST + 1)]  # each migration ran exactly once
            assert conn.execute("SELECT COUNT(*) FROM remem.memories").fetchone()[0] == 1
        with ReMem(url) as mem:
            assert mem.verify().ok


def _blocked_on_lock(url: str, timeout: float = 10) -> None:
    """Wait until some other session of this database waits for a lock."""
    deadline = time.monotonic() + timeout
    with _admin(url) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                (_db_name(url),),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the other session never blocked")


def _in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``fn`` in a thread; the returned callable joins it and returns (or re-raises) its result."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 (re-raised in the caller)
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> Any:
        thread.join(30)
        assert not thread.is_alive()
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


def test_first_open_while_another_opener_creates_pgvector(pg_url: str) -> None:
    """The interleaving two first openers can hit, made deterministic: pgvector appears while we create it."""
    with _admin(pg_url) as other:
        other.execute("BEGIN")
        other.execute("CREATE EXTENSION vector")
        join = _in_thread(lambda: open_store(pg_url))
        _blocked_on_lock(pg_url)
        other.execute("COMMIT")
        join().close()


def test_first_open_while_another_opener_writes_the_meta_keys(pg_url: str) -> None:
    """Two ReMem first-opens both insert meta('embedder'); the loser must retry, not raise StoreBusyError."""
    open_store(pg_url).close()  # ledger created, meta still empty
    with _admin(pg_url) as other:
        other.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        other.execute("INSERT INTO remem.meta VALUES ('embedder', %s)", (_default_embedder(),))
        join = _in_thread(lambda: ReMem(pg_url))
        _blocked_on_lock(pg_url)
        other.execute("COMMIT")
        join().close()


def _default_embedder() -> str:
    from remem_agent.embedders.hash_embedder import ConceptHashEmbedder

    return ConceptHashEmbedder().name


# -- 5. the read-only CLI tools on a URL -------------------------------------------------------------
def test_cli_read_only_tools_accept_a_url(
    pg_server: Any, pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _url(pg_server, _db_name(pg_url), "postgres", "s3cret")  # trust auth: the password is ignored
    texts = [
        "The billing service runs in region us-east-1.",
        "The billing service moved to region eu-west-1.",
        "The auth service is owned by team-platform.",
    ]
    with ReMem(url) as mem:
        old = mem.add(texts[0], entity="billing", attribute="region")
        new = mem.add(texts[1], entity="billing", attribute="region")
        owner = mem.add(texts[2], entity="auth", attribute="owner")
        res = mem.search("Which region does the billing service run in?")
        mem.feedback(res.search_id, success=True, used_ids=[new])

    assert main(["stats", url]) == 0
    out = capsys.readouterr().out
    stats = json.loads(out)
    assert stats["memories"] == 3
    assert {k: v for k, v in stats["by_state"].items() if v} == {"ACTIVE": 2, "INVALIDATED": 1}
    assert set(stats["by_state"]) == {s.value for s in State}  # every state, as ReMem.stats() gives them
    assert stats["searches"] == 1 and stats["feedbacks"] == 1 and stats["schema_version"] == PG_LATEST
    assert "s3cret" not in out

    assert main(["verify", url]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("ok") and "s3cret" not in out

    assert main(["ledger", url, "--list", "--json"]) == 0
    out = capsys.readouterr().out
    listed = json.loads(out)
    assert isinstance(listed, list | dict)
    for mid, text in ((old, texts[0]), (new, texts[1]), (owner, texts[2])):
        assert mid in out and text in out
    assert "s3cret" not in out

    assert main(["ledger", url, "--show", old, "--json"]) == 0
    out = capsys.readouterr().out
    assert "INVALIDATED" in out and new in out and "s3cret" not in out

    html = tmp_path / "dash" / "memory.html"
    html.parent.mkdir()  # the dashboard refuses to create folders
    assert main(["dashboard", url, "-o", str(html)]) == 0
    out = capsys.readouterr().out
    assert str(html) in out and "s3cret" not in out
    page = html.read_text(encoding="utf-8")
    assert all(t in page for t in ("us-east-1", "eu-west-1", "team-platform"))
    assert _db_name(url) in page and "s3cret" not in page

    # errors on a URL with a password: exit 2, a message, no traceback, no password
    bad = _url(pg_server, "no_such_db_" + uuid.uuid4().hex[:6], "postgres", "s3cret")
    assert main(["stats", bad]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "createdb" in err and "s3cret" not in err and "Traceback" not in err


def test_store_options_reach_the_backend_and_bad_ones_are_refused(pg_url: str, tmp_path: Path) -> None:
    with ReMem(pg_url, store_options={"ef_search": 400, "pool_size": 2}) as mem:
        assert mem.store.ef_search == 400  # type: ignore[attr-defined]
        mem.add("The billing service runs in region us-east-1.", entity="billing", attribute="region")
        assert mem.search("Where does billing run?").items
    for bad in ({"ef_search": 0}, {"ef_search": 5000}, {"pool_size": 0}, {"bogus": 1}):
        with pytest.raises(UserInputError):
            ReMem(pg_url, store_options=bad)
    with pytest.raises(UserInputError, match="accepted"):
        ReMem(tmp_path / "s", store_options={"ef_search": 100})  # a PostgreSQL option on SQLite
    with ReMem(pg_url) as mem:
        assert mem.stats().memories == 1 and mem.verify().ok  # the refused opens changed nothing
