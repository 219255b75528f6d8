"""Hybrid candidates (dense + the ledger's lexical channel, fused) and the cold-start rule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from remem_agent import ReMem, RememConfig
from remem_agent.errors import UserInputError
from remem_agent.ranking.features import FEATURE_NAMES, LEGACY_FEATURE_NAMES, upgrade_snapshot
from remem_agent.ranking.fusion import fuse
from remem_agent.ranking.pipeline import Candidates, rank_and_select
from remem_agent.types import ALL_TASKS, Memory, State, TaskStats
from tests.conftest import StoreLocation

NOW = 1_800_000_000.0
FILLER = [f"note {i}: the weather on day {i} was mild with some clouds over the hills" for i in range(40)]


# -- the pure fusion step ---------------------------------------------------------------------------
def test_fuse_dense_mode_is_the_cosine_order() -> None:
    dense = [("a", 0.9), ("b", 0.5)]
    pool = fuse(dense, [("c", 3.0)], {"a": 0.9, "b": 0.5, "c": 0.1}, config=RememConfig(retrieval="dense"))
    assert pool.ids == ("a", "b")
    assert pool.retrieval.tolist() == pool.similarity.tolist() == [0.9, 0.5]
    assert pool.lexical.tolist() == [0.0, 0.0]


def test_fuse_bonus_lifts_a_lexical_match_above_a_closer_cosine() -> None:
    cfg = RememConfig(fusion="bonus", lexical_weight=0.3)
    dense = [("a", 0.60), ("b", 0.50)]
    pool = fuse(dense, [("b", 4.0), ("c", 2.0)], {"a": 0.60, "b": 0.50, "c": 0.20}, config=cfg)
    assert pool.ids == ("b", "a", "c")  # b: 0.5 + 0.3; a: 0.6; c: 0.2 + 0.15
    assert pool.retrieval.tolist() == pytest.approx([0.8, 0.6, 0.35])
    assert pool.lexical.tolist() == pytest.approx([1.0, 0.0, 0.5])


def test_fuse_rrf_and_lexical_only() -> None:
    cos = {"a": 0.9, "b": 0.8, "c": 0.1}
    rrf = fuse([("a", 0.9), ("b", 0.8)], [("b", 5.0), ("c", 1.0)], cos, config=RememConfig(fusion="rrf", rrf_k=60))
    assert rrf.ids[0] == "b" and set(rrf.ids) == {"a", "b", "c"}  # b is in both lists
    assert rrf.retrieval.min() > 0 and rrf.retrieval.max() <= 1.0
    lex = fuse([("a", 0.9)], [("b", 5.0), ("c", 1.0)], cos, config=RememConfig(retrieval="lexical"))
    assert lex.ids == ("b", "c")  # the lexical list's order; the dense list is not used
    assert lex.retrieval.tolist() == pytest.approx([1.0, 0.2])  # scaled by the best (5.0)


def test_config_rejects_unknown_retrieval_modes() -> None:
    with pytest.raises(UserInputError):
        RememConfig(retrieval="sparse")  # type: ignore[arg-type]
    with pytest.raises(UserInputError):
        RememConfig(fusion="max")  # type: ignore[arg-type]
    with pytest.raises(UserInputError):
        RememConfig(lexical_weight=-1.0)


# -- through the store --------------------------------------------------------------------------------
def test_hybrid_pool_holds_a_lexical_match_the_dense_top_list_missed(tmp_path: Path) -> None:
    cfg = RememConfig(min_pool=3, pool_factor=1)
    with ReMem(tmp_path / "s", config=cfg) as mem:
        mem.add_many([{"text": t, "role": "note"} for t in FILLER])
        target = mem.add("Quetzalcoatl is the name of the team's build server.", role="note")
        query = "mild clouds over the hills on Quetzalcoatl"
        qvec = mem.embedder.embed([query])[0]
        dense = mem.candidates(qvec, k=1, at=NOW, query=None)  # no query text: the dense channel only
        assert target not in [m.id for m in dense.memories]
        hybrid = mem.candidates(qvec, k=1, at=NOW, query=query)
        ids = [m.id for m in hybrid.memories]
        assert target in ids and len(ids) > len(dense.memories)
        i = ids.index(target)
        exact = float(mem.embedder.embed([mem.get(target).text])[0] @ qvec)
        assert hybrid.similarities[i] == pytest.approx(exact, abs=1e-5)  # the flat index's exact cosine
        assert hybrid.lexical is not None and hybrid.lexical[i] > 0
        assert hybrid.retrieval is not None and list(hybrid.retrieval) == sorted(hybrid.retrieval, reverse=True)
        hit = mem.search(query, k=1)
        assert hit.ids == [target]  # its rare word lifts it to the top
        with ReMem(tmp_path / "s", config=replace(cfg, retrieval="dense")) as dense_mem:
            assert dense_mem.search(query, k=1).ids != [target]


def test_lexical_channel_respects_scope_state_validity_and_as_of(store_location: StoreLocation) -> None:
    cfg = RememConfig(retrieval="lexical")
    with ReMem(store_location("s"), config=cfg) as mem:
        old = mem.add("The zanzibar server runs Postgres 14.", entity="zanzibar", attribute="db", timestamp=NOW - 100)
        new = mem.add("The zanzibar server runs Postgres 16.", entity="zanzibar", attribute="db", timestamp=NOW - 10)
        other = mem.add("zanzibar notes of another team", role="note", scope="team-b", timestamp=NOW - 50)
        future = mem.add("zanzibar migration next month", role="note", timestamp=NOW + 10_000)
        assert mem.get(old).state is State.INVALIDATED
        now_ids = mem.search("zanzibar Postgres", k=10, now=NOW).ids
        assert new in now_ids and old not in now_ids and other not in now_ids and future not in now_ids
        then = mem.search("zanzibar Postgres", k=10, as_of=NOW - 50, now=NOW).ids
        assert old in then and new not in then
        assert mem.search("zanzibar", k=10, now=NOW, scope="team-b").ids == [other]
        assert mem.search("no such words anywhere", k=10, now=NOW).ids == []  # lexical only: no match, no pool


def test_fresh_store_ranking_is_the_retrieval_order_and_serves_k(store_location: StoreLocation) -> None:
    """Cold start: no outcome evidence, so the utility's order is the fused retrieval order and no floor."""
    with ReMem(store_location("s")) as mem:
        stamps = [NOW - 86_400 * (400 - 9 * i) for i in range(len(FILLER))]  # ages differ: the prior would move them
        mem.add_many([{"text": t, "role": "note", "timestamp": s} for t, s in zip(FILLER, stamps, strict=True)])
        query = "clouds over the hills on day 7"
        qvec = mem.embedder.embed([query])[0]
        pool = mem.candidates(qvec, k=10, at=NOW, query=query)
        res = mem.search(query, k=10, now=NOW, explain=True)
        assert len(res.items) == 10
        assert res.ids == [m.id for m in pool.memories[:10]]
        # no evidence: no kind's factor and no record, so the contribution factor is 1 and only relevance ranks
        assert all(h.explain is not None and h.explain["component.contribution"] == 1.0 for h in res.items)
        assert all(h.explain is not None and h.explain["feature.evidence_all"] == 0.0 for h in res.items)


