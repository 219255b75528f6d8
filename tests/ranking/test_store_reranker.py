"""The store's re-ranker: its features, its re-ordering, its stored form, its fit and schedule, and a store
that fits one on its own feedback (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from remem_agent import ReMem, RememConfig
from remem_agent.errors import UserInputError
from remem_agent.learning import rerank_fit
from remem_agent.learning.rerank_fit import META_KEY, RerankState, due, next_due
from remem_agent.ranking import training
from remem_agent.ranking.rerank import (
    RERANK_DEPTH,
    RERANK_FEATURES,
    StoreReranker,
    asks_when,
    rerank_features,
    utility_order,
)
from remem_agent.ranking.training import TrainingSet
from remem_agent.store import sql_outcomes
from remem_agent.types import Memory, State
from tests.conftest import StoreLocation

COL = {name: j for j, name in enumerate(RERANK_FEATURES)}


def _memory(i: int, text: str, *, speaker: str | None = None, session: str | None = None) -> Memory:
    return Memory(
        id=f"m{i}",
        text=text,
        original_text=text,
        entity=None,
        attribute=None,
        role="note",
        tasks=(),
        created_at=0.0,
        valid_from=0.0,
        valid_to=None,
        superseded_by=None,
        state=State.ACTIVE,
        token_cost=len(text.split()),
        confidence=1.0,
        speaker=speaker,
        session=session,
    )


def _model(weights: dict[str, float], **kw: float) -> StoreReranker:
    d = len(RERANK_FEATURES)
    return StoreReranker(
        weights=tuple(weights.get(n, 0.0) for n in RERANK_FEATURES),
        intercept=0.0,
        mean=(0.0,) * d,
        std=(1.0,) * d,
        lam=0.01,
        searches=int(kw.get("searches", 20)),
        rows=100,
        positives=10,
        fitted_at=0.0,
    )


# -- features --------------------------------------------------------------------------------------
def test_features_describe_how_each_candidate_sits_in_the_ranking() -> None:
    memories = [
        _memory(0, "Ann: I love the sea", speaker="Ann", session="s1"),
        _memory(1, "Bob: we moved in May", speaker="Bob", session="s1"),
        _memory(2, "Bob: nice", speaker="Bob", session="s2"),
    ]
    p = np.array([0.2, 0.8, 0.4])
    static = {"similarity": np.array([0.1, 0.2, 0.3]), "gap": np.array([0.5, 0.0, 0.2])}
    order = utility_order(p, np.zeros(3))
    assert order.tolist() == [1, 2, 0]
    X = rerank_features(query="When did Bob move?", memories=memories, features=static, p=p, order=order)
    assert X.shape == (3, len(RERANK_FEATURES))
    assert X[:, COL["similarity"]].tolist() == [0.1, 0.2, 0.3]
    assert X[:, COL["lexical"]].tolist() == [0.0, 0.0, 0.0]  # a feature the pool lacks is 0
    assert X[:, COL["log_place"]].tolist() == pytest.approx([math.log1p(2), 0.0, math.log1p(1)])
    assert X[:, COL["score_ratio"]].tolist() == pytest.approx([0.25, 1.0, 0.5])
    assert X[:, COL["speaker_named"]].tolist() == [0.0, 1.0, 1.0]
    assert X[:, COL["session_share"]].tolist() == pytest.approx([1.25, 1.25, 0.5])  # s1: 0.25 + 1.0
    assert X[:, COL["timed"]].tolist() == [0.0, 1.0, 0.0]  # "May"
    assert X[:, COL["timed_when"]].tolist() == [0.0, 1.0, 0.0]
    X2 = rerank_features(query="Where did Bob move?", memories=memories, features=static, p=p, order=order)
    assert X2[:, COL["timed_when"]].tolist() == [0.0, 0.0, 0.0]
    assert asks_when("  when is it?") and not asks_when("and when?") and not asks_when("")


def test_ties_in_score_follow_the_retrieval_score_then_the_index() -> None:
    assert utility_order(np.array([0.5, 0.5, 0.5]), np.array([0.1, 0.3, 0.1])).tolist() == [1, 0, 2]


# -- the re-ordering ------------------------------------------------------------------------------
def test_reorder_moves_the_head_only_and_keeps_its_scores() -> None:
    n = RERANK_DEPTH + 5
    p = np.linspace(1.0, 0.1, n)
    X = np.zeros((n, len(RERANK_FEATURES)))
    X[:, COL["timed"]] = np.arange(n)  # the model prefers the later (worse) candidates
    model = _model({"timed": 1.0})
    order = utility_order(p, np.zeros(n))
    out, z = model.reorder(p, order[:RERANK_DEPTH], X)
    head = order[:RERANK_DEPTH]
    assert sorted(out[head].tolist()) == sorted(p[head].tolist())  # the same scores, handed out again
    assert out[RERANK_DEPTH:].tolist() == p[RERANK_DEPTH:].tolist()  # the rest keeps its own
    assert utility_order(out, np.zeros(n))[:RERANK_DEPTH].tolist() == head[::-1].tolist()
    assert np.isnan(z[RERANK_DEPTH:]).all() and not np.isnan(z[:RERANK_DEPTH]).any()
    tied, _ = model.reorder(np.full(n, 0.5), order[:RERANK_DEPTH], X)  # tied scores are split in z's order
    assert utility_order(tied, np.zeros(n))[:RERANK_DEPTH].tolist() == head[::-1].tolist()
    assert np.allclose(tied, 0.5, rtol=0, atol=1e-12)
    same, _ = _model({}).reorder(p, order[:RERANK_DEPTH], X)  # a model that tells nothing apart keeps the order
    assert same.tolist() == p.tolist()
    one, _ = model.reorder(p[:1], order[:1], X[:1])
    assert one.tolist() == p[:1].tolist()


# -- the stored form ------------------------------------------------------------------------------
def test_a_model_round_trips_and_bad_records_are_refused() -> None:
    model = _model({"timed": 1.5, "speaker_named": -0.5})
    assert StoreReranker.from_json(model.to_json()) == model
    assert model.describe()["weights"]["timed"] == 1.5
    state = RerankState(attempted=30, model=model)
    assert RerankState.from_json(state.to_json()) == state
    assert RerankState.from_json(RerankState(attempted=20, model=None).to_json()).model is None
    record = json.loads(model.to_json())
    for bad in (
        "not json",
        json.dumps({**record, "format": "other"}),
        json.dumps({**record, "weights": [1.0]}),
        json.dumps({**record, "std": [0.0] * len(RERANK_FEATURES)}),
        json.dumps({**record, "feature_names": list(reversed(RERANK_FEATURES))}),
        json.dumps({k: v for k, v in record.items() if k != "lam"}),
    ):
        with pytest.raises(UserInputError):
            StoreReranker.from_json(bad)
    with pytest.raises(UserInputError):
        RerankState.from_json(json.dumps({"attempted": -1, "model": None}))
    with pytest.raises(UserInputError):
        RerankState.from_json("[]")


# -- the fit and its schedule ---------------------------------------------------------------------
def _rows(n_searches: int, *, signal: bool = True, seed: int = 0) -> TrainingSet:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_searches * 5, len(RERANK_FEATURES)))
    y = (X[:, COL["timed"]] > 0.8).astype(np.int8) if signal else np.zeros(n_searches * 5, dtype=np.int8)
    search = np.repeat(np.arange(n_searches), 5)
    return TrainingSet(
        X=X,
        y=y,
        groups=(search % rerank_fit.FOLDS).astype(str),
        feature_names=RERANK_FEATURES,
        search_ids=search.astype(str),
        memory_ids=np.arange(len(y)).astype(str),
    )


def test_fit_learns_what_marks_a_used_memory_and_refuses_one_label() -> None:
    state = rerank_fit.fit(_rows(40), searches=40, at=5.0)
    assert state.model is not None and state.attempted == 40
    weights = state.model.describe()["weights"]
    assert max(weights, key=lambda k: abs(weights[k])) == "timed" and weights["timed"] > 0
    assert state.model.lam in rerank_fit.LAMBDAS
    assert state.model.rows == 200 and state.model.searches == 40 and state.model.fitted_at == 5.0
    empty = rerank_fit.fit(_rows(40, signal=False), searches=40, at=5.0)
    assert empty.model is None and empty.attempted == 40


def test_fits_are_due_at_20_then_each_time_the_count_grew_by_half() -> None:
    fresh = RerankState(attempted=0, model=None, baseline=7)
    assert not due(19, fresh) and due(20, fresh) and next_due(fresh) == 20
    state = RerankState(attempted=20, model=None)
    assert next_due(state) == 30 and not due(29, state) and due(30, state)
    assert next_due(RerankState(attempted=30, model=None)) == 45
    assert next_due(RerankState(attempted=3, model=None)) == 20


# -- a store that fits its own --------------------------------------------------------------------
WHEN = "When did Ann go to the lake?"
LATER = "When did Ann go to Rome?"


def _store(path: str, rerank: str = "store") -> ReMem:
    return ReMem(path, config=RememConfig(rerank=rerank))  # type: ignore[arg-type]


def _served(mem: ReMem, search_id: str) -> tuple[Mapping[str, Any], ...]:
    with mem.store.read() as tx:
        record = tx.search(search_id)
    assert record is not None
    return record.served


def _turns(mem: ReMem, place: str = "the lake", scope: str | None = None) -> str:
    """Look-alike turns that match a "when" question about ``place`` better than the one that dates it (in
    ``scope``); returns the dated turn's id."""
    turns = [
        {"speaker": "Ann", "text": f"Ann went to {place} with friends, {place} with friends was great", "session": "a"},
        {"speaker": "Ann", "text": f"Ann: {place}, Ann loves to go to {place}", "session": "b"},
        {"speaker": "Ann", "text": f"Did Ann go to {place}? Ann did go to {place}", "session": "c"},
        {"speaker": "Ann", "text": f"we were there on {len(place)} May", "session": place},
    ]
    return mem.add_conversation(turns, scope=scope)[3]


