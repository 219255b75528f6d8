"""The flat index serves the same rows whatever BLAS thread count it scans with (one by default), and they are
the exact top k, for dense queries and for sparse ones (scored on their non-zero dimensions only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from remem_agent.index.flat import FlatIndex


def _data(n: int, dim: int, seed: int) -> tuple[list[str], np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs[: n // 3] = np.round(vecs[: n // 3])  # a third with coarse values: many tied scores, as hashing gives
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    groups = [("a", "b", "c")[i % 3] for i in range(n)]
    return [f"m{i}" for i in range(n)], vecs, groups


def test_one_blas_thread_is_the_default_and_serves_what_unlimited_blas_serves() -> None:
    ids, vecs, groups = _data(6000, 384, seed=3)
    one, unlimited, two = FlatIndex(384), FlatIndex(384, blas_threads=None), FlatIndex(384, blas_threads=2)
    assert one.blas_threads == 1
    for idx in (one, unlimited, two):
        idx.ingest(ids, vecs, groups)
    queries = np.random.default_rng(4).standard_normal((30, 384)).astype(np.float32)
    queries[:10] = vecs[:10]  # queries that tie with many rows
    for q in queries:
        for scope in (None, ["a"], ["a", "c"]):
            want_ids, want_sims = unlimited.candidates(q, 40, groups=scope)
            for idx in (one, two):
                got_ids, got_sims = idx.candidates(q, 40, groups=scope)
                # several BLAS threads may split one column-major sum: the same rows, scores within rounding
                assert got_ids == want_ids
                np.testing.assert_allclose(got_sims, want_sims, rtol=0, atol=1e-6)


def test_candidates_are_the_exact_top_k() -> None:
    ids, vecs, _ = _data(3000, 64, seed=5)
    vecs = vecs[1000:]  # untied rows only: the exact order is unique
    idx = FlatIndex(64)
    idx.ingest(ids[1000:], vecs)
    q = np.random.default_rng(6).standard_normal(64).astype(np.float32)
    got, sims = idx.candidates(q, 25)
    exact = np.argsort(-(vecs.astype(np.float64) @ q.astype(np.float64)))[:25]
    assert got == [ids[1000 + i] for i in exact]
    assert list(sims) == sorted(sims, reverse=True)


@pytest.mark.parametrize("row_nonzero", [20, 2])
def test_a_sparse_query_scores_what_the_full_product_scores(row_nonzero: int) -> None:
    """The hash embedder's queries have few non-zero dimensions; they are scored on those only, which must
    give the full product's scores (to float32 rounding) and the same top k, also after the matrix grew.
    With 20 non-zero dimensions a row half the rows score above 0 (every row is ranked); with 2 about 7% do,
    and only those are partitioned (``FlatIndex._top``)."""
    rng = np.random.default_rng(8)
    n, dim = 5000, 256
    vecs = np.zeros((n, dim), dtype=np.float32)
    for i in range(n):
        vecs[i, rng.choice(dim, row_nonzero, replace=False)] = rng.random(row_nonzero)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ids = [f"m{i}" for i in range(n)]
    idx = FlatIndex(dim, capacity=16)
    for start in range(0, n, 700):  # several ingests: the column-major matrix grows and is copied
        idx.ingest(ids[start : start + 700], vecs[start : start + 700])
    for _ in range(20):
        q = np.zeros(dim, dtype=np.float32)
        q[rng.choice(dim, 9, replace=False)] = rng.random(9)
        q /= np.linalg.norm(q)
        exact = vecs.astype(np.float64) @ q.astype(np.float64)
        got, sims = idx.candidates(q, 30)
        np.testing.assert_allclose(sims, exact[[int(g[1:]) for g in got]], rtol=0, atol=1e-6)
        assert sims[-1] >= np.sort(exact)[-30] - 1e-6  # nothing better was left out
        assert list(sims) == sorted(sims, reverse=True)
        positive = int((exact > 0).sum())
        assert (30 <= positive <= n // 8) == (row_nonzero == 2)  # each case takes the path it names
        some = [*got[:5], "m1", "m4999", "absent"]
        by_id = idx.similarities(q, some)
        assert set(by_id) == set(some) - {"absent"}
        for mid, v in by_id.items():
            assert abs(v - exact[int(mid[1:])]) < 1e-6
    assert idx.candidates(np.zeros(dim, dtype=np.float32), 3)[1].tolist() == [0.0, 0.0, 0.0]


def test_a_scan_keeps_every_row_s_score_for_the_fused_pool() -> None:
    """``FlatIndex.scan`` returns ``candidates``' answer and, for any row it scanned (of any group), the score
    the scan gave it: what a fused pool's lexical-only candidates read instead of gathering their columns."""
    ids, vecs, groups = _data(3000, 128, seed=9)
    idx = FlatIndex(128)
    idx.ingest(ids, vecs, groups)
    q = np.random.default_rng(10).standard_normal(128).astype(np.float32)
    scan = idx.scan(q, 20, groups=["b"])
    want_ids, want_sims = idx.candidates(q, 20, groups=["b"])
    assert scan.ids == want_ids and np.array_equal(scan.sims, want_sims)
    every = scan.similarities(ids)
    assert list(every) == ids  # rows of other groups too
    np.testing.assert_allclose([every[i] for i in ids], vecs @ q, rtol=0, atol=1e-5)
    assert all(every[i] == float(s) for i, s in zip(scan.ids, scan.sims, strict=True))
    idx.ingest(["late"], vecs[:1], ["a"])
    assert scan.similarities(["late", ids[0]]) == {ids[0]: every[ids[0]]}  # ingested after the scan: unknown


def test_a_hybrid_search_takes_lexical_only_cosines_from_its_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remem_agent import ReMem

    mem = ReMem(tmp_path / "store")
    # many memories near the query's dense side, a few that only the lexical channel finds
    mem.add_many([f"gardening tomatoes greenhouse soil {i}" for i in range(300)] + ["the zeppelin hangar"] * 3)
    assert mem._flat is not None
    calls: list[int] = []
    real = type(mem._flat).similarities
    monkeypatch.setattr(
        type(mem._flat), "similarities", lambda self, q, ids: calls.append(len(ids)) or real(self, q, ids)
    )
    q = mem.embedder.embed(["gardening zeppelin"])[0]
    pooled = mem.candidates(q, k=5, at=2e9, query="gardening zeppelin")
    assert calls == []  # every lexical-only candidate's cosine came from the scan
    assert any(m.text == "the zeppelin hangar" for m in pooled.memories)
    monkeypatch.undo()

    cosine = {m.id: float(s) for m, s in zip(pooled.memories, pooled.similarities, strict=True)}
    vecs = {m.id: mem.embedder.embed([m.text])[0] for m in pooled.memories}
    for mid, s in cosine.items():
        assert abs(s - float(vecs[mid] @ q)) < 1e-5
    mem.close()
