"""FAISS and Chroma index backends against a brute-force numpy cosine top-k."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from remem_agent.errors import EmbeddingError, UserInputError
from remem_agent.index.base import IndexBackend

N, DIM = 500, 32
TIE = 1e-5


def unit_rows(rng: np.random.Generator, n: int, dim: int = DIM) -> NDArray[np.float32]:
    x = rng.normal(size=(n, dim)).astype(np.float32)
    out: NDArray[np.float32] = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return out


def brute_force(
    ids: list[str], vectors: NDArray[np.float32], query: NDArray[np.float32], k: int
) -> tuple[list[str], NDArray[np.float32]]:
    sims = (vectors.astype(np.float64) @ query.astype(np.float64)).astype(np.float32)
    order = np.argsort(-sims, kind="stable")[:k]
    return [ids[i] for i in order], sims[order]


def assert_matches_brute_force(
    got_ids: list[str],
    got_sims: NDArray[np.float32],
    ids: list[str],
    vectors: NDArray[np.float32],
    query: NDArray[np.float32],
    k: int,
) -> None:
    want_ids, want_sims = brute_force(ids, vectors, query, k)
    assert isinstance(got_sims, np.ndarray)
    assert got_sims.dtype == np.float32
    assert len(got_ids) == len(got_sims) == len(want_ids)
    assert len(set(got_ids)) == len(got_ids)
    np.testing.assert_allclose(got_sims, want_sims, atol=TIE)
    true_sim = dict(zip(ids, (vectors @ query).tolist(), strict=True))
    for i, (got, want) in enumerate(zip(got_ids, want_ids, strict=True)):
        # each returned similarity is the real cosine of the returned id ...
        assert abs(true_sim[got] - float(got_sims[i])) <= TIE
        # ... and the id is the brute-force one at that rank, unless the rank is a tie
        tied = (i > 0 and abs(want_sims[i] - want_sims[i - 1]) <= TIE) or (
            i + 1 < len(want_sims) and abs(want_sims[i] - want_sims[i + 1]) <= TIE
        )
        if not tied:
            assert got == want, f"rank {i}: got {got}, brute force says {want}"


def make_faiss_flat(tmp: Path) -> IndexBackend:
    mod = pytest.importorskip("remem_agent.index.faiss_backend")
    pytest.importorskip("faiss")
    return mod.FaissBackend(DIM)  # type: ignore[no-any-return]


def make_faiss_hnsw(tmp: Path) -> IndexBackend:
    mod = pytest.importorskip("remem_agent.index.faiss_backend")
    pytest.importorskip("faiss")
    return mod.FaissBackend(DIM, kind="hnsw")  # type: ignore[no-any-return]


def make_chroma(tmp: Path) -> IndexBackend:
    mod = pytest.importorskip("remem_agent.index.chroma_backend")
    pytest.importorskip("chromadb")
    return mod.ChromaBackend()  # type: ignore[no-any-return]


def make_chroma_persistent(tmp: Path) -> IndexBackend:
    mod = pytest.importorskip("remem_agent.index.chroma_backend")
    pytest.importorskip("chromadb")
    return mod.ChromaBackend("remem-test", path=tmp / "chroma")  # type: ignore[no-any-return]


FACTORIES: dict[str, Callable[[Path], IndexBackend]] = {
    "faiss-flat": make_faiss_flat,
    "faiss-hnsw": make_faiss_hnsw,
    "chroma": make_chroma,
    "chroma-persistent": make_chroma_persistent,
}


@pytest.fixture(params=sorted(FACTORIES))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IndexBackend]:
    made = FACTORIES[request.param](tmp_path)
    yield made
    close = getattr(made, "close", None)
    if close is not None:
        close()


def test_is_an_index_backend(backend: IndexBackend) -> None:
    assert isinstance(backend, IndexBackend)


def test_empty_index_returns_empty(backend: IndexBackend) -> None:
    q = unit_rows(np.random.default_rng(0), 1)[0]
    ids, sims = backend.candidates(q, 10)
    assert ids == []
    assert isinstance(sims, np.ndarray)
    assert sims.shape == (0,)
    assert sims.dtype == np.float32
    assert len(backend) == 0


@pytest.mark.parametrize("k", [1, 10, 50])
def test_matches_brute_force_top_k(backend: IndexBackend, k: int) -> None:
    rng = np.random.default_rng(42)
    vectors = unit_rows(rng, N)
    ids = [f"m{i:04d}" for i in range(N)]
    backend.ingest(ids[:200], vectors[:200])  # two batches: the mapping must survive appends
    backend.ingest(ids[200:], vectors[200:])
    assert len(backend) == N
    for query in unit_rows(rng, 20):
        got_ids, got_sims = backend.candidates(query, k)
        assert_matches_brute_force(got_ids, got_sims, ids, vectors, query, k)


def test_query_equal_to_a_stored_vector_finds_it_first(backend: IndexBackend) -> None:
    rng = np.random.default_rng(5)
    vectors = unit_rows(rng, N)
    ids = [f"m{i}" for i in range(N)]
    backend.ingest(ids, vectors)
    for i in (0, 123, 499):
        got_ids, got_sims = backend.candidates(vectors[i], 3)
        assert got_ids[0] == ids[i]
        assert got_sims[0] == pytest.approx(1.0, abs=1e-5)


def test_k_larger_than_size(backend: IndexBackend) -> None:
    rng = np.random.default_rng(1)
    vectors = unit_rows(rng, 5)
    ids = [f"id-{i}" for i in range(5)]
    backend.ingest(ids, vectors)
    query = unit_rows(rng, 1)[0]
    got_ids, got_sims = backend.candidates(query, 50)
    assert sorted(got_ids) == sorted(ids)  # every id once, no FAISS -1 padding leaking through
    assert np.all(np.diff(got_sims) <= 1e-6)  # most similar first
    assert_matches_brute_force(got_ids, got_sims, ids, vectors, query, 5)
    none_ids, none_sims = backend.candidates(query, 0)
    assert none_ids == []
    assert none_sims.shape == (0,)


def test_reingest_replaces_instead_of_duplicating(backend: IndexBackend) -> None:
    rng = np.random.default_rng(2)
    vectors = unit_rows(rng, 20)
    ids = [f"r{i}" for i in range(20)]
    backend.ingest(ids, vectors)
    moved = unit_rows(rng, 1)
    backend.ingest(["r3"], moved)
    assert len(backend) == 20
    got_ids, got_sims = backend.candidates(moved[0], 20)
    assert got_ids[0] == "r3"
    assert got_sims[0] == pytest.approx(1.0, abs=1e-5)
    assert len(got_ids) == len(set(got_ids)) == 20
    final = vectors.copy()
    final[3] = moved[0]
    assert_matches_brute_force(got_ids, got_sims, ids, final, moved[0], 20)


def test_rejects_bad_input(backend: IndexBackend) -> None:
    rng = np.random.default_rng(3)
    backend.ingest(["a", "b"], unit_rows(rng, 2))
    with pytest.raises(UserInputError):
        backend.ingest(["c"], unit_rows(rng, 2))  # ids/rows mismatch
    with pytest.raises(EmbeddingError):
        backend.ingest(["c"], unit_rows(rng, 1, DIM + 1))  # wrong width
    bad = unit_rows(rng, 1)
    bad[0, 0] = np.nan
    with pytest.raises(EmbeddingError):
        backend.ingest(["c"], bad)
    with pytest.raises(EmbeddingError):
        backend.candidates(unit_rows(rng, 1, DIM + 1)[0], 3)
    assert len(backend) == 2


def test_faiss_compacts_tombstones() -> None:
    mod = pytest.importorskip("remem_agent.index.faiss_backend")
    pytest.importorskip("faiss")
    rng = np.random.default_rng(4)
    index = mod.FaissBackend(DIM)
    ids = [f"c{i}" for i in range(10)]
    for _ in range(120):  # 1200 re-ingests of 10 ids: crosses the compaction threshold
        index.ingest(ids, unit_rows(rng, 10))
    last = unit_rows(rng, 10)
    index.ingest(ids, last)
    assert len(index) == 10
    assert len(index._stale) < 1100
    got_ids, got_sims = index.candidates(last[7], 10)
    assert sorted(got_ids) == sorted(ids)
    assert_matches_brute_force(got_ids, got_sims, ids, last, last[7], 10)


def test_chroma_persists_across_instances(tmp_path: Path) -> None:
    mod = pytest.importorskip("remem_agent.index.chroma_backend")
    pytest.importorskip("chromadb")
    rng = np.random.default_rng(6)
    vectors = unit_rows(rng, 30)
    ids = [f"p{i}" for i in range(30)]
    first = mod.ChromaBackend("persist-me", path=tmp_path / "db")
    first.ingest(ids, vectors)
    again = mod.ChromaBackend("persist-me", path=tmp_path / "db")
    assert len(again) == 30
    assert again.dim == DIM
    got_ids, got_sims = again.candidates(vectors[9], 5)
    assert_matches_brute_force(got_ids, got_sims, ids, vectors, vectors[9], 5)


def test_chroma_ephemeral_backends_are_isolated() -> None:
    mod = pytest.importorskip("remem_agent.index.chroma_backend")
    pytest.importorskip("chromadb")
    rng = np.random.default_rng(8)
    a, b = mod.ChromaBackend(), mod.ChromaBackend()
    try:
        a.ingest(["only-in-a"], unit_rows(rng, 1))
        assert len(a) == 1
        assert len(b) == 0
    finally:
        a.close()
        b.close()


def test_chroma_rejects_bad_collection_name() -> None:
    mod = pytest.importorskip("remem_agent.index.chroma_backend")
    pytest.importorskip("chromadb")
    with pytest.raises(UserInputError):
        mod.ChromaBackend("x")


def test_flat_index_ranks_only_the_asked_groups_in_one_scan() -> None:
    from remem_agent.index.flat import FlatIndex

    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(300, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = [f"m{i}" for i in range(300)]
    groups = ["a" if i % 10 == 0 else "b" for i in range(300)]
    idx = FlatIndex(8, capacity=16)  # grows while ingesting
    idx.ingest(ids[:150], vecs[:150], groups=groups[:150])
    idx.ingest(ids[150:], vecs[150:], groups=groups[150:])
    q = vecs[7]
    got, sims = idx.candidates(q, 5, groups={"a"})
    exact = sorted((i for i in range(300) if groups[i] == "a"), key=lambda i: -float(vecs[i] @ q))[:5]
    assert got == [ids[i] for i in exact] and np.allclose(sims, [vecs[i] @ q for i in exact], atol=1e-6)
    assert idx.candidates(q, 50, groups={"a"})[0].__len__() == 30  # all of group a, nothing else
    assert idx.candidates(q, 5, groups={"nobody"}) == ([], pytest.approx(np.zeros(0)))
    assert idx.candidates(q, 5)[0] == idx.candidates(q, 5, groups={"a", "b"})[0]  # every group = no filter
