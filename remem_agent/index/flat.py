"""Exact cosine search over an in-memory numpy matrix (the default backend).

Vectors live in one preallocated float32 matrix that doubles when full, so ingest is amortised
O(1) and a query is one matrix-vector product plus ``argpartition``: no per-row Python loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import EmbeddingError


class FlatIndex:
    """Brute-force inner product over unit vectors; exact, fast to ~1e5-1e6 rows on one core."""

    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self.dim = int(dim)
        self._mat = np.zeros((max(16, capacity), self.dim), dtype=np.float32)
        self._ids: list[str] = []
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def ingest(self, ids: Sequence[str], vectors: NDArray[np.float32]) -> None:
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.ndim != 2 or vecs.shape != (len(ids), self.dim):
            raise EmbeddingError(f"ingest expects shape ({len(ids)}, {self.dim}), got {vecs.shape}")
        need = self._n + len(ids)
        if need > self._mat.shape[0]:
            cap = self._mat.shape[0]
            while cap < need:
                cap *= 2
            grown = np.zeros((cap, self.dim), dtype=np.float32)
            grown[: self._n] = self._mat[: self._n]
            self._mat = grown
        self._mat[self._n : need] = vecs
        self._ids.extend(ids)
        self._n = need

    def candidates(self, query: NDArray[np.float32], k: int) -> tuple[list[str], NDArray[np.float32]]:
        if self._n == 0 or k <= 0:
            return [], np.zeros(0, dtype=np.float32)
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim:
            raise EmbeddingError(f"query has dimension {q.shape[0]}, index has {self.dim}")
        sims = self._mat[: self._n] @ q
        k = min(k, self._n)
        if k < self._n:
            top = np.argpartition(-sims, k - 1)[:k]
            top = top[np.argsort(-sims[top], kind="stable")]
        else:
            top = np.argsort(-sims, kind="stable")
        ids = self._ids
        return [ids[i] for i in top], sims[top].astype(np.float32, copy=False)