def _teach(mem: ReMem) -> str:
    """Feedback that the dated turn is what a "when" question used, until a fit is due."""
    timed = _turns(mem)
    for _ in range(rerank_fit.MIN_SEARCHES):
        mem.feedback(mem.search(WHEN, k=4).search_id, success=True, used_ids=[timed])
    return timed


def test_a_store_fits_on_its_feedback_and_serves_by_it(store_location: StoreLocation) -> None:
    path = str(store_location("rerank"))
    with _store(path) as mem:
        timed = _turns(mem)
        first = mem.search(WHEN, k=4)
        assert first.items[0].id != timed  # the look-alikes match the question better
        assert all(len(item["r"]) == len(RERANK_FEATURES) for item in _served(mem, first.search_id))
        for i in range(rerank_fit.MIN_SEARCHES):
            assert mem.reranker.state.attempted == 0 and mem.reranker.model() is None
            res = first if i == 0 else mem.search(WHEN, k=4)
            mem.feedback(res.search_id, success=True, used_ids=[timed])
        state = mem.reranker.state
        assert state.attempted == rerank_fit.MIN_SEARCHES and state.model is not None and state.baseline == 0
        assert state.model.describe()["weights"]["timed_when"] > 0
        # what it learned carries to memories it never served: a dated turn about another place comes first
        dated = _turns(mem, "Rome", scope="trip")
        after = mem.search(LATER, k=4, explain=True, scope="trip")
        assert after.items[0].id == dated
        assert after.items[0].explain is not None and "component.rerank" in after.items[0].explain
        stored = mem.store.get_meta(META_KEY)
    assert stored is not None
    with _store(path) as again:  # a reopened store serves the stored model
        assert again.reranker.state == RerankState.from_json(stored)
        assert again.search(LATER, k=4, scope="trip").items[0].id == dated
    with _store(path, rerank="off") as off:  # off: the stored model is not used, nothing is recorded
        res = off.search(LATER, k=4, scope="trip")
        assert res.items[0].id != dated
        assert all("r" not in item for item in _served(off, res.search_id))


