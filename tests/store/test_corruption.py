"""The corruption matrix: damaged ledger files and tampered rows, on real SQLite files.

Every case must end in a typed error (``LedgerCorruptError`` / ``StoreError`` / ``UserInputError``) or
in a ``verify()`` report that names the damage; none may open as a healthy store with data missing.
Also: the empty-ledger rule (``store.json``), and ``remem backup`` while another connection writes.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from remem_agent import ReMem, State
from remem_agent.cli import main
from remem_agent.errors import LedgerCorruptError, RememError, StoreError, UserInputError
from remem_agent.store.backup import backup_store
from remem_agent.store.factory import open_store
from remem_agent.store.sqlite import LEDGER_FILE, MARKER_FILE, TABLES

N_MEMORIES = 303  # 302 facts and one note
PAGE = 4096


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with history: 303 memories with supersessions, searches, feedback, credits, attributes."""
    folder = tmp_path_factory.mktemp("pristine") / "store"
    with ReMem(folder) as mem:
        for i in range(N_MEMORIES - 1):
            mem.add(f"fact {i}: service s{i % 40} runs in region r{i}", entity=f"s{i % 40}", attribute="region")
        for i in range(30):
            res = mem.search(f"where does service s{i % 40} run?", k=3, task="ops" if i % 2 else None)
            if i % 3:
                mem.feedback(res.search_id, success=i % 2 == 0, used_ids=res.ids[:1])
        # a note no judged search served: retrieved, never judged (the case below deletes its stats rows)
        mem.add("The cafeteria on floor two closes at nine.", role="note")
        mem.search("when does the cafeteria close?", k=1, task="ops")
        assert mem.verify().ok
    return folder


