"""The query-embedding cache: hits give the very vector the embedder gives, bounded LRU eviction, keyed by the
embedder's identity (no stale vector after the embedder changes), and search results unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from remem_agent import ReMem, RememConfig
from remem_agent.embedders.cache import QueryCache
from remem_agent.embedders.hash_embedder import ConceptHashEmbedder


class _Counting(ConceptHashEmbedder):
    def __init__(self, dim: int = 256, tag: str = "") -> None:
        super().__init__(dim=dim)
        self.calls = 0
        self._tag = tag

    @property
    def name(self) -> str:
        return super().name + self._tag

    def embed(self, texts):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().embed(texts)


def test_hits_return_the_embedders_own_vector_and_eviction_is_lru() -> None:
    emb, cache = _Counting(), QueryCache(maxsize=2)
    a = cache.vector(emb, "where is the server")
    assert np.array_equal(a, emb.embed(["where is the server"])[0]) and emb.calls == 2
    assert cache.vector(emb, "where is the server") is a and emb.calls == 2  # a hit: no embedding
    cache.vector(emb, "who is on call")
    cache.vector(emb, "where is the server")  # refreshes a
    cache.vector(emb, "third question")  # evicts "who is on call", the least recently used
    assert cache.stats().size == 2
    calls = emb.calls
    cache.vector(emb, "who is on call")
    assert emb.calls == calls + 1  # it was evicted
    with pytest.raises(ValueError):
        a[0] = 1.0  # shared vectors are read-only
    st = cache.stats()
    assert st.hits == 2 and st.misses == 4 and 0 < st.hit_rate < 1


def test_another_embedder_never_gets_a_cached_vector_of_the_first() -> None:
    cache = QueryCache()
    one, other = _Counting(tag="-a"), _Counting(dim=128, tag="-b")
    v1, v2 = cache.vector(one, "same text"), cache.vector(other, "same text")
    assert v1.shape == (256,) and v2.shape == (128,) and one.calls == other.calls == 1


def test_search_with_the_cache_serves_what_it_serves_without(tmp_path: Path) -> None:
    results = []
    for size in (0, 1024):
        with ReMem(tmp_path / f"s{size}", config=RememConfig(query_cache_size=size)) as mem:
            mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=1)
            mem.add("The team lunch is on Fridays.", role="note", timestamp=1)
            got = [mem.search("Where is our server?", now=2).ids for _ in range(3)]
            results.append([[mem.get(i).text for i in ids] for ids in got])
            assert mem.query_cache.stats().hits == (0 if size == 0 else 2)
    assert results[0] == results[1]
