"""The in-process lexical channel orders only its first window of matches (``fts5_bm25.best_first``) and orders the
rest when filters leave that window short: the answer must be the full sort's, with ties at the window's
edge, and its scores the dense per-phrase sums' to the bit (``fts5_bm25.union``/``fts5_bm25.scores``)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from _sqlite_trace import traced

from remem_agent import ReMem
from remem_agent.store import fts5_bm25
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sqlite_tx import SQLiteTx


def _dense_scores(
    phrases: list[fts5_bm25.Postings], rows: int, tokens: int, sizes: np.ndarray, docs: np.ndarray
) -> np.ndarray:
    """FTS5's sum as it was computed before: every phrase over every doc (0 where the doc lacks it)."""
    avgdl = float(tokens) / float(rows)
    norm = fts5_bm25.K1 * ((1 - fts5_bm25.B) + fts5_bm25.B * sizes / avgdl)
    total = np.zeros(len(docs), dtype=np.float64)
    for p in phrases:
        idf = math.log((rows - len(p.rows) + 0.5) / (len(p.rows) + 0.5))
        idf = idf if idf > 0.0 else 1e-6
        f = np.zeros(len(docs), dtype=np.float64)
        f[np.searchsorted(docs, p.rows)] = p.freq
        total = total + idf * ((f * (fts5_bm25.K1 + 1.0)) / (f + norm))
    return -1.0 * total


def _posting(rng: random.Random, universe: int) -> fts5_bm25.Postings:
    rows = sorted(rng.sample(range(1, universe), rng.randint(1, min(60, universe - 1))))
    return fts5_bm25.Postings(
        rows=np.array(rows, dtype=np.int64), freq=np.array([rng.choice([1, 1, 2, 3]) for _ in rows], dtype=np.float64)
    )


def test_union_and_scores_are_the_dense_sums_bit_for_bit() -> None:
    rng = random.Random(11)
    for _ in range(300):
        universe = rng.choice([5, 40, 2000])
        phrases = [_posting(rng, universe) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.2:  # two query words of one token: the same postings twice
            phrases.append(phrases[0])
        docs = fts5_bm25.union(phrases)
        assert docs.tolist() == np.unique(np.concatenate([p.rows for p in phrases])).tolist()
        sizes = np.array([rng.randint(1, 50) for _ in range(len(docs))], dtype=np.float64)
        rows, tokens = universe + rng.randint(0, 10), rng.randint(universe, 30 * universe)
        got = fts5_bm25.scores(phrases, rows=rows, tokens=tokens, sizes=sizes, docs=docs)
        assert got.tobytes() == _dense_scores(phrases, rows, tokens, sizes, docs).tobytes()


def test_best_first_is_a_prefix_of_the_full_order_with_every_tie() -> None:
    rng = random.Random(4)
    for _ in range(500):
        n = rng.randint(1, 300)
        levels = rng.randint(1, 6)  # few distinct scores: ties everywhere, at the cut too
        scores = np.array([-float(rng.randint(1, levels)) for _ in range(n)], dtype=np.float64)
        docs = np.arange(n, dtype=np.int64) * 3 + 1
        full = np.lexsort((docs, scores)).tolist()  # SQLite's ORDER BY score, seq
        first = rng.choice([1, 2, rng.randint(1, n), n, n + 5])
        got = fts5_bm25.best_first(scores, first).tolist()
        assert got == full[: len(got)]
        assert len(got) >= min(first, n)
        if len(got) < n:  # it stopped exactly after the last doc tied with the first-th score
            assert scores[full[len(got) - 1]] == scores[full[min(first, n) - 1]] < scores[full[len(got)]]


@pytest.mark.parametrize("current_only", [False, True])
def test_a_filtered_first_window_falls_back_to_the_full_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, current_only: bool
) -> None:
    """The best matches are in another scope (and the window's edge falls inside a run of ties): the first
    window is filtered away, the remaining order is computed, and the answer is SQLite's."""
    mem = ReMem(tmp_path / "store")
    mem.add_many([f"quartz y{i}" for i in range(3)], scope="bob")  # best (short texts)
    mem.add_many([f"quartz maple x{i}" for i in range(5)], scope="bob")  # tied, across the window's edge
    alice = mem.add_many([f"quartz maple river z{i}" for i in range(6)], scope="alice")
    mem.add_many([f"quartz maple river stone w{i}" for i in range(4)], scope="alice")
    with mem.store.write() as tx:
        tx.transition(alice[1], LifecycleEvent.INVALIDATE, reason="t", at=2e9)
    calls: list[tuple[int, int]] = []
    real = fts5_bm25.best_first

    def spy(scores: np.ndarray, first: int) -> np.ndarray:
        out = real(scores, first)
        calls.append((first, len(out)))
        return out

    monkeypatch.setattr(fts5_bm25, "best_first", spy)
    with mem.store.read() as tx:
        assert isinstance(tx, SQLiteTx)
        for scopes, limit in [(frozenset({"alice"}), 2), (frozenset({"alice"}), 9), (None, 2), (None, 30)]:
            calls.clear()
            with traced(tx) as statements:
                got = tx.lexical_candidates("quartz", limit=limit, scopes=scopes, current_only=current_only)
            assert not any("bm25(" in s for s in statements)  # ranked in process
            want = SQLiteTx(tx.c, None).lexical_candidates(
                "quartz", limit=limit, scopes=scopes, current_only=current_only
            )
            assert got == want, (scopes, limit)  # ids, order and float scores exactly
            if scopes is not None and limit == 2:
                # window 4 ends inside the 5 tied docs: all 8 bob docs ordered first, then everything
                assert calls == [(4, 8), (18, 18)]
    mem.close()
