"""Exact cosine search over an in-memory numpy matrix (the default backend).

Vectors live in one preallocated float32 matrix that doubles when full, so ingest is amortised
O(1) and a query is one matrix-vector product plus ``argpartition``: no per-row Python loop.

The matrix is stored column-major (one contiguous row of the array per embedding dimension, a column
per memory). Why: a search is memory-bound once the matrix is out of cache (the ledger's reads between
two searches evict it), and OpenBLAS streams the column-major product about twice as fast cold (10k x 384:
0.55 ms vs 1.08 ms; 100k x 256: 4.1 ms vs 9.9 ms, one thread, cache evicted before each query). It also
lets a sparse query (the hash embedder's: about 9 non-zero of 256 dimensions) read only its own
dimensions' rows: 10k x 256 cold, 0.09 ms instead of 0.83 ms, exactly the same top k up to float32
rounding of the sum (terms that are zero add nothing).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import EmbeddingError

_blas_controller: Any = None


# A query with at most this share of non-zero dimensions is scored on those dimensions only.
SPARSE_QUERY_SHARE = 0.25


def _scores(
    cols: NDArray[np.float32], q: NDArray[np.float32], threads: int | None, which: slice | list[int]
) -> NDArray[np.float32]:
    """The inner product with ``q`` of the columns ``which`` of ``cols`` (dimensions x memories): on the
    query's non-zero dimensions only when it has few of them (``SPARSE_QUERY_SHARE``), else the whole
    product. Only the rows (dimensions) used are read, so a handful of columns costs a handful of reads."""
    nz = np.flatnonzero(q)
    if len(nz) <= SPARSE_QUERY_SHARE * len(q):
        if len(nz) == 0:
            return np.zeros(len(cols[0, which]), dtype=np.float32)
        block = cols[nz, which] if isinstance(which, slice) else cols[np.ix_(nz, np.asarray(which, dtype=np.intp))]
        return _matvec(block, q[nz], threads)
    return _matvec(cols[:, which], q, threads)


def _matvec(cols: NDArray[np.float32], q: NDArray[np.float32], threads: int | None) -> NDArray[np.float32]:
    """``q @ cols`` with BLAS limited to ``threads`` (through ``threadpoolctl``; unlimited without it).

    One query is a memory-bound matrix-vector product. Two OpenBLAS threads make it faster on an idle
    box (100k x 256: 2.1 ms vs 3.1 ms) but, when other processes hold the cores, it waits a whole
    scheduler slice for a descheduled worker: matvec p95 went from 0.17 ms to 8 ms at 10k rows on a
    loaded 2-core box, and idle workers spin, doubling the CPU a search costs. Shared with several busy
    processes, two threads were far slower than one at 10k x 384. So ``FlatIndex``
    limits BLAS to one thread by default; ``blas_threads=None`` leaves BLAS as it is (the idle-box p50).
    With the column-major product BLAS may split one memory's sum across threads, so with more than one
    thread a score can differ in float32's last bit (1.5e-8 seen) and an exact tie at the k-th place could
    break the other way; with the default single thread a store serves the same on every run
    (tests/index/test_flat_index.py).
    """
    global _blas_controller
    if threads is None:
        return q @ cols
    if _blas_controller is None:
        try:
            from threadpoolctl import ThreadpoolController

            # The BLAS libraries' controllers, found once: ``ThreadpoolController.limit`` inspects every loaded
            # library again on each call (~30 us in a search's profile, a tenth of the similarity-only path).
            _blas_controller = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
        except ImportError:
            _blas_controller = []
    before = [c.num_threads for c in _blas_controller]  # read each time: the caller may have changed them
    changed = [c for c, n in zip(_blas_controller, before, strict=True) if n != threads]
    for c in changed:
        c.set_num_threads(threads)
    try:
        return q @ cols
    finally:
        for c, n in zip(_blas_controller, before, strict=True):
            if c in changed:
                c.set_num_threads(n)


class Scan:
    """One query's scan of a ``FlatIndex``: its top rows, and the score of every row it scanned."""

    __slots__ = ("_all", "_row", "ids", "sims")

    def __init__(
        self, ids: list[str], sims: NDArray[np.float32], scores: NDArray[np.float32], rows: dict[str, int]
    ) -> None:
        self.ids, self.sims, self._all, self._row = ids, sims, scores, rows

    def similarities(self, ids: Sequence[str]) -> dict[str, float]:
        """The scan's score of each of ``ids`` it covered (rows ingested since are left out)."""
        n, row = len(self._all), self._row
        found = [(mid, r) for mid in ids if (r := row.get(mid)) is not None and r < n]
        if not found:
            return {}
        # one gather and one conversion (float32 -> float is exact), not a numpy scalar per id
        values = self._all[[r for _, r in found]].tolist()
        return {mid: v for (mid, _), v in zip(found, values, strict=True)}