def test_outcome_evidence_moves_the_ranking(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add_many([{"text": t, "role": "note"} for t in FILLER])
        query = "what was the weather like over the hills"
        cold = mem.search(query, k=5, task="t", now=NOW)
        top, useful = cold.ids[0], cold.ids[4]
        for _ in range(6):
            res = mem.search(query, k=5, task="t", now=NOW)
            mem.feedback(res.search_id, success=True, used_ids=[useful] if useful in res.ids else [])
        warm = mem.search(query, k=5, task="t", now=NOW)
        assert top != useful and warm.ids[0] == useful


# -- the pure cold-start rules -----------------------------------------------------------------------
def _memory(i: int, *, age_days: float) -> Memory:
    return Memory(
        id=f"m{i}",
        text=f"memory {i}",
        original_text=f"memory {i}",
        entity=None,
        attribute=None,
        role="note",
        tasks=(),
        created_at=NOW,
        valid_from=NOW - age_days * 86_400,
        valid_to=None,
        superseded_by=None,
        state=State.ACTIVE,
        token_cost=50 * (4 - i),  # the weaker matches are shorter ...
        confidence=0.6 + 0.1 * i,  # ... and more confident: the static prior favours them
    )


def _ranked(cfg: RememConfig, stats: dict[tuple[str, str], TaskStats], sims: list[float]) -> list[str]:
    mems = [_memory(i, age_days=365.0 - 100 * i) for i in range(len(sims))]  # the weakest match is the newest
    cands = Candidates(memories=mems, similarities=np.array(sims), stats=stats)
    ranking = rank_and_select(cands, config=cfg, utility=cfg.make_utility(), task=None, at=NOW, k=4, token_budget=None)
    return [h.id for h in ranking.hits]


def test_cold_candidates_are_served_and_the_floor_grows_with_evidence() -> None:
    """The cold-start rule of the floor, on the absolute floor of the heuristic utility."""
    cfg = RememConfig(guard_top=0, utility="heuristic", p_floor_reference="absolute")
    sims = [0.30, 0.25, 0.20, 0.15]  # every p below the 0.35 floor
    assert _ranked(cfg, {}, sims) == ["m0", "m1", "m2", "m3"]
    judged = {("m3", ALL_TASKS): TaskStats(task=ALL_TASKS, shown=4, credit_sum=0.0)}
    assert _ranked(cfg, judged, sims) == ["m0", "m1", "m2"]  # shown 4 times, never useful: its floor bites
    always = replace(cfg, static_prior="always")
    assert len(_ranked(always, {}, sims)) < 4  # the old rule: the floor regardless of evidence


def test_with_the_default_floor_a_weak_pool_is_served_and_only_the_far_worse_exposed_one_goes() -> None:
    cfg = RememConfig()
    sims = [0.30, 0.25, 0.20, 0.15]
    assert _ranked(cfg, {}, sims) == ["m0", "m1", "m2", "m3"]  # cold: no floor at all
    judged = {("m3", ALL_TASKS): TaskStats(task=ALL_TASKS, shown=4, credit_sum=0.0)}
    # shown 4 times and never used: the relative floor still keeps it (a weak pool is not emptied) ...
    assert _ranked(cfg, judged, sims) == ["m0", "m1", "m2", "m3"]
    # ... until its record sinks it far enough below the best candidate
    judged = {("m3", ALL_TASKS): TaskStats(task=ALL_TASKS, shown=60, credit_sum=0.0)}
    assert _ranked(cfg, judged, sims) == ["m0", "m1", "m2"]


def test_static_prior_only_with_evidence() -> None:
    cfg = RememConfig(guard_top=0, p_floor=0.0)
    sims = [0.50, 0.49, 0.48, 0.47]
    assert _ranked(cfg, {}, sims) == ["m0", "m1", "m2", "m3"]  # retrieval order despite age and length
    always = replace(cfg, static_prior="always")
    assert _ranked(always, {}, sims) != ["m0", "m1", "m2", "m3"]  # the full prior re-orders by recency/cost


def test_legacy_snapshots_are_upgraded() -> None:
    row = [float(i) for i in range(len(LEGACY_FEATURE_NAMES))]
    up = upgrade_snapshot(LEGACY_FEATURE_NAMES, row)
    assert len(up) == len(FEATURE_NAMES)
    assert up[FEATURE_NAMES.index("lexical")] == 0.0
    assert up[FEATURE_NAMES.index("retrieval")] == row[LEGACY_FEATURE_NAMES.index("similarity")]
    with pytest.raises(ValueError):
        upgrade_snapshot(("similarity",), [0.5])