def test_the_same_feedback_without_the_reranker_does_not_carry(store_location: StoreLocation) -> None:
    with _store(str(store_location("twin")), rerank="off") as twin:
        _teach(twin)
        dated = _turns(twin, "Rome", scope="trip")
        assert twin.search(LATER, k=4, scope="trip").items[0].id != dated


def test_repeated_feedback_counts_once_and_off_fits_nothing(store_location: StoreLocation) -> None:
    with _store(str(store_location("once"))) as mem:
        timed = _turns(mem)
        res = mem.search(WHEN, k=4)
        for _ in range(rerank_fit.MIN_SEARCHES + 5):
            mem.feedback(res.search_id, success=True, used_ids=[timed])  # idempotent: one answered search
        assert mem.reranker.state.attempted == 0 and mem.reranker.model() is None
    with _store(str(store_location("off")), rerank="off") as mem:
        timed = _turns(mem)
        for _ in range(rerank_fit.MIN_SEARCHES + 5):
            mem.feedback(mem.search(WHEN, k=4).search_id, success=True, used_ids=[timed])
        assert mem.store.get_meta(META_KEY) is None


def test_fit_reranker_fits_now_and_says_when_it_cannot(store_location: StoreLocation) -> None:
    with _store(str(store_location("now"))) as mem:
        timed = _turns(mem)
        none = mem.fit_reranker()  # no answered search yet
        assert none.model is None and none.attempted == 0
        for _ in range(6):
            mem.feedback(mem.search(WHEN, k=4).search_id, success=True, used_ids=[timed])
        state = mem.fit_reranker()
        assert state.model is not None and state.attempted == 6
        assert RerankState.from_json(mem.store.get_meta(META_KEY) or "") == state


