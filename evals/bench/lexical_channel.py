"""The ledger's lexical channel alone on the LoCoMo dev conversations, per backend and configuration.

What it answers: which full-text configuration the hybrid retriever should get from the ledger. For each
conversation every turn is stored as a ``note`` (text ``"Speaker: text"``, as ``evals.bench.run_locomo``
stores it, with ``speaker`` and ``session`` set), and each scored question (categories 1-4) asks the
ledger's ``LedgerTx.lexical_candidates`` for 10 candidates; evidence recall@5 / @10 is computed as in
``run_locomo``. Rows:

* ``bm25_reference``: ``evals.bench.bm25`` (plain Okapi BM25 over the same texts, no stemming);
* ``sqlite_fts5``: the SQLite ledger (FTS5 ``bm25()``, ``porter unicode61``, our stopwords);
* ``postgres_english``: the PostgreSQL ledger (idf-weighted ``ts_rank`` over the ``english`` column);
* ``postgres_english_rank_cd``: the same column ranked by ``ts_rank_cd`` of the OR-ed query alone (no idf),
  ad hoc: what the idf weighting adds;
* ``postgres_simple``: the idf-weighted ranking over a ``simple`` tsvector column (no stemming, no
  stopwords) added to the benchmark's throwaway store: the alternative configuration of migration 5.

Usage (the data is not part of the repository; see its README)::

    python -m evals.bench.lexical_channel --data locomo-dev.json [--no-postgres]

Writes ``results/locomo/lexical_channel.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evals.bench.bm25 import BM25
from evals.bench.run_locomo import recall_at, sample_questions, sample_turns
from evals.harness.jsonio import write_json
from remem_agent import MemoryInput, ReMem
from remem_agent.store import lexical

K = 10
CATEGORIES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop"}

Ranker = Callable[[str], list[str]]  # question -> memory ids, best first


def _store_turns(mem: ReMem, turns: list[dict[str, Any]]) -> dict[str, set[str]]:
    items = []
    for t in turns:
        speaker = t["text"].split(":", 1)[0].strip() or None
        items.append(
            MemoryInput(t["text"], role="note", timestamp=t["t"], speaker=speaker, session=t["dia"].split(":")[0])
        )
    mids = mem.add_many(items)
    dias: dict[str, set[str]] = {}
    for t, mid in zip(turns, mids, strict=True):
        dias.setdefault(mid, set()).add(t["dia"])
    return dias


def _ledger_ranker(mem: ReMem) -> Ranker:
    def rank(q: str) -> list[str]:
        with mem.store.read() as tx:
            return [mid for mid, _ in tx.lexical_candidates(q, limit=K, scopes=None)]

    return rank


def _pg_adhoc(mem: ReMem, sql: str, arg: Callable[[list[str]], Any]) -> Ranker:
    def rank(q: str) -> list[str]:
        terms = lexical.query_terms(q)
        if not terms:
            return []
        with mem.store.read() as tx:
            return [str(r[0]) for r in tx.run(sql, (arg(terms), K)).fetchall()]

    return rank


_RANK_CD = (
    "SELECT id FROM memories, to_tsquery('english', ?) q WHERE lexemes @@ q "
    "ORDER BY ts_rank_cd(lexemes, q, 1) DESC, seq LIMIT ?"
)
_SIMPLE = (  # PostgresTx._lexical_query over the throwaway column lexemes_simple (see _add_simple_column)
    "SELECT m.id FROM (SELECT q, ln(1.0 + (n - df + 0.5)::float8 / (df + 0.5)) AS idf FROM ("
    "SELECT q, (SELECT count(*) FROM memories WHERE lexemes_simple @@ q) AS df, n FROM "
    "(SELECT to_tsquery('simple', x) AS q FROM unnest(?::text[]) AS x) qs, "
    "(SELECT COALESCE(MAX(seq), 0) AS n FROM memories) total WHERE numnode(q) > 0) c WHERE df > 0) w "
    "JOIN memories m ON m.lexemes_simple @@ w.q GROUP BY m.id, m.seq "
    "ORDER BY SUM(w.idf * ts_rank(m.lexemes_simple, w.q, 1)) DESC, m.seq LIMIT ?"
)


def _add_simple_column(mem: ReMem) -> None:
    """The 'simple' configuration as migration 5 would have built it, on this benchmark's throwaway store."""
    with mem.store.write() as tx:
        tx.run(
            "ALTER TABLE memories ADD COLUMN lexemes_simple tsvector "
            "GENERATED ALWAYS AS (to_tsvector('simple'::regconfig, left(text, 100000))) STORED"
        )
        tx.run("CREATE INDEX memories_lexemes_simple ON memories USING gin (lexemes_simple)")


