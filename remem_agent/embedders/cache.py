"""A bounded LRU of query embeddings: agents repeat questions, retries and re-asks, and with a real
embedder the query embedding is most of a search's time (measured: ~15 ms of ~18 ms).

Keyed by the embedder's identity (name and dimension) and the exact query text that would be embedded,
so a hit returns precisely the vector the embedder would have produced and a store opened with another
embedder never sees a stale vector. Thread-safe; ``maxsize=0`` turns it off.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from remem_agent.embedders.base import Embedder, check_vectors


@dataclass(frozen=True, kw_only=True)
class CacheStats:
    hits: int
    misses: int
    size: int
    maxsize: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class QueryCache:
    def __init__(self, maxsize: int = 1024) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"maxsize must be an integer >= 0, got {maxsize!r}")
        self.maxsize = maxsize
        self._entries: OrderedDict[tuple[str, int, str], NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def vector(self, embedder: Embedder, text: str) -> NDArray[np.float32]:
        """The embedding of ``text`` (one row), from the cache when this embedder already embedded it."""
        key = (embedder.name, embedder.dim, text)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return hit
            self.misses += 1
        vec: NDArray[np.float32] = check_vectors(embedder.embed([text]), 1, embedder.dim, source=embedder.name)[0]
        vec.setflags(write=False)  # shared between searches: nobody may change it in place
        if self.maxsize:
            with self._lock:
                self._entries[key] = vec
                self._entries.move_to_end(key)
                while len(self._entries) > self.maxsize:
                    self._entries.popitem(last=False)
        return vec

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(hits=self.hits, misses=self.misses, size=len(self._entries), maxsize=self.maxsize)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
