"""FAISS index backend: exact inner product by default, HNSW as an option.

Vectors are L2-normalised, so inner product is cosine similarity. FAISS addresses rows by position;
this backend keeps the position <-> memory-id mapping. Re-ingesting an id replaces its vector: the
old row is tombstoned (FAISS flat/HNSW indexes cannot delete cheaply) and skipped at query time.
Install with ``pip install 'remem-agent[faiss]'``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from remem_agent._extras import require
from remem_agent.embedders.base import check_vectors
from remem_agent.errors import EmbeddingError, UserInputError

IndexKind = Literal["flat", "hnsw"]


def _faiss() -> Any:
    return require("faiss", "faiss", feature="FaissBackend")


def _empty() -> tuple[list[str], NDArray[np.float32]]:
    return [], np.zeros((0,), dtype=np.float32)


def _query_row(query: NDArray[np.float32], dim: int, source: str) -> NDArray[np.float32]:
    arr = np.asarray(query, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[0] != 1:
        raise EmbeddingError(f"{source}: query must have shape ({dim},) or (1, {dim}), got {arr.shape}")
    return check_vectors(arr, 1, dim, source=f"{source} query")


def _check_ids(ids: Sequence[str], n_rows: int) -> list[str]:
    if isinstance(ids, str):
        raise UserInputError("ids must be a sequence of strings, not a single string")
    out = list(ids)
    if len(out) != n_rows:
        raise UserInputError(f"got {len(out)} ids for {n_rows} vectors")
    for memory_id in out:
        if not isinstance(memory_id, str) or not memory_id:
            raise UserInputError(f"memory ids must be non-empty strings, got {memory_id!r}")
    if len(set(out)) != len(out):
        raise UserInputError("ids repeat within one ingest batch")
    return out


class FaissBackend:
    """Candidate generation with FAISS.

    Args:
        dim: vector width.
        kind: ``"flat"`` (``IndexFlatIP``, exact) or ``"hnsw"`` (``IndexHNSWFlat`` with the
            inner-product metric, approximate and faster on large stores).
        hnsw_m, ef_construction, ef_search: HNSW parameters (ignored for ``"flat"``); the search
            breadth is never below the number of results asked for.
    """

    def __init__(
        self,
        dim: int,
        *,
        kind: IndexKind = "flat",
        hnsw_m: int = 32,
        ef_construction: int = 200,
        ef_search: int = 128,
    ) -> None:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
            raise UserInputError(f"dim must be a positive integer, got {dim!r}")
        if kind not in ("flat", "hnsw"):
            raise UserInputError(f"kind must be 'flat' or 'hnsw', got {kind!r}")
        if hnsw_m <= 0 or ef_construction <= 0 or ef_search <= 0:
            raise UserInputError("hnsw_m, ef_construction and ef_search must be positive")
        self._faiss = _faiss()
        self._dim = dim
        self._kind: IndexKind = kind
        self._hnsw_m = hnsw_m
        self._ef_construction = ef_construction
        self._ef_search = ef_search
        self._index: Any = self._new_index()
        self._ids: list[str] = []  # FAISS row position -> memory id
        self._pos: dict[str, int] = {}  # memory id -> live row position
        self._stale: set[int] = set()  # row positions replaced by a later ingest
        self._lock = threading.RLock()

    def _new_index(self) -> Any:
        if self._kind == "flat":
            return self._faiss.IndexFlatIP(self._dim)
        index = self._faiss.IndexHNSWFlat(self._dim, self._hnsw_m, self._faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self._ef_construction
        index.hnsw.efSearch = self._ef_search
        return index

    def _compact(self) -> None:
        """Rebuild without tombstoned rows once they outnumber the live ones."""
        live = sorted(self._pos.items(), key=lambda item: item[1])
        old_rows = np.asarray([row for _, row in live], dtype=np.int64)
        vectors = self._index.reconstruct_n(0, len(self._ids))[old_rows] if len(live) else None
        index = self._new_index()
        if vectors is not None:
            index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        self._index = index
        self._ids = [memory_id for memory_id, _ in live]
        self._pos = {memory_id: row for row, memory_id in enumerate(self._ids)}
        self._stale = set()

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def kind(self) -> IndexKind:
        return self._kind

    def __len__(self) -> int:
        return len(self._pos)

    def __contains__(self, memory_id: object) -> bool:
        return memory_id in self._pos

    def __repr__(self) -> str:
        return f"FaissBackend(dim={self._dim}, kind={self._kind!r}, size={len(self)})"

    def ingest(self, ids: Sequence[str], vectors: NDArray[np.float32]) -> None:
        arr = np.asarray(vectors, dtype=np.float32)
        n = arr.shape[0] if arr.ndim >= 1 else -1
        id_list = _check_ids(ids, n)
        if not id_list:
            return
        rows = check_vectors(arr, len(id_list), self._dim, source="FaissBackend.ingest")
        with self._lock:
            start = len(self._ids)
            self._index.add(rows)
            for offset, memory_id in enumerate(id_list):
                old = self._pos.get(memory_id)
                if old is not None:
                    self._stale.add(old)
                self._pos[memory_id] = start + offset
                self._ids.append(memory_id)
            if len(self._stale) > max(1024, len(self._pos)):
                self._compact()

    def candidates(self, query: NDArray[np.float32], k: int) -> tuple[list[str], NDArray[np.float32]]:
        if not isinstance(k, int | np.integer) or isinstance(k, bool):
            raise UserInputError(f"k must be an integer, got {k!r}")
        q = _query_row(query, self._dim, "FaissBackend")
        with self._lock:
            total = len(self._ids)
            if k <= 0 or not self._pos:
                return _empty()
            fetch = min(int(k) + len(self._stale), total)
            if self._kind == "hnsw":
                params = self._faiss.SearchParametersHNSW()
                params.efSearch = max(self._ef_search, fetch)
                sims, rows = self._index.search(q, fetch, params=params)
            else:
                sims, rows = self._index.search(q, fetch)
            out_ids: list[str] = []
            out_sims: list[float] = []
            for row, sim in zip(rows[0].tolist(), sims[0].tolist(), strict=True):
                if row < 0 or row in self._stale:  # -1 is FAISS padding when fewer hits exist
                    continue
                out_ids.append(self._ids[row])
                out_sims.append(sim)
                if len(out_ids) == k:
                    break
        return out_ids, np.asarray(out_sims, dtype=np.float32)


__all__ = ["FaissBackend", "IndexKind"]
