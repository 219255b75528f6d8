"""The ledger's lexical channel alone on the LoCoMo dev conversations, on both backends, beside BM25 baselines.

What it answers: how well the ledger's full-text channel finds evidence on its own, against the strongest
plain lexical retriever, and whether the two backends rank alike. For each conversation every turn is stored
as a ``note`` (text ``"Speaker: text"``, as ``evals.bench.run_locomo`` stores it, with ``speaker`` and
``session`` set), and each scored question (categories 1-4) asks for 10 candidates; evidence recall@5 / @10
is computed as in ``run_locomo``. Rows:

* ``bm25_plain``: ``evals.bench.bm25`` (Okapi BM25, no stemming, no stopwords): a weak reference;
* ``bm25s_snowball_en_stopwords``: ``bm25s`` with Snowball English stemming (``PyStemmer``) and bm25s's
  English stopword list: the standard fair baseline;
* ``bm25s_snowball_ledger_stopwords``: the same with the ledger's stopword list (``lexical.STOPWORDS``);
* ``ledger_sqlite`` / ``ledger_postgres``: ``LedgerTx.lexical_candidates`` (FTS5 porter tokens, the
  ledger's stopwords, FTS5's BM25 arithmetic) on each backend. ``backends_identical`` counts the questions
  whose ranked texts are the same on both.

The tsvector configurations PostgreSQL used before schema 9 were measured by an earlier version of this
script: ``results/locomo/history/lexical_channel_tsvector.json``.

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


def bm25s_ranker(texts: list[str], stopwords: str | list[str], *, k: int = K) -> Ranker:
    """BM25 (``bm25s``, Lucene's variant, k1 1.5, b 0.75) over Snowball-stemmed words (``PyStemmer``) with
    ``stopwords`` removed: the fair lexical baseline. Ids are the texts' positions; a text with no query
    word is not ranked (bm25s returns every document, the unmatched with score 0)."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")

    def tokens(batch: list[str]) -> Any:
        return bm25s.tokenize(batch, stopwords=stopwords, stemmer=stemmer, show_progress=False, return_ids=False)

    retriever = bm25s.BM25()
    retriever.index(tokens(texts), show_progress=False)
    k = min(k, len(texts))

    def rank(q: str) -> list[str]:
        found = retriever.retrieve(tokens([q]), k=k, show_progress=False)
        return [str(int(d)) for d, s in zip(found.documents[0], found.scores[0], strict=True) if s > 0]

    return rank


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
    same = compared = 0
    t0 = time.perf_counter()
    pg_ctx = _postgres() if postgres else None
    make_pg = pg_ctx.__enter__() if pg_ctx is not None else None
    try:
        for sample in samples:
            turns, _ = sample_turns(sample)
            questions, _ = sample_questions(sample, {t["dia"] for t in turns})
            texts = [t["text"] for t in turns]
            by_position = {str(i): {t["dia"]} for i, t in enumerate(turns)}
            bm = BM25(texts)

            def rank_bm25(q: str, bm: BM25 = bm) -> list[str]:
                return [str(i) for i in bm.top_k(q, K)]

            _score(rows, "bm25_plain", rank_bm25, by_position, questions)
            _score(rows, "bm25s_snowball_en_stopwords", bm25s_ranker(texts, "en"), by_position, questions)
            ours = sorted(lexical.STOPWORDS)
            _score(rows, "bm25s_snowball_ledger_stopwords", bm25s_ranker(texts, ours), by_position, questions)
            folder = Path(tempfile.mkdtemp(prefix="remem-lex-")) / "s"
            try:
                with ReMem(folder) as lite:
                    dias = _store_turns(lite, turns)
                    _score(rows, "ledger_sqlite", _ledger_ranker(lite), dias, questions)
                    if make_pg is not None:
                        with ReMem(make_pg()) as pg:
                            pg_dias = _store_turns(pg, turns)
                            _score(rows, "ledger_postgres", _ledger_ranker(pg), pg_dias, questions)
                            # The same turns in the same order: the same texts must come back in one order.
                            text_lite = {m.id: m.text for m in lite.list(limit=None)}
                            text_pg = {m.id: m.text for m in pg.list(limit=None)}
                            for q in questions:
                                a = [text_lite[i] for i in _ledger_ranker(lite)(q["question"])]
                                b = [text_pg[i] for i in _ledger_ranker(pg)(q["question"])]
                                same += a == b
                                compared += 1
            finally:
                shutil.rmtree(folder.parent, ignore_errors=True)
    finally:
        if pg_ctx is not None:
            pg_ctx.__exit__(None, None, None)
    return {
        "benchmark": "lexical_channel_locomo",
        "k": K,
        "conversations": [str(s.get("sample_id")) for s in samples],
        "rows": {name: summarise(r) for name, r in rows.items()},
        "backends_identical": {"questions": compared, "same_ranking": same},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.bench.lexical_channel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="LoCoMo JSON (a list of conversations)")
    ap.add_argument("--no-postgres", action="store_true", help="SQLite and the BM25 baselines only")
    ap.add_argument("--out", default="results/locomo/lexical_channel.json")
    args = ap.parse_args(argv)
    samples = json.loads(Path(args.data).read_text(encoding="utf-8"))
    result = run(samples, postgres=not args.no_postgres)
    write_json(Path(args.out), result, indent=2, sort_keys=True)
    for name, groups in result["rows"].items():
        cells = "  ".join(f"{g} {v['recall@5']:.3f}/{v['recall@10']:.3f}" for g, v in groups.items())
        print(f"{name:<32} {cells}")
    same = result["backends_identical"]
    print(
        f"(recall@5/@10 per group; backends ranked alike on {same['same_ranking']}/{same['questions']}) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