class FlatIndex:
    """Brute-force inner product over unit vectors; exact, fast to ~1e5-1e6 rows on one core.

    Rows may carry a group label (``ReMem`` passes the memory's scope): ``candidates(..., groups=)`` then
    ranks only rows of those groups, inside the one scan it does anyway, so a small scope in a large
    store costs no more than the whole store and never needs the pool widened.
    """

    def __init__(self, dim: int, capacity: int = 1024, *, blas_threads: int | None = 1) -> None:
        self.dim = int(dim)
        self.blas_threads = blas_threads
        self._cols = np.zeros((self.dim, max(16, capacity)), dtype=np.float32)  # dimensions x memories
        self._group = np.zeros(max(16, capacity), dtype=np.int32)
        self._codes: dict[str, int] = {}
        self._ids: list[str] = []
        self._row: dict[str, int] = {}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def ingest(self, ids: Sequence[str], vectors: NDArray[np.float32], groups: Sequence[str] | None = None) -> None:
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.ndim != 2 or vecs.shape != (len(ids), self.dim):
            raise EmbeddingError(f"ingest expects shape ({len(ids)}, {self.dim}), got {vecs.shape}")
        if groups is not None and len(groups) != len(ids):
            raise EmbeddingError(f"ingest got {len(groups)} group labels for {len(ids)} rows")
        need = self._n + len(ids)
        if need > self._cols.shape[1]:
            cap = self._cols.shape[1]
            while cap < need:
                cap *= 2
            grown = np.zeros((self.dim, cap), dtype=np.float32)
            grown[:, : self._n] = self._cols[:, : self._n]
            self._cols = grown
            grown_groups = np.zeros(cap, dtype=np.int32)
            grown_groups[: self._n] = self._group[: self._n]
            self._group = grown_groups
        self._cols[:, self._n : need] = vecs.T
        if groups is not None:
            self._group[self._n : need] = [self._codes.setdefault(g, len(self._codes)) for g in groups]
        self._row.update((mid, self._n + j) for j, mid in enumerate(ids))
        self._ids.extend(ids)
        self._n = need

    def discard(self, ids: Iterable[str]) -> None:
        """Zero the vectors of ``ids`` (erased memories): they stay rows, so that every later row keeps its
        place, and score 0 against any query; unknown ids are ignored."""
        rows = [r for mid in ids if (r := self._row.get(mid)) is not None]
        if rows:
            self._cols[:, rows] = 0.0

    def similarities(self, query: NDArray[np.float32], ids: Sequence[str]) -> dict[str, float]:
        """The inner product of ``query`` with each of ``ids`` this index holds (for a fused pool's lexical-only
        candidates, whose cosine the top-k scan did not return)."""
        rows = [(mid, r) for mid in ids if (r := self._row.get(mid)) is not None]
        if not rows:
            return {}
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim:
            raise EmbeddingError(f"query has dimension {q.shape[0]}, index has {self.dim}")
        vals = _scores(self._cols, q, None, [r for _, r in rows])
        return {mid: float(v) for (mid, _), v in zip(rows, vals, strict=True)}

    def candidates(
        self, query: NDArray[np.float32], k: int, *, groups: Collection[str] | None = None
    ) -> tuple[list[str], NDArray[np.float32]]:
        """The ``k`` most similar rows (of ``groups`` only, when given), best first."""
        scan = self.scan(query, k, groups=groups)
        return scan.ids, scan.sims

    def scan(self, query: NDArray[np.float32], k: int, *, groups: Collection[str] | None = None) -> Scan:
        """``candidates``, keeping the scan's score of every row: a fused pool's lexical-only candidates read
        their cosines from it (``Scan.similarities``) instead of gathering their columns again (a column of
        the column-major matrix is one float per cache line: 40 of them at 384 dimensions cost ~0.2 ms)."""
        if self._n == 0 or k <= 0:
            return Scan([], np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.float32), {})
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim:
            raise EmbeddingError(f"query has dimension {q.shape[0]}, index has {self.dim}")
        n = self._n
        sims = _scores(self._cols, q, self.blas_threads, slice(0, n))
        if groups is not None:
            codes = [self._codes[g] for g in groups if g in self._codes]
            if len(codes) < len(self._codes):  # some rows belong to other groups: rank only the asked ones
                keep = np.flatnonzero(np.isin(self._group[:n], codes))
                return Scan(*self._top(sims[keep], k, keep), sims, self._row)
        return Scan(*self._top(sims, k, None), sims, self._row)

    def _top(
        self, sims: NDArray[np.float32], k: int, rows: NDArray[np.intp] | None
    ) -> tuple[list[str], NDArray[np.float32]]:
        n = len(sims)
        if n == 0:
            return [], np.zeros(0, dtype=np.float32)
        k = min(k, n)
        if k < n:
            # A sparse query shares no dimension with most rows: when at least k scores are positive and
            # they are few, the top k are among them, and partitioning only those is several times
            # cheaper than partitioning every row (10k rows: about 0.15 ms).
            above = sims > 0
            if k <= np.count_nonzero(above) <= n // 8:  # counted: the positions are needed only here
                positive = np.flatnonzero(above)
                part = positive[np.argpartition(-sims[positive], k - 1)[:k]]
                top = part[np.argsort(-sims[part], kind="stable")]
            else:
                # Keep ``-sims`` with a small kth: hash-embedder scores are heavily tied (a third exact 0.0), and
                # ``argpartition(sims, n - k)`` then hits numpy's slow introselect path (p95 2.9 ms at 100k).
                neg = -sims
                top = np.argpartition(neg, k - 1)[:k]
                top = top[np.argsort(neg[top], kind="stable")]  # neg[top] is -sims[top]: negation is exact
        else:
            top = np.argsort(-sims, kind="stable")
        ids = self._ids
        picked = top if rows is None else rows[top]
        return [ids[i] for i in picked.tolist()], sims[top].astype(np.float32, copy=False)  # Python ints index faster
