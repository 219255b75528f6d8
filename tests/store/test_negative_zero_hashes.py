"""A negative zero in a hashed record verifies on both backends.

Why: PostgreSQL's jsonb stores numbers as ``numeric``, which has no -0.0, so a served similarity rounded to
-0.0 was read back as 0.0 and ``verify()`` reported the search record as edited (one of 2,000 searches in a
run of ``evals.perf.postgres``, 4 workers). Hashes now fold -0.0 into 0.0; a SQLite row hashed before that
(its JSON text keeps "-0.0") still verifies, and a real sign flip is still caught.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from remem_agent import ReMem
from remem_agent.store import hashing

StoreLocation = Callable[[str], "str | Path"]


def _served(mid: str, sim: float) -> list[dict[str, object]]:
    return [{"id": mid, "rank": 1, "score": 0.5, "similarity": sim, "f": [-0.0, 1.0, -0.05]}]


def test_a_search_record_with_negative_zeros_verifies(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        mid = mem.add("The billing service runs in region eu-west-1.")
        with mem.store.write() as tx:
            tx.insert_search(
                "s_negzero",
                at=1.7e9,
                query="where",
                task=None,
                as_of=None,
                now=1.7e9,
                token_budget=None,
                served=_served(mid, -0.0),
            )
        report = mem.verify()
        assert report.ok, report.problems


def test_a_sqlite_row_hashed_before_the_folding_still_verifies_and_a_sign_flip_is_caught(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        mid = mem.add("The billing service runs in region eu-west-1.")
        served = _served(mid, -0.0)
        with mem.store.write() as tx, hashing._signed_zeros():  # as an earlier version wrote it
            tx.insert_search(
                "s_old", at=1.7e9, query="where", task=None, as_of=None, now=1.7e9, token_budget=None, served=served
            )
        with mem.store.read() as tx:
            stored = tx.run("SELECT hash FROM searches WHERE search_id = 's_old'").fetchone()[0]
        assert stored != hashing.search_hash("s_old", 1.7e9, "where", None, None, 1.7e9, None, served)
        assert mem.verify().ok
    # -0.05 -> 0.05 in the stored JSON is an edit, not a zero's sign
    con = sqlite3.connect(tmp_path / "s" / "ledger.db")
    text = con.execute("SELECT served FROM searches WHERE search_id = 's_old'").fetchone()[0]
    triggers = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
    for name in triggers:
        con.execute(f'DROP TRIGGER "{name}"')
    con.execute("UPDATE searches SET served = ? WHERE search_id = 's_old'", (text.replace("-0.05", "0.05"),))
    con.commit()
    con.close()
    with ReMem(tmp_path / "s") as mem:
        problems = mem.verify().problems
    assert any("s_old" in p and "edited" in p for p in problems), problems