def test_a_bad_setting_is_refused() -> None:
    with pytest.raises(UserInputError, match="rerank"):
        RememConfig(rerank="always")  # type: ignore[arg-type]
    assert replace(RememConfig(), rerank="store").rerank == "store"


def test_searches_answered_before_the_reranker_count_from_its_baseline(store_location: StoreLocation) -> None:
    path = str(store_location("baseline"))
    with _store(path, rerank="off") as before:
        timed = _turns(before)
        _turns(before, "the sea", scope="other")
        for _ in range(25):  # answered searches from before, in another scope
            before.feedback(before.search("When did Ann go to the sea?", k=4, scope="other").search_id, success=False)
    with _store(path) as mem:
        assert mem.reranker.state.baseline == 25 and mem.reranker.state.attempted == 0
        for _ in range(rerank_fit.MIN_SEARCHES - 1):
            mem.feedback(mem.search(WHEN, k=4).search_id, success=True, used_ids=[timed])
        assert mem.reranker.model() is None
        mem.feedback(mem.search(WHEN, k=4).search_id, success=True, used_ids=[timed])
        state = mem.reranker.state
        assert state.attempted == rerank_fit.MIN_SEARCHES and state.baseline == 25 and state.model is not None
        with mem.store.read() as tx:
            served = [item for _, items, _ in tx.answered_searches() for item in items]
        # only the served rows that recorded re-rank features are read: the 25 searches from before have none
        assert state.model.rows == sum("r" in item for item in served) < len(served)


def test_a_fit_reads_the_latest_searches_only(store_location: StoreLocation, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rerank_fit, "MAX_SEARCHES", 8)
    with _store(str(store_location("latest"))) as mem:
        timed = _turns(mem)
        for _ in range(12):
            mem.feedback(mem.search(WHEN, k=4).search_id, success=True, used_ids=[timed])
        state = mem.fit_reranker()
        with mem.store.read() as tx:
            every = list(tx.answered_searches())
            latest = [sid for sid, _, _ in tx.answered_searches(5)]
        assert latest == [sid for sid, _, _ in every[-5:]]
        assert state.attempted == 12 and state.model is not None
        assert state.model.rows == sum(len(items) for _, items, _ in every[-8:]) < sum(len(i) for _, i, _ in every)