@pytest.fixture()
def store(pristine: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    shutil.copytree(pristine, folder)
    return folder


def outcome(folder: Path, *, tools_see_it: bool = True) -> tuple[str, str]:
    """("error", message) when opening/verifying raises a typed error, ("report", problems) otherwise.

    Checked both ways a store is opened: by ``ReMem`` and by the read-only tools (``open_store``).
    A raw driver error or a crash of verify() fails the test; so does a healthy-looking store
    (``tools_see_it=False``: only ``ReMem``, which knows its embedder and config, can tell).
    """
    results = []
    for opener in (lambda: ReMem(folder), lambda: open_store(folder, create=False)):
        try:
            s = opener()
        except RememError as exc:
            results.append(("error", f"{type(exc).__name__}: {exc}"))
            continue
        try:
            if isinstance(s, ReMem):
                report = s.verify()
                assert report.counts["memories"] == N_MEMORIES or not report.ok
                results.append(("report", "\n".join(report.problems)))
            else:
                dim = s.get_meta("dim")
                results.append(("report", "\n".join(s.verify(int(dim) if dim else None))))
        except RememError as exc:
            results.append(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            s.close()
    for kind, text in results if tools_see_it else results[:1]:
        assert text, f"{folder}: opened and verified as healthy ({kind})"
    return results[0][0], "\n".join(text for _, text in results)


def _sql(folder: Path, *statements: str, bypass: tuple[str, ...] = ()) -> None:
    """Edit the ledger with a plain sqlite3 connection; ``bypass`` drops these triggers and restores them."""
    conn = sqlite3.connect(folder / LEDGER_FILE, isolation_level=None)
    try:
        saved = [
            conn.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (t,)).fetchone()[0]
            for t in bypass
        ]
        for t in bypass:
            conn.execute(f"DROP TRIGGER {t}")
        for stmt in statements:
            conn.execute(stmt)
        for sql in saved:
            conn.execute(sql)
    finally:
        conn.close()


def _damage(folder: Path, fn: Callable[[Path, int], None]) -> None:
    path = folder / LEDGER_FILE
    for extra in ("-wal", "-shm"):
        assert not Path(str(path) + extra).exists()  # closed cleanly: the WAL was checkpointed
    fn(path, path.stat().st_size)


def _truncate(at: Callable[[int], int]) -> Callable[[Path, int], None]:
    def fn(path: Path, size: int) -> None:
        with open(path, "r+b") as fh:
            fh.truncate(at(size))

    return fn


def _zero_last_page(path: Path, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(size - PAGE)
        fh.write(b"\0" * PAGE)


def _random_pages(seed: int) -> Callable[[Path, int], None]:
    def fn(path: Path, size: int) -> None:
        rng = random.Random(seed)
        with open(path, "r+b") as fh:
            for page in rng.sample(range(1, size // PAGE), 4):
                fh.seek(page * PAGE)
                fh.write(rng.randbytes(PAGE))

    return fn


FILE_DAMAGE: dict[str, Callable[[Path, int], None]] = {
    "truncated to 100 bytes (inside the header)": _truncate(lambda size: 100),
    "truncated to one page": _truncate(lambda size: PAGE),
    "truncated mid-page at 1/3": _truncate(lambda size: size // 3 + 1234),
    "truncated mid-page at 2/3": _truncate(lambda size: 2 * size // 3 + 777),
    "truncated by one page": _truncate(lambda size: size - PAGE),
    "truncated by one byte": _truncate(lambda size: size - 1),
    "last page zeroed": _zero_last_page,
    "random bytes in pages (seed 1)": _random_pages(1),
    "random bytes in pages (seed 2)": _random_pages(2),
    "random bytes in pages (seed 3)": _random_pages(3),
}


@pytest.mark.parametrize("case", list(FILE_DAMAGE))
def test_damaged_file_is_a_typed_error_or_a_verify_report(store: Path, case: str) -> None:
    _damage(store, FILE_DAMAGE[case])
    kind, text = outcome(store)
    assert "damaged" in text or "integrity_check" in text or "malformed" in text, text
    if kind == "error":
        assert "LedgerCorruptError" in text and ".recover" in text and "backup" in text, text


def _garble_first(marker: bytes, garbled: bytes) -> Callable[[Path, int], None]:
    def fn(path: Path, size: int) -> None:
        data = bytearray(path.read_bytes())
        i = data.find(marker)
        assert i >= 0, marker
        data[i : i + len(garbled)] = garbled
        path.write_bytes(bytes(data))

    return fn


def test_schema_text_that_is_not_utf8_is_a_corruption_error(tmp_path: Path) -> None:
    """A byte flip inside a stored CREATE statement (invalid UTF-8 where SQLite keeps UTF-8 text) was a raw
    UnicodeDecodeError on open; it is a LedgerCorruptError naming the damage and the recovery, from ReMem,
    the read-only tools and the CLI's verify alike."""
    folder = tmp_path / "s"
    with ReMem(folder) as mem:
        mem.add("x is y.")
    _damage(folder, _garble_first(b"CREATE TABLE meta", b"CR\xf0(TE"))
    for opener in (lambda: ReMem(folder), lambda: open_store(folder, create=False)):
        with pytest.raises(LedgerCorruptError, match="damaged") as info:
            opener()
        assert ".recover" in str(info.value)
    assert main(["verify", str(folder)]) == 2


def test_row_text_that_is_not_utf8_is_reported_not_raised(store: Path) -> None:
    """The same damage in a memory's text: opening works (the schema is intact) and verify() reports it."""
    _damage(store, _garble_first(b"service s7 runs in region r7", b"service s\xff\xfe runs"))
    kind, text = outcome(store)
    assert "damaged" in text or "UTF-8" in text, text
    if kind == "error":
        assert "LedgerCorruptError" in text, text


def test_ledger_truncated_to_zero_bytes_is_refused_not_an_empty_store(store: Path) -> None:
    _damage(store, _truncate(lambda size: 0))
    for opener in (lambda: ReMem(store), lambda: open_store(store, create=False)):
        with pytest.raises(LedgerCorruptError) as info:
            opener()
        assert "is empty (0 bytes)" in str(info.value) and MARKER_FILE in str(info.value)
        assert ".recover" in str(info.value) and "backup" in str(info.value)
    assert (store / LEDGER_FILE).stat().st_size == 0  # nothing was initialised over it
    assert main(["verify", str(store)]) == 2


def test_missing_ledger_with_marker_is_refused(store: Path) -> None:
    (store / LEDGER_FILE).unlink()
    with pytest.raises(LedgerCorruptError, match="is missing"):
        ReMem(store)
    assert not (store / LEDGER_FILE).exists()
    with pytest.raises(UserInputError):  # the read-only tools never create a ledger
        open_store(store, create=False)


def test_ledger_replaced_by_an_empty_database_is_refused(store: Path) -> None:
    (store / LEDGER_FILE).unlink()
    sqlite3.connect(store / LEDGER_FILE).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(LedgerCorruptError, match="holds no ledger schema"):
        ReMem(store)


def test_store_killed_during_creation_reopens(tmp_path: Path) -> None:
    """No marker yet (the schema never committed): a 0-byte ledger is initialised as a new store."""
    folder = tmp_path / "new"
    folder.mkdir()
    (folder / LEDGER_FILE).write_bytes(b"")
    with ReMem(folder) as mem:
        mem.add("first fact")
        assert mem.verify().ok
    assert (folder / MARKER_FILE).is_file()


def test_store_without_marker_gets_one_at_its_next_healthy_open(store: Path) -> None:
    (store / MARKER_FILE).unlink()
    with ReMem(store) as mem:
        assert mem.verify().ok
    assert (store / MARKER_FILE).is_file()
    _damage(store, _truncate(lambda size: 0))
    with pytest.raises(LedgerCorruptError):
        ReMem(store)


@pytest.mark.parametrize("table", TABLES)
def test_dropped_table_is_a_typed_error_naming_it(store: Path, table: str) -> None:
    _sql(store, "PRAGMA foreign_keys = OFF", f"DROP TABLE {table}")
    kind, text = outcome(store)
    assert kind == "error" and "LedgerCorruptError" in text and f"'{table}'" in text and ".recover" in text


def _first(folder: Path, sql: str) -> str:
    conn = sqlite3.connect(folder / LEDGER_FILE)
    try:
        return str(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


ACTIVE = "(SELECT id FROM memories WHERE state = 'ACTIVE' ORDER BY seq DESC LIMIT 1)"
OLD = "(SELECT id FROM memories WHERE state = 'INVALIDATED' ORDER BY seq LIMIT 1)"
NEVER_CREDITED = (
    "(SELECT s.memory_id FROM stats s WHERE s.task = '*' AND s.retrieved > 0 AND s.shown = 0 "
    "AND s.memory_id NOT IN (SELECT memory_id FROM credits) LIMIT 1)"
)
M_FIXED = ("memories_embedding_fixed",)
EV = ("events_append_only_u", "events_append_only_d")
CR = ("credits_append_only_u", "credits_append_only_d")

# case -> (statements, triggers bypassed, text the report must contain)
TAMPER: dict[str, tuple[list[str], tuple[str, ...], str]] = {
    "memories.text (served text)": (
        [f"UPDATE memories SET text = 'forged' WHERE id = {ACTIVE}"],
        (),
        "text is 'forged'",
    ),
    "memories.original_text": (
        [f"UPDATE memories SET original_text = 'forged' WHERE id = {ACTIVE}"],
        M_FIXED,
        "memory content",
    ),
    "memories.valid_to": ([f"UPDATE memories SET valid_to = 5.0 WHERE id = {ACTIVE}"], (), "valid_to is 5.0"),
    "memories.valid_from": ([f"UPDATE memories SET valid_from = 1.0 WHERE id = {ACTIVE}"], (), "memory content"),
    "memories.superseded_by": ([f"UPDATE memories SET superseded_by = NULL WHERE id = {OLD}"], (), "superseded_by"),
    "memories.state": ([f"UPDATE memories SET state = 'ACTIVE' WHERE id = {OLD}"], (), "event log ends in"),
    "memories.confidence": ([f"UPDATE memories SET confidence = 0.01 WHERE id = {ACTIVE}"], (), "confidence is 0.01"),
    "memories.embedding (wrong width)": (
        [f"UPDATE memories SET embedding = x'0000803f' WHERE id = {ACTIVE}"],
        M_FIXED,
        "embedding",
    ),
    "events.evidence": (
        [f"""UPDATE events SET evidence = '{{"forged": 1}}' WHERE memory_id = {OLD} AND kind = 'invalidate'"""],
        EV,
        "(invalidate: reason, evidence",
    ),
    "events.reason": ([f"UPDATE events SET reason = 'forged' WHERE memory_id = {ACTIVE}"], EV, "(add: reason"),
    "events deleted": ([f"DELETE FROM events WHERE memory_id = {OLD} AND kind = 'invalidate'"], EV, "event log"),
    "searches.query": (["UPDATE searches SET query = 'forged'"], (), "its record (query"),
    "searches.served": (["UPDATE searches SET served = '[]' WHERE feedback IS NOT NULL"], (), "served"),
    "searches.feedback": (
        ["""UPDATE searches SET feedback = '{"success": false}' WHERE feedback IS NOT NULL"""],
        (),
        "its feedback",
    ),
    "credits.credit": (["UPDATE credits SET credit = 0.5, blame = 0"], CR, "credit row"),
    "credits deleted": (["DELETE FROM credits"], CR, "credit rows"),
    "stats.credited": (["UPDATE stats SET credited = credited + 1"], (), "but credits sum to"),
    # schema 10: each exposure's expected uses, on the credit row (hashed) and summed in the stats
    "credits.expected": (["UPDATE credits SET expected = 0.01"], CR, "credit row"),
    "credits.prior": (["UPDATE credits SET prior = 0.99"], CR, "credit row"),
    "prior_calibration.uses": (["UPDATE prior_calibration SET uses = uses + 1"], (), "prior calibration"),
    "prior_calibration deleted": (["DELETE FROM prior_calibration"], (), "have no calibration row"),
    "stats.expected_sum": (["UPDATE stats SET expected_sum = expected_sum + 0.5"], (), "but credits sum to"),
    "stats.expected_n": (["UPDATE stats SET expected_n = 0"], (), "but credits sum to"),
    "stats rows of a served, never-credited memory": (
        [f"DELETE FROM stats WHERE memory_id = {NEVER_CREDITED}"],
        (),
        "has no stats row",
    ),
    "attributes.changes": (["UPDATE attributes SET changes = changes + 3"], (), "learned attribute 'region'"),
    "attributes.single_valued": (["UPDATE attributes SET single_valued = 1 - single_valued"], (), "learned attribute"),
    # the lexical index (schema 5): an entry removed, a stale entry after an edit that bypassed its trigger,
    # an entry indexed twice (only FTS5's own integrity check sees that one)
    "memories_fts entry deleted": (
        [
            "INSERT INTO memories_fts (memories_fts, rowid, text) SELECT 'delete', seq, text FROM memories "
            f"WHERE id = {ACTIVE}"
        ],
        (),
        "is not in the full-text index",
    ),
    "memories_fts stale after a text edit": (
        [f"UPDATE memories SET text = original_text || ' forged' WHERE id = {ACTIVE}"],
        ("memories_fts_update",),
        "full-text index entry does not match its current text",
    ),
    "memories_fts entry indexed twice": (
        [f"INSERT INTO memories_fts (rowid, text) SELECT seq, text FROM memories WHERE id = {ACTIVE}"],
        (),
        "memories_fts is damaged (FTS5 integrity-check",
    ),
    "meta dim changed": (["UPDATE meta SET value = '7' WHERE key = 'dim'"], (), "dim"),
    "meta embedder changed": (["UPDATE meta SET value = 'other-embedder' WHERE key = 'embedder'"], (), "embedder"),
    "meta supersession changed": (["UPDATE meta SET value = 'learned' WHERE key = 'supersession'"], (), "supersession"),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_tampered_rows_are_a_typed_error_or_a_verify_report(store: Path, case: str) -> None:
    statements, bypass, expected = TAMPER[case]
    _sql(store, *statements, bypass=bypass)
    # Another embedder name or supersession mode is a consistent ledger: ReMem refuses to open it
    # with its own embedder/config (UserInputError); the read-only tools cannot know better.
    kind, text = outcome(store, tools_see_it=case not in ("meta embedder changed", "meta supersession changed"))
    assert expected in text, text
    if case.startswith("meta ") and kind == "error":
        assert "UserInputError" in text or "embedding" in text


def test_deleted_meta_dim_is_reported_by_the_tools_and_restored_by_remem(store: Path) -> None:
    _sql(store, "DELETE FROM meta WHERE key = 'dim'")
    s = open_store(store, create=False)
    try:
        assert any("meta has no 'dim'" in p for p in s.verify(None))
    finally:
        s.close()
    with ReMem(store) as mem:  # the embedder knows its width: the row is written again, nothing is lost
        assert mem.verify().ok and mem.stats().memories == N_MEMORIES and mem.store.get_meta("dim") == "256"


def test_wrong_width_embedding_open_names_verify_and_verify_lists_it(store: Path) -> None:
    mid = _first(store, f"SELECT {ACTIVE}")
    _sql(store, f"UPDATE memories SET embedding = x'0000803f0000803f' WHERE id = '{mid}'", bypass=M_FIXED)
    with pytest.raises(LedgerCorruptError) as info:
        ReMem(store)
    assert mid in str(info.value) and "remem verify" in str(info.value)
    s = open_store(store, create=False)
    try:
        problems = s.verify(int(s.get_meta("dim") or 0))
    finally:
        s.close()
    assert any(f"{mid}: embedding has 2 floats" in p for p in problems), problems


def test_verify_reports_null_columns_instead_of_crashing(store: Path) -> None:
    """A damaged row can hold NULL where the schema forbids it (seen after a mid-page truncation)."""
    conn = sqlite3.connect(store / LEDGER_FILE, isolation_level=None)
    conn.execute("PRAGMA writable_schema = ON")  # the only way to break NOT NULL without a damaged disk
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'memories'").fetchone()[0]
    conn.execute(
        "UPDATE sqlite_master SET sql = ? WHERE name = 'memories'",
        (sql.replace("valid_from    REAL NOT NULL", "valid_from    REAL"),),
    )
    conn.close()
    _sql(store, f"UPDATE memories SET valid_from = NULL WHERE id = {OLD}")
    s = open_store(store, create=False)
    try:
        problems = s.verify(None)
    finally:
        s.close()
    assert any("valid_from=None" in p for p in problems), problems


def test_lifecycle_changes_keep_verifying(tmp_path: Path) -> None:
    """Compression, demotion, archiving and supersession change the mutable columns legitimately."""
    from remem_agent.config import RememConfig

    cfg = RememConfig()
    with ReMem(tmp_path / "s", config=cfg) as mem:
        ids = [mem.add(f"note {i} about the deploy pipeline and its many long steps " * 3) for i in range(20)]
        mem.add("The plan is gold.", entity="acme", attribute="plan", timestamp=1)
        mem.add("The plan is platinum now.", entity="acme", attribute="plan", timestamp=2)
        for _ in range(60):
            res = mem.search("deploy pipeline steps", k=5, task="deploy")
            mem.feedback(res.search_id, success=False, used_ids=[])
        states = {mem.get(i).state for i in ids}
        assert states != {State.ACTIVE}  # retention moved them
        assert mem.verify().ok, (states, mem.verify().problems)


def test_backup_while_another_connection_writes(pristine: Path, tmp_path: Path) -> None:
    src = tmp_path / "live"
    shutil.copytree(pristine, src)
    stop = threading.Event()
    acked: list[str] = []

    def writer() -> None:
        with ReMem(src) as w:
            i = 0
            while not stop.is_set():
                acked.append(w.add(f"written during the backup {i}"))
                i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(acked) < 20:
            threading.Event().wait(0.01)
        before = list(acked)
        report = backup_store(src, tmp_path / "copy")
    finally:
        stop.set()
        thread.join()
    assert report["verify_ok"], report["problems"]
    assert report["marker"]
    with ReMem(tmp_path / "copy") as copy, ReMem(src) as live:
        assert copy.verify().ok
        copied = {m.id: m for m in copy.list(limit=None)}
        assert len(copied) >= N_MEMORIES + len(before)
        assert set(before) <= set(copied)  # every write acknowledged before the backup started
        originals = {m.id: m for m in live.list(limit=None)}
        assert all(originals[i] == m for i, m in copied.items())  # a snapshot of the same rows
    assert len(acked) > len(before)  # the writer was not blocked while the backup ran
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "copy").iterdir())


def test_backup_cli_and_its_refusals(pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backup", str(pristine), str(tmp_path / "b1")]) == 0
    out = capsys.readouterr().out
    assert '"verify_ok": true' in out and f'"memories": {N_MEMORIES}' in out
    assert main(["verify", str(tmp_path / "b1")]) == 0
    capsys.readouterr()
    assert main(["backup", str(pristine), str(tmp_path / "b1")]) == 2  # not empty
    assert "not an empty folder" in capsys.readouterr().err
    assert main(["backup", str(tmp_path / "nothing"), str(tmp_path / "b2")]) == 2
    assert "not a remem store" in capsys.readouterr().err
    assert main(["backup", "postgresql://u:secret@db.example:5432/mem", str(tmp_path / "b3")]) == 2
    err = capsys.readouterr().err
    assert "pg_dump" in err and "pg_restore" in err and "secret" not in err
    assert not (tmp_path / "b3").exists()
    # restore: the backup is a store; backing it up again gives a fresh working copy
    assert main(["backup", str(tmp_path / "b1"), str(tmp_path / "restored")]) == 0
    with ReMem(tmp_path / "restored") as mem:
        assert mem.stats().memories == N_MEMORIES and mem.verify().ok


def test_backup_of_a_damaged_store_is_a_typed_error(store: Path, tmp_path: Path) -> None:
    _damage(store, _truncate(lambda size: 0))
    with pytest.raises(StoreError):
        backup_store(store, tmp_path / "b")
    assert not (tmp_path / "b" / LEDGER_FILE).exists()


def test_marker_is_written_atomically(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s"):
        pass
    names = sorted(os.listdir(tmp_path / "s"))
    assert names == [LEDGER_FILE, MARKER_FILE]
