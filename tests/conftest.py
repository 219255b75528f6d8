"""Shared fixtures: a private PostgreSQL server (pgserver, with pgvector) and backend-parametrised stores.

The server starts once per test session in a temporary folder; every test that asks for a
PostgreSQL store gets a fresh database, so tests never see each other's rows. Nothing here skips:
when pgserver or psycopg are missing the PostgreSQL tests fail, because CI must run them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

StoreLocation = Callable[[str], "str | Path"]

# Hypothesis profiles for the property tests that do not pin their own size (test_bad_input_properties.py):
# "ci" (default) keeps the suite quick; HYPOTHESIS_PROFILE=nightly runs many more examples per property.
settings.register_profile("ci", max_examples=300, deadline=None)
settings.register_profile("nightly", max_examples=10_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """One PostgreSQL 16 + pgvector instance for the whole session (stopped and removed at the end).

    The data folder is not under pytest's tmp root: pgserver runs postgres as its own user and opens
    up the parent folders, which a concurrent pytest session may lock down again (seen as
    "pg_ctl: could not access directory ... Permission denied").
    """
    # pgserver asks platformdirs for a runtime folder; without XDG_RUNTIME_DIR that warns on every run.
    runtime = tempfile.mkdtemp(prefix="remem-pgrun-")
    os.environ.setdefault("XDG_RUNTIME_DIR", runtime)
    import pgserver

    folder = tempfile.mkdtemp(prefix="remem-pgtest-")
    server = pgserver.get_server(folder, cleanup_mode="stop")
    try:
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _with_db(uri: str, db: str) -> str:
    """pgserver's URI (``postgresql://postgres:@/postgres?host=...``) pointed at database ``db``."""
    head, _, query = uri.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{db}" + (f"?{query}" if query else "")


@pytest.fixture()
def pg_url_factory(pg_server: Any) -> Callable[[], str]:
    """Creates a fresh, empty database per call and returns its URL."""
    import psycopg

    def make() -> str:
        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return _with_db(pg_server.get_uri(), name)

    return make


@pytest.fixture()
def pg_url(pg_url_factory: Callable[[], str]) -> str:
    return pg_url_factory()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture()
def store_location(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> StoreLocation:
    """``store_location(name)``: where the store called ``name`` lives on this test's backend.

    The same name gives the same store (so tests can reopen it); SQLite stores are folders under
    ``tmp_path``, PostgreSQL stores are fresh databases on the session's server.
    """
    made: dict[str, str | Path] = {}

    def loc(name: str) -> str | Path:
        if name not in made:
            if backend == "sqlite":
                made[name] = tmp_path / name
            else:
                made[name] = request.getfixturevalue("pg_url_factory")()
        return made[name]

    return loc


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say loudly when the headless-Chromium dashboard tests did not run (a silent skip hid them)."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "chromium not installed" in _skip_reason(r)]
    if not skipped:
        return
    terminalreporter.write_sep("!", "dashboard browser tests NOT run", yellow=True, bold=True)
    terminalreporter.write_line(
        f"{len(skipped)} headless-Chromium dashboard test(s) were skipped because /usr/bin/chromium is missing; "
        "the dashboard's script and escaping were not checked in a browser.",
        yellow=True,
    )
    terminalreporter.write_line("Install it (Debian/Ubuntu: apt-get install chromium) and rerun tests/viz/test_viz.py.")
