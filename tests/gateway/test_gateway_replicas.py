"""Two ``remem serve`` processes on one PostgreSQL store under a small load with no sticky sessions: every
answer's outcome is settled exactly once, whichever process receives the next turn or the verdict
(``evals/perf/replicas.py``; ``python -m evals.perf.replicas`` is the full load)."""

from __future__ import annotations

import pytest

pytest.importorskip("psycopg")

from evals.perf.replicas import run


def test_two_replicas_settle_every_answer_once(pg_url: str) -> None:
    result = run(pg_url, conversations=16, turns=3, concurrency=6, memories=200)
    assert result["ok"], {k: result[k] for k in ("checks", "statuses", "ledger")}
    assert result["ledger"]["judged"] == result["ledger"]["served_memories"] == 48
    assert min(result["per_gateway_answers"]) > 0