def _each(terms: list[str]) -> list[str]:
    return [lexical.pg_tsquery([t]) for t in terms]


@contextmanager
def _postgres() -> Iterator[Callable[[], str]]:
    """A private PostgreSQL (pgserver, as the tests use) and a factory of fresh databases on it."""
    runtime = tempfile.mkdtemp(prefix="remem-pgrun-")
    os.environ.setdefault("XDG_RUNTIME_DIR", runtime)
    import psycopg
    from pgserver.postgres_server import get_server

    folder = tempfile.mkdtemp(prefix="remem-pglex-")
    server = get_server(folder, cleanup_mode="stop")

    def make() -> str:
        name = "lex_" + uuid.uuid4().hex[:12]
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        head, _, query = server.get_uri().partition("?")
        return f"{head.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")

    try:
        yield make
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)


def _score(
    rows: dict[str, list[dict[str, Any]]],
    name: str,
    rank: Ranker,
    dias: dict[str, set[str]],
    questions: list[dict[str, Any]],
) -> None:
    for q in questions:
        ranked = [dias.get(mid, set()) for mid in rank(q["question"])]
        rows.setdefault(name, []).append({"category": q["category"], **recall_at(ranked, q["evidence"])})


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for group in ["overall", *CATEGORIES.values()]:
        sel = [r for r in rows if group == "overall" or CATEGORIES[r["category"]] == group]
        out[group] = {"questions": len(sel)} | {
            m: round(sum(r[m] for r in sel) / len(sel), 4) if sel else None for m in ("recall@5", "recall@10")
        }
    return out


def run(samples: list[dict[str, Any]], *, postgres: bool) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {}
    t0 = time.perf_counter()
    pg_ctx = _postgres() if postgres else None
    make_pg = pg_ctx.__enter__() if pg_ctx is not None else None
    try:
        for sample in samples:
            turns, _ = sample_turns(sample)
            questions, _ = sample_questions(sample, {t["dia"] for t in turns})
            bm = BM25([t["text"] for t in turns])

            def rank_bm25(q: str, bm: BM25 = bm) -> list[str]:
                return [str(i) for i in bm.top_k(q, K)]

            _score(rows, "bm25_reference", rank_bm25, {str(i): {t["dia"]} for i, t in enumerate(turns)}, questions)
            folder = Path(tempfile.mkdtemp(prefix="remem-lex-")) / "s"
            try:
                with ReMem(folder) as mem:
                    dias = _store_turns(mem, turns)
                    _score(rows, "sqlite_fts5", _ledger_ranker(mem), dias, questions)
            finally:
                shutil.rmtree(folder.parent, ignore_errors=True)
            if make_pg is not None:
                with ReMem(make_pg()) as mem:
                    dias = _store_turns(mem, turns)
                    _score(rows, "postgres_english", _ledger_ranker(mem), dias, questions)
                    rank_cd = _pg_adhoc(mem, _RANK_CD, lexical.pg_tsquery)
                    _score(rows, "postgres_english_rank_cd", rank_cd, dias, questions)
                    _add_simple_column(mem)
                    _score(rows, "postgres_simple", _pg_adhoc(mem, _SIMPLE, _each), dias, questions)
    finally:
        if pg_ctx is not None:
            pg_ctx.__exit__(None, None, None)
    return {
        "benchmark": "lexical_channel_locomo",
        "k": K,
        "conversations": [str(s.get("sample_id")) for s in samples],
        "rows": {name: summarise(r) for name, r in rows.items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.bench.lexical_channel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="LoCoMo JSON (a list of conversations)")
    ap.add_argument("--no-postgres", action="store_true", help="SQLite and the BM25 reference only")
    ap.add_argument("--out", default="results/locomo/lexical_channel.json")
    args = ap.parse_args(argv)
    samples = json.loads(Path(args.data).read_text(encoding="utf-8"))
    result = run(samples, postgres=not args.no_postgres)
    write_json(Path(args.out), result, indent=2, sort_keys=True)
    for name, groups in result["rows"].items():
        cells = "  ".join(f"{g} {v['recall@5']:.3f}/{v['recall@10']:.3f}" for g, v in groups.items())
        print(f"{name:<22} {cells}")
    print(f"(recall@5/@10 per group) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