def test_a_fit_reads_the_credits_of_its_searches_in_chunks(
    store_location: StoreLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_outcomes, "_CHUNK", 2)  # five searches: three statements, the last with one id
    with _store(str(store_location("credits"))) as mem:
        timed = _turns(mem)
        sids = []
        for i in range(5):
            sid = mem.search(WHEN, k=4).search_id
            mem.feedback(sid, success=i % 2 == 0, used_ids=[timed])
            sids.append(sid)
        mem.search(WHEN, k=4)  # unanswered: no credit rows
        with mem.store.read() as tx:
            one_by_one = {(c.search_id, c.memory_id): c.credit for s in sids for c in tx.credits_for_search(s)}
            assert tx.credits_of_searches([*sids, sids[0]]) == one_by_one
            assert {sid for sid, _ in one_by_one} == set(sids) and len(set(one_by_one.values())) > 1
            assert tx.credits_of_searches(sids[1:2]) == {k: v for k, v in one_by_one.items() if k[0] == sids[1]}
            assert tx.credits_of_searches([]) == {}
        rows = training.rerank_rows(mem.store, latest=10, folds=5, feature_names=RERANK_FEATURES)
        assert int(rows.y.sum()) == 3  # the used turn of each successful search, from the credits read at once


def test_searches_do_not_wait_for_a_fit_and_a_second_fit_skips(store_location: StoreLocation) -> None:
    import threading

    with _store(str(store_location("nowait"))) as mem:
        timed = _turns(mem)
        for _ in range(rerank_fit.MIN_SEARCHES - 1):
            mem.feedback(mem.search(WHEN, k=4).search_id, success=True, used_ids=[timed])
        fitting = mem.reranker._fit_lock  # as if another thread were fitting
        fitting.acquire()
        try:
            done = threading.Event()

            def search_and_feedback() -> None:
                res = mem.search(WHEN, k=4)
                mem.feedback(res.search_id, success=True, used_ids=[timed])  # due, but the fit is taken: skips
                done.set()

            worker = threading.Thread(target=search_and_feedback, daemon=True)
            worker.start()
            worker.join(timeout=60)
            assert done.is_set()
            assert mem.reranker.model() is None
        finally:
            fitting.release()
        mem.feedback(mem.search(WHEN, k=4).search_id, success=True, used_ids=[timed])  # the next one fits
        assert mem.reranker.state.attempted == rerank_fit.MIN_SEARCHES + 1 and mem.reranker.model() is not None


def test_explain_shows_the_logit_for_the_head_only(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", config=RememConfig(rerank="store", p_floor=0.0)) as mem:  # no floor: serve k
        timed = _turns(mem)
        mem.add_many([f"a note about the weather on day {i}" for i in range(RERANK_DEPTH + 5)])
        for _ in range(rerank_fit.MIN_SEARCHES):
            res = mem.search(WHEN, k=4)
            mem.feedback(res.search_id, success=timed in res.ids, used_ids=[timed] if timed in res.ids else [])
        assert mem.reranker.model() is not None
        hits = mem.search(WHEN, k=RERANK_DEPTH + 5, explain=True).items
        assert len(hits) > RERANK_DEPTH
        shown = ["component.rerank" in (h.explain or {}) for h in hits]
        assert sum(shown) == RERANK_DEPTH and all(shown[:RERANK_DEPTH])
        assert all(v == v for h in hits for v in (h.explain or {}).values())  # no NaN reaches a reader


def test_a_fit_that_cannot_read_its_rows_warns_and_the_feedback_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: object, **__: object) -> TrainingSet:
        raise UserInputError("re-rank features contain non-finite values")

    monkeypatch.setattr(rerank_fit, "rerank_rows", broken)
    with _store(str(tmp_path / "s")) as mem:
        timed = _turns(mem)
        receipts = [
            mem.feedback(mem.search(WHEN, k=4).search_id, success=True, used_ids=[timed])
            for _ in range(rerank_fit.MIN_SEARCHES)
        ]
        assert all(r is not None for r in receipts)
        assert "could not be fitted" in caplog.text
        assert mem.reranker.model() is None and mem.reranker.state.attempted == 0
        with mem.store.read() as tx:
            assert tx.search_counts()[1] == rerank_fit.MIN_SEARCHES  # every verdict was stored
        with pytest.raises(UserInputError):  # asked for explicitly, the failure is raised
            mem.fit_reranker()
