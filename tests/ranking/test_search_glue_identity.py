"""The search path's leaner Python glue gives bit-identical results to the code it replaced.

Each test keeps a reference copy of the replaced code (as it was before the change) and compares it with the
current one on many inputs: ids in the same order, floats equal to the bit (``tobytes``), objects equal.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from remem_agent import ReMem, RememConfig
from remem_agent.index.flat import FlatIndex, Scan
from remem_agent.ranking.fusion import FusedPool, fuse
from remem_agent.ranking.pipeline import eligible_rows, is_eligible
from remem_agent.ranking.utility import HeuristicUtility
from remem_agent.types import SERVABLE_STATES, Memory, State


# -- fuse ---------------------------------------------------------------------------------------------------
def _fuse_reference(
    dense: Sequence[tuple[str, float]],
    lexical: Sequence[tuple[str, float]],
    cosine: Mapping[str, float],
    *,
    config: RememConfig,
) -> FusedPool:
    """``fuse`` as it was before its arrays were built with fewer Python operations."""
    mode = config.retrieval
    dense_rank = {mid: r for r, (mid, _) in enumerate(dense)} if mode != "lexical" else {}
    lex_rank = {mid: r for r, (mid, _) in enumerate(lexical)} if mode != "dense" else {}
    order = list(dense_rank) + [mid for mid in lex_rank if mid not in dense_rank]
    n = len(order)
    sim = np.array([cosine.get(mid, 0.0) for mid in order], dtype=np.float64)
    best_lex = max((s for _, s in lexical), default=0.0) if lex_rank else 0.0
    raw_lex = dict(lexical) if lex_rank else {}
    lex = np.array(
        [raw_lex[mid] / best_lex if best_lex > 0 and mid in raw_lex else 0.0 for mid in order], dtype=np.float64
    )
    if mode == "dense":
        ret = sim
    elif mode == "lexical":
        ret = lex
    elif config.fusion == "bonus":
        ret = sim + config.lexical_weight * lex
    else:
        c, wl = config.rrf_k, config.lexical_weight
        top = (1.0 + wl) / (c + 1.0)
        ret = np.array(
            [
                ((1.0 / (c + 1.0 + dense_rank[mid])) if mid in dense_rank else 0.0)
                + ((wl / (c + 1.0 + lex_rank[mid])) if mid in lex_rank else 0.0)
                for mid in order
            ],
            dtype=np.float64,
        ) / (top if top > 0 else 1.0)
    idx = np.argsort(-ret, kind="stable") if n else np.zeros(0, dtype=np.int64)
    return FusedPool(ids=tuple(order[i] for i in idx), similarity=sim[idx], lexical=lex[idx], retrieval=ret[idx])


def _same_pool(a: FusedPool, b: FusedPool) -> None:
    assert a.ids == b.ids
    for x, y in ((a.similarity, b.similarity), (a.lexical, b.lexical), (a.retrieval, b.retrieval)):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


CONFIGS = [
    RememConfig(),
    RememConfig(retrieval="dense"),
    RememConfig(retrieval="lexical"),
    RememConfig(fusion="rrf", rrf_k=60),
    RememConfig(fusion="bonus", lexical_weight=0.37),
    RememConfig(fusion="rrf", rrf_k=0, lexical_weight=0.0),
]

_ids = st.sampled_from([f"m{i}" for i in range(12)])
_score = st.one_of(
    st.floats(-2, 50, allow_nan=False),
    st.sampled_from([0.0, -0.0, 1.0, 3.0, 0.1, 1e-300]),
    st.integers(-3, 9),  # ints and numpy scalars take the per-id path: still the same values
    st.floats(0, 9, width=32).map(np.float32),
)


@given(
    dense=st.lists(st.tuples(_ids, st.floats(-1, 1, width=32)), max_size=14),
    lexical=st.lists(st.tuples(_ids, _score), max_size=14),
    cos_ids=st.lists(_ids, max_size=12),
    seed=st.integers(0, 10**6),
)
def test_fuse_matches_the_reference_bit_for_bit(
    dense: list[tuple[str, float]], lexical: list[tuple[str, float]], cos_ids: list[str], seed: int
) -> None:
    rng = random.Random(seed)
    cosine = {mid: rng.choice([0.5, 0.25, rng.uniform(-1, 1)]) for mid in cos_ids}  # ties included
    for cfg in CONFIGS:
        _same_pool(fuse(dense, lexical, cosine, config=cfg), _fuse_reference(dense, lexical, cosine, config=cfg))


def test_fuse_matches_the_reference_on_search_sized_pools() -> None:
    rng = np.random.default_rng(3)
    for trial in range(300):
        ids = [f"m{i}" for i in rng.permutation(90)]
        dense_sims = np.sort(rng.choice([0.0, 0.25, 0.5, 0.125], 40) + rng.random(40) * (trial % 2)).astype(np.float32)
        dense = list(zip(ids[:40], dense_sims[::-1].tolist(), strict=True))
        lexical = [(mid, float(s)) for mid, s in zip(ids[25:65], np.sort(rng.random(40) * 9)[::-1], strict=True)]
        cosine = {mid: float(v) for mid, v in zip(ids[:65], rng.random(65).astype(np.float32), strict=True)}
        for cfg in CONFIGS:
            new = fuse(dense, lexical, cosine, config=cfg)
            _same_pool(new, _fuse_reference(dense, lexical, cosine, config=cfg))


# -- eligibility --------------------------------------------------------------------------------------------
def _memory(i: int, rng: random.Random) -> Memory:
    valid_from = rng.choice([0.0, 100.0, 200.0, 250.0])
    return Memory(
        id=f"m{i}",
        text="t",
        original_text="t",
        entity=None,
        attribute=None,
        role="note",
        tasks=(),
        created_at=0.0,
        valid_from=valid_from,
        valid_to=rng.choice([None, valid_from, valid_from + 50.0, 150.0]),
        superseded_by=None,
        state=rng.choice(list(State)),
        token_cost=1,
        confidence=1.0,
        scope=rng.choice(["default", "a", "b"]),
    )


def _reference_eligible(memory: Memory, at: float, historical: bool, scopes: frozenset[str] | None) -> bool:
    """Eligibility as it was written before ``eligible_rows``: through ``Memory.valid_at`` and the state sets."""
    if scopes is not None and memory.scope not in scopes:
        return False
    if not memory.valid_at(at):
        return False
    if historical:
        return memory.state not in (State.ARCHIVED, State.ERASED)  # an erased memory: never, not even as_of
    return memory.state in SERVABLE_STATES


@pytest.mark.parametrize("seed", range(20))
def test_eligible_rows_is_the_written_rule_in_order(seed: int) -> None:
    rng = random.Random(seed)
    rows = {m.id: m for m in (_memory(i, rng) for i in range(60))}
    wanted = [f"m{i}" for i in rng.sample(range(80), 70)]  # some unknown ids, in a shuffled order
    for at in (0.0, 100.0, 150.0, 200.0, 249.9, 250.0, 300.0):
        for historical in (False, True):
            for scopes in (None, frozenset({"default"}), frozenset({"a", "b"}), frozenset()):
                expected = {
                    mid: m
                    for mid in wanted
                    if (m := rows.get(mid)) is not None and _reference_eligible(m, at, historical, scopes)
                }
                got = eligible_rows(rows, wanted, at, historical=historical, scopes=scopes)
                assert list(got.items()) == list(expected.items())
                for mid in wanted:
                    if (m := rows.get(mid)) is not None:
                        assert is_eligible(m, at, historical=historical, scopes=scopes) == (mid in expected)


# -- the flat index's scan ------------------------------------------------------------------------------------
def test_scan_similarities_and_top_ids_match_the_per_id_reading() -> None:
    rng = np.random.default_rng(5)
    index = FlatIndex(16, capacity=16)
    ids = [f"m{i}" for i in range(300)]
    vecs = rng.choice([0.0, 0.0, 1.0, -1.0], (300, 16)).astype(np.float32)
    vecs[:, 0] += 0.5
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index.ingest(ids[:200], vecs[:200], groups=["a" if i % 3 else "b" for i in range(200)])
    q = vecs[7]
    scan = index.scan(q, 25, groups=["a"])
    index.ingest(ids[200:], vecs[200:], groups=["a"] * 100)  # rows after the scan: not covered by it
    everyone = index.scan(q, 300)
    assert everyone.ids == [ids[i] for i in np.argsort(-everyone._all, kind="stable")]
    for asked in (ids[:40], ids[190:230], ["nope", *ids[5:9], "m5"], [], ["x"], ids[250:]):
        n = len(scan._all)
        found = [(mid, r) for mid in asked if (r := scan._row.get(mid)) is not None and r < n]
        expected = {mid: float(scan._all[r]) for mid, r in found}
        got = scan.similarities(asked)
        assert list(got.items()) == list(expected.items())
    assert Scan([], np.zeros(0, np.float32), np.zeros(0, np.float32), {}).similarities(["a"]) == {}


# -- TaskStats from a ledger row ------------------------------------------------------------------------------
def _top_reference(ids: list[str], sims: np.ndarray, k: int, rows: np.ndarray | None) -> tuple[list[str], np.ndarray]:
    """``FlatIndex._top`` as it was before its id list was built from Python ints."""
    n = len(sims)
    if n == 0:
        return [], np.zeros(0, dtype=np.float32)
    k = min(k, n)
    if k < n:
        positive = np.flatnonzero(sims > 0)
        if k <= len(positive) <= n // 8:
            part = positive[np.argpartition(-sims[positive], k - 1)[:k]]
            top = part[np.argsort(-sims[part], kind="stable")]
        else:
            top = np.argpartition(-sims, k - 1)[:k]
            top = top[np.argsort(-sims[top], kind="stable")]
    else:
        top = np.argsort(-sims, kind="stable")
    picked = top if rows is None else rows[top]
    return [ids[i] for i in picked], sims[top].astype(np.float32, copy=False)


@pytest.mark.parametrize("seed", range(30))
def test_top_matches_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    index = FlatIndex(8)
    index.ingest([f"m{i}" for i in range(n)], np.eye(8, dtype=np.float32)[rng.integers(0, 8, n)])
    # heavily tied scores, a third exactly 0.0, few or many positive ones: both partition paths and the sort
    sims = rng.choice([0.0, 0.0, -0.25, 0.5, 0.25, 1.0], n).astype(np.float32)
    if seed % 3 == 0:
        sims[rng.random(n) < 0.9] = 0.0
    for k in (1, 5, 40, n, n + 3):
        for rows in (None, np.sort(rng.choice(n, max(1, n // 2), replace=False)).astype(np.intp)):
            part = sims if rows is None else sims[rows]
            got_ids, got_sims = index._top(part, k, rows)
            ref_ids, ref_sims = _top_reference(index._ids, part, k, rows)
            assert got_ids == ref_ids and got_sims.tobytes() == ref_sims.tobytes()


# -- the index checked against the search's read --------------------------------------------------------------
def test_a_search_syncs_rows_another_instance_added(tmp_path: Path) -> None:
    """The flat index is checked against the read's snapshot: rows another process (here another instance)
    committed are scanned, with their cosines from the dense channel, by the next search."""
    folder = tmp_path / "store"
    first = ReMem(folder)
    first.add("the weather was mild on monday", role="note")
    second = ReMem(folder)
    fact = second.add("our database server lives in region east-1", entity="db", attribute="region")
    hits = first.search("which region is the database server in", k=3)
    assert fact in hits.ids
    assert fact in first._flat._row  # type: ignore[union-attr]
    scan = first._flat.scan(first.query_cache.vector(first.embedder, "region east-1"), 5)  # type: ignore[union-attr]
    assert fact in scan.ids
    first.close()
    second.close()


def test_served_hits_carry_float_scores_from_any_utility(tmp_path: Path) -> None:
    """A utility returning integer scores still gives float ``Hit.score``s, as ``float(p[i])`` did."""

    class Flat(HeuristicUtility):
        def score(self, feats: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
            p, comps = super().score(feats)
            return np.ones(len(p), dtype=np.int64), comps

    mem = ReMem(tmp_path / "store", utility=Flat())
    mem.add_many([f"note {i} about the server" for i in range(8)])
    hits = mem.search("server", k=3).items
    assert hits and all(type(h.score) is float and type(h.similarity) is float for h in hits)
    mem.close()
