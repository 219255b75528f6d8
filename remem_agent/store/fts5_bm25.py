"""FTS5's ``bm25()`` computed in process from postings: the lexical channel's scores on both backends.

Why: ranking a query's matches inside SQLite costs a ``bm25()`` call per match (the auxiliary function
reads each row's instances and size), about 0.4 ms for the few hundred matches of a typical query at 10k
memories, the largest single cost of a search after the join was gone. The same numbers are cheap to keep:
a word's postings (which memories hold it, how often) change only when a memory is inserted or its text
updated, and queries repeat words. So ``SQLiteTx`` reads postings once through ``fts5vocab`` (the index's
own tokens: nothing is tokenized twice), remembers them under the read cache's rules, and scores here.

The arithmetic is FTS5's (``fts5Bm25Function`` in SQLite's ext/fts5/fts5_aux.c), operation for operation
in double precision and in the same order, so the scores are the same numbers, not approximations:
``idf = log((N - n + 0.5) / (n + 0.5))`` (1e-6 when not positive) with ``N`` the rows of the index and
``n`` the rows holding the phrase; per row ``sum_i idf_i * (f_i * (k1 + 1)) / (f_i + k1 * (1 - b + b * D /
avgdl))`` over the query's phrases in order, ``k1 = 1.2``, ``b = 0.75``, ``D`` the row's token count,
``avgdl`` the index's tokens per row; ``bm25()`` returns the negated sum. tests/store/test_lexical_fts5_bm25.py
compares every score with SQLite's own.

PostgreSQL keeps the same postings in ``memory_terms`` (tokens of the same tokenizer, schema 9) and
scores them here too, so one ledger gets the same lexical scores, bit for bit, on either backend. One
query word is one token (``lexical.query_terms`` keeps no other), so a phrase is never a query's term.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

K1 = 1.2
B = 0.75


@dataclass(frozen=True)
class Postings:
    """The rows (full-text rowids = memory seqs, ascending) holding one token, and how often each does."""

    rows: NDArray[np.int64]
    freq: NDArray[np.float64]


def varints(blob: bytes) -> list[int]:
    """SQLite's variable-length integers (FTS5 stores row sizes and the totals record in them): big-endian
    groups of 7 bits, high bit set on all but the last byte, the 9th byte contributing all 8 bits."""
    out: list[int] = []
    i, n = 0, len(blob)
    while i < n:
        value = 0
        for j in range(9):
            if i >= n:
                raise ValueError("truncated varint")
            byte = blob[i]
            i += 1
            if j == 8:
                value = (value << 8) | byte
                break
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                break
        out.append(value)
    return out


def union(phrases: Sequence[Postings]) -> NDArray[np.int64]:
    """The rows holding any of ``phrases``: distinct, ascending (a phrase's own rows when it is the only one:
    the caller must not write into the result).

    Why not ``np.unique``: a query's matches are at most ``lexical.MAX_MATCHES`` rows, where ``np.unique``'s
    general machinery (hashing, its Python wrapper) cost about four times a plain sort of the concatenated
    postings and a mask of the rows that differ from their predecessor.
    """
    if len(phrases) == 1:
        return phrases[0].rows
    rows = np.concatenate([p.rows for p in phrases])
    rows.sort()
    first = np.empty(len(rows), dtype=bool)
    first[:1] = True
    np.not_equal(rows[1:], rows[:-1], out=first[1:])
    return rows[first]


def scores(
    phrases: Sequence[Postings], *, rows: int, tokens: int, sizes: NDArray[np.float64], docs: NDArray[np.int64]
) -> NDArray[np.float64]:
    """``bm25()`` of each of ``docs`` (``union(phrases)``) for the query of ``phrases`` in order; ``sizes``
    are the docs' token counts, ``rows``/``tokens`` the index's totals.

    Each phrase's term is computed for its own rows only, all phrases in one vectorized pass, and added into
    the docs' sums by ``np.add.at``, which adds element by element in input order: a doc's terms are added
    in phrase order starting from 0.0, exactly as FTS5 sums them. A phrase a doc does not hold adds 0.0 in
    FTS5 (its frequency is 0), and ``x + 0.0 == x`` exactly, so leaving it out changes no bit.
    """
    avgdl = float(tokens) / float(rows)
    idfs: list[float] = []
    for p in phrases:
        n_hit = len(p.rows)
        idf = math.log((rows - n_hit + 0.5) / (n_hit + 0.5))  # libm's log, as SQLite's
        idfs.append(idf if idf > 0.0 else 1e-6)
    if len(phrases) == 1:  # its rows are the docs
        f = phrases[0].freq
        return -(idfs[0] * ((f * (K1 + 1.0)) / (f + K1 * ((1 - B) + B * sizes / avgdl))))
    at = np.searchsorted(docs, np.concatenate([p.rows for p in phrases]))
    f = np.concatenate([p.freq for p in phrases])
    norm = K1 * ((1 - B) + B * sizes[at] / avgdl)
    idf_each = np.repeat(np.array(idfs, dtype=np.float64), [len(p.rows) for p in phrases])
    total = np.zeros(len(docs), dtype=np.float64)
    np.add.at(total, at, idf_each * ((f * (K1 + 1.0)) / (f + norm)))
    return -total


def best_first(scores: NDArray[np.float64], first: int) -> NDArray[np.intp]:
    """Positions of the best ``first`` of ``scores`` (lowest ``bm25()``) in SQLite's order, score ascending
    and then position (the docs are ascending, so that is seq): a prefix of the full order, all of it when
    ``first`` reaches the length.

    Why not sort everything: the caller usually needs only its first window (2 x limit of up to a thousand
    matches). The cut includes every position tied with the ``first``-th score, so the prefix is exact and
    may be longer than ``first``. A stable argsort of the scores is ``np.lexsort((docs, scores))`` when the
    docs ascend.
    """
    if 0 < first < len(scores):
        cut = np.partition(scores, first - 1)[first - 1]
        top = np.flatnonzero(scores <= cut)
        return top[np.argsort(scores[top], kind="stable")]
    return np.argsort(scores, kind="stable")
