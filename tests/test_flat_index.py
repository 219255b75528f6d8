"""The flat index serves the same rows whatever BLAS thread count it scans with (one by default), and they are
the exact top k."""

from __future__ import annotations

import numpy as np

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
                assert got_ids == want_ids and np.array_equal(got_sims, want_sims)


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
