"""The hash embedder's query embedding, made with fewer numpy calls, gives bit-identical vectors.

``ConceptHashEmbedder`` sums a few texts per cell in a dict (``_embed_exact``) instead of ``np.add.at``
(``_embed_add_at``, kept for batches) and normalises without ``check_vectors``' checks; ``QueryCache`` checks
every embedder's vectors as before. Each is compared with the checked path, bit for bit.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest

from remem_agent.embedders.base import check_vectors
from remem_agent.embedders.cache import QueryCache
from remem_agent.embedders.hash_embedder import ConceptHashEmbedder
from remem_agent.errors import UserInputError


# -- the hash embedder's per-cell sums, and the query cache's normalisation -----------------------------------
def _texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    words = "server host region db deploy owner cache the a of east-1 v2.3 alpha beta gamma delta".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 40))) for _ in range(300)]
    return [*texts, "", "the of a", "host host", "server server server", "x", "  ", "a-b_c.d 1.2.3"]


@pytest.mark.parametrize("bigram_weight", [0.5, 0.0, 1.0, 0.25, -0.5, 0.3, 2.0, 1 / 3])
def test_hash_embedder_exact_sums_equal_the_scatter_add(bigram_weight: float) -> None:
    emb = ConceptHashEmbedder(dim=8 if bigram_weight == 0.5 else 64, bigram_weight=bigram_weight)
    texts = _texts(7)
    raw = emb._embed_add_at(texts)
    if emb._exact_sums:
        exact = emb._embed_exact(texts)
        assert exact is not None and exact.dtype == raw.dtype and exact.tobytes() == raw.tobytes()
    # the normalised vectors, one text at a time (a query), a few (the per-cell path) and all (a batch)
    ref = check_vectors(raw, len(texts), emb.dim)
    assert emb.embed(texts).tobytes() == ref.tobytes()
    for i in range(0, len(texts), 37):
        for got in (emb.embed([texts[i]]), emb.embed(texts[i : i + 3])[:1]):
            assert got.dtype == np.float32 and got.flags.c_contiguous and got.flags.writeable
            assert got.tobytes() == ref[i : i + 1].tobytes()


def test_hash_embedder_cancelled_rows_fall_back_alike() -> None:
    emb = ConceptHashEmbedder(dim=8, bigram_weight=0.0)
    words = [f"w{i}" for i in range(40)]
    cancel = [  # two features in one bucket with opposite signs: the raw text's bucket is used instead
        f"{a} {b}"
        for a in words
        for b in words
        if emb._bucket(a)[0] == emb._bucket(b)[0] and emb._bucket(a)[1] == -emb._bucket(b)[1]
    ]
    assert cancel
    for text in cancel[:20]:
        exact = emb._embed_exact([text, "w1", text])
        assert exact is not None and exact.tobytes() == emb._embed_add_at([text, "w1", text]).tobytes()
        assert emb.embed([text]).tobytes() == check_vectors(emb._embed_add_at([text]), 1, 8).tobytes()


def test_hash_embedder_a_text_too_long_for_exact_sums_takes_the_scatter_add() -> None:
    emb = ConceptHashEmbedder(dim=16)
    text = " ".join(f"w{i % 50}" for i in range(9000))
    assert emb._embed_exact([text]) is None
    assert emb.embed([text]).tobytes() == check_vectors(emb._embed_add_at([text]), 1, 16).tobytes()


def test_query_cache_vector_is_check_vectors_of_the_embedding() -> None:
    emb = ConceptHashEmbedder()
    cache = QueryCache(16)
    for text in _texts(3)[:120]:
        ref = check_vectors(check_vectors(emb._embed_add_at([text]), 1, emb.dim), 1, emb.dim)[0]
        for got in (cache.vector(emb, text), cache.vector(emb, text)):  # a miss, then a hit
            assert got.shape == ref.shape and got.dtype == ref.dtype and got.tobytes() == ref.tobytes()
            assert not got.flags.writeable and got.flags.c_contiguous


def test_query_cache_checks_another_embedders_vectors() -> None:
    class Bad(ConceptHashEmbedder):  # a subclass may return anything: it is checked as before
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            return np.full((len(texts), self.dim), np.nan, dtype=np.float32)

    with pytest.raises(UserInputError):
        QueryCache(4).vector(Bad(), "anything")
