"""The shortcuts of ``ReMem.add_many``'s path give what the long way gives.

Each shortcut skips work a profile of the batched add showed (``evals.perf.core``, hash embedder, SQLite); each
test compares it with the computation it replaces, or checks the property it must keep.
"""

from __future__ import annotations

import random

import pytest

from remem_agent.embedders import hashing
from remem_agent.embedders.hashing import ConceptHashEmbedder


def _texts(seed: int, n: int = 200) -> list[str]:
    rng = random.Random(seed)
    words = "server host region db deploy owner cache the a of east-1 v2.3 alpha beta gamma delta".split()
    words += [f"w{i}" for i in range(300)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 30))) for _ in range(n)] + ["the of a", ""]


# -- the hash embedder's feature memo ----------------------------------------------------------------------
def test_remembered_buckets_are_the_hashed_ones_and_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashing, "_MEMO", 150)
    warm = ConceptHashEmbedder(dim=64)
    warm.embed(_texts(1))  # fills the memo (to its bound) with features that the texts below share
    texts = _texts(2)
    assert warm.embed(texts).tobytes() == ConceptHashEmbedder(dim=64).embed(texts).tobytes()
    assert len(warm._buckets) == 150
    for feature, remembered in warm._buckets.items():
        assert remembered == warm._bucket_uncached(feature)
