"""Exploratory serving with logged propensities, and off-policy evaluation over the logs."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from remem_agent import ReMem, RememConfig
from remem_agent.cli import main as cli_main
from remem_agent.errors import NoPropensitiesError, UserInputError
from remem_agent.learning import ope
from remem_agent.learning.ope import (
    Estimate,
    LoggedDecision,
    doubly_robust,
    evaluate_decisions,
    evaluate_policy,
    ips,
    read_decisions,
    snips,
)
from remem_agent.ranking.explore import draw, draw_for
from remem_agent.store import hashing

EXPLORING = RememConfig(explore_serving=0.5, explore_width=3, explore_seed=7)
NOTES = [f"Deploy note {i}: the {w} service runs in region {i}." for i, w in enumerate("abcdefghij")]
T0 = 1_700_000_000.0


# -- the estimators, against values computed by hand -------------------------------------------------------


def test_ips_is_the_mean_of_weight_times_reward_with_a_normal_interval() -> None:
    e = ips([1, 0, 1, 1], [2.0, 0.0, 1.25, 0.0])
    assert e.value == pytest.approx(0.8125)  # (2 + 0 + 1.25 + 0) / 4
    # terms 2, 0, 1.25, 0: sample variance 2.921875 / 3, standard error its root over 2
    se = math.sqrt(2.921875 / 3) / 2
    assert e.low == pytest.approx(0.8125 - 1.959964 * se, abs=1e-6)
    assert e.high == pytest.approx(0.8125 + 1.959964 * se, abs=1e-6)
    assert e.half_width == pytest.approx(1.959964 * se, abs=1e-6)


def test_snips_normalises_by_the_weights_and_uses_the_delta_method() -> None:
    r, w = [1, 0, 1, 0], [2.0, 1.0, 1.25, 0.0]
    e = snips(r, w)
    v = 3.25 / 4.25
    assert e.value == pytest.approx(v)
    # var = mean(w^2 (r - v)^2) / mean(w)^2 / n
    var = (4 * (1 - v) ** 2 + 1 * v**2 + 1.5625 * (1 - v) ** 2 + 0) / 4 / (4.25 / 4) ** 2 / 4
    assert e.half_width == pytest.approx(1.959964 * math.sqrt(var), abs=1e-6)
    nothing = snips([1, 0], [0.0, 0.0])  # the target never chose a logged set
    assert math.isnan(nothing.value) and nothing.low == -math.inf and nothing.high == math.inf


def test_doubly_robust_adds_the_weighted_residual_to_the_models_prediction() -> None:
    e = doubly_robust([1, 0, 1, 0], [2.0, 1.0, 1.25, 0.0], [0.5] * 4, [0.4, 0.6, 0.5, 0.5])
    # terms: .5 + 2(.6) = 1.7; .5 + 1(-.6) = -.1; .5 + 1.25(.5) = 1.125; .5 + 0 = .5
    assert e.value == pytest.approx((1.7 - 0.1 + 1.125 + 0.5) / 4)
    terms = np.array([1.7, -0.1, 1.125, 0.5])
    assert e.half_width == pytest.approx(1.959964 * terms.std(ddof=1) / 2, abs=1e-6)


def test_no_searches_is_a_typed_error() -> None:
    with pytest.raises(UserInputError):
        ips([], [])
    with pytest.raises(NoPropensitiesError):
        evaluate_decisions([], RememConfig())


# -- the exploratory draw ---------------------------------------------------------------------------------


def _choose(table: dict[int | None, list[int]]) -> Any:
    return lambda j: table[j]


def test_the_draw_writes_out_every_sets_probability_and_each_candidates_inclusion() -> None:
    p = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    choose = _choose({None: [0, 1], 2: [0, 2], 3: [0, 1, 3]})
    fits = np.ones(5, dtype=bool)
    d = draw(choose, p, epsilon=0.2, width=2, u=0.1, excluded=None, fits=fits)
    assert d.chosen == d.greedy == (0, 1) and d.explored is None and d.probability == pytest.approx(0.8)
    # three alternatives, 0.2 / 3 each: put 2 in, put 3 in, cut S* short to its first memory
    third = 0.2 / 3
    assert dict(d.support) == pytest.approx({(0, 1): 0.8, (0, 2): third, (0, 1, 3): third, (0,): third})
    assert d.inclusion.tolist() == pytest.approx([1.0, 0.8 + third, third, third, 0.0])
    assert draw(choose, p, epsilon=0.2, width=2, u=0.85, excluded=None, fits=fits).chosen == (0, 2)
    assert draw(choose, p, epsilon=0.2, width=2, u=0.9, excluded=None, fits=fits).chosen == (0, 1, 3)
    last = draw(choose, p, epsilon=0.2, width=2, u=0.95, excluded=None, fits=fits)
    assert last.chosen == (0,) and last.explored == 2 and last.probability == pytest.approx(third)


def test_alternatives_that_coincide_add_up_and_copies_and_misfits_are_not_put_in() -> None:
    p = np.array([0.9, 0.8, 0.7, 0.6])
    choose = _choose({None: [0, 1], 3: [0, 1]})
    excluded = np.array([False, False, True, False])  # 2 is a copy of a better-scored text
    d = draw(choose, p, epsilon=0.3, width=4, u=0.0, excluded=excluded, fits=np.ones(4, dtype=bool))
    assert dict(d.support) == pytest.approx({(0, 1): 0.85, (0,): 0.15})  # putting 3 in gives S* again
    none_fit = draw(choose, p, epsilon=0.3, width=4, u=0.99, excluded=None, fits=np.array([True, True, False, False]))
    assert dict(none_fit.support) == pytest.approx({(0, 1): 0.7, (0,): 0.3}) and none_fit.chosen == (0,)
    single = draw(_choose({None: [0]}), p, epsilon=0.3, width=4, u=0.99, excluded=None, fits=np.zeros(4, dtype=bool))
    assert single.support == (((0,), 1.0),) and single.chosen == (0,)  # nothing to put in, nothing to cut


def test_the_draw_number_is_fixed_by_the_seed_and_the_search() -> None:
    a = draw_for(7, "default", "q", None, 1.0, None, 5, None)
    assert a == draw_for(7, "default", "q", None, 1.0, None, 5, None)
    assert a != draw_for(8, "default", "q", None, 1.0, None, 5, None)
    assert 0 <= a < 1 and 0 <= draw_for(0, "\ud800") < 1  # a lone surrogate in a query does not break it


# -- logging -------------------------------------------------------------------------------------------------


def _fill(mem: ReMem) -> list[str]:
    return mem.add_many([{"text": t, "timestamp": T0 - 3600} for t in NOTES])


def _decision_rows(path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(path / "ledger.db") as conn:
        return list(conn.execute("SELECT search_id, decision, hash FROM search_decisions"))


def test_each_exploring_search_stores_its_pool_and_exact_probabilities(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", config=EXPLORING) as mem:
        ids = _fill(mem)
        results = [mem.search(f"where does service {w} run?", k=3, now=T0 + i) for i, w in enumerate("abcdef")]
        rows = {sid: json.loads(text) for sid, text, _ in _decision_rows(tmp_path / "s")}
        assert set(rows) == {r.search_id for r in results}
        explored = 0
        for res in results:
            rec = rows[res.search_id]
            pool, policy = rec["pool"], rec["policy"]
            assert set(rec["ids"]) <= set(ids) and len(rec["ids"]) == len(pool["tokens"])
            assert [rec["ids"][i] for i in policy["chosen"]] == list(res.ids)  # served = the drawn set
            support = {tuple(s): prob for s, prob in policy["support"]}
            assert sum(support.values()) == pytest.approx(1.0)
            assert support[tuple(sorted(policy["chosen"]))] == pytest.approx(policy["probability"])
            assert support[tuple(sorted(policy["greedy"]))] >= 0.5  # 1 - epsilon, plus any alternative equal to it
            incl = np.array(policy["inclusion"])
            assert incl.sum() == pytest.approx(sum(len(s) * q for s, q in support.items()))
            assert all(incl[i] > 0 for i in policy["chosen"])
            explored += policy["explored"] is not None
        assert 0 < explored < len(results)  # half the draws explore: with six searches, some of each
        assert mem.verify().ok


def test_a_search_and_its_decision_are_written_together_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ReMem(tmp_path / "s", config=EXPLORING) as mem:
        _fill(mem)

        def broken(*_: object) -> str:
            raise RuntimeError("crash between the search row and its decision")

        monkeypatch.setattr(hashing, "decision_hash", broken)
        with pytest.raises(RuntimeError):
            mem.search("where does service a run?", now=T0)
        with mem.store.read() as tx:
            assert tx.search_counts() == (0, 0)
        assert _decision_rows(tmp_path / "s") == []
        assert mem.verify().ok


def test_a_rerun_serves_the_same_sets_bit_for_bit(tmp_path: Path) -> None:
    def session(path: Path) -> list[tuple[list[int], str]]:
        with ReMem(path, config=EXPLORING) as mem:
            _fill(mem)
            out = []
            for i, w in enumerate("abcdefgh"):
                res = mem.search(f"where does service {w} run?", k=3, now=T0 + i)
                mem.feedback(res.search_id, success=i % 2 == 0)
            for _, text, _ in _decision_rows(path):
                rec = json.loads(text)
                out.append((rec["policy"]["chosen"], json.dumps(rec["policy"]["support"])))
            return sorted(out)

    assert session(tmp_path / "a") == session(tmp_path / "b")


def test_without_exploration_nothing_more_is_stored(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        _fill(mem)
        mem.search("where does service a run?", now=T0)
    assert _decision_rows(tmp_path / "s") == []


def test_an_edited_decision_fails_verify_and_cannot_be_updated(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", config=EXPLORING) as mem:
        _fill(mem)
        sid = mem.search("where does service a run?", now=T0).search_id
    with sqlite3.connect(tmp_path / "s" / "ledger.db") as conn:
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE search_decisions SET decision = '{}' WHERE search_id = ?", (sid,))
        conn.execute("DROP TRIGGER search_decisions_fixed")
        conn.execute("UPDATE search_decisions SET decision = '{}' WHERE search_id = ?", (sid,))
    with ReMem(tmp_path / "s") as mem:
        problems = mem.verify().problems
    assert any("decision" in p for p in problems)


# -- replay and evaluation -------------------------------------------------------------------------------


def _logged_store(path: Path, searches: int = 40) -> None:
    with ReMem(path, config=EXPLORING) as mem:
        ids = _fill(mem)
        for i in range(searches):
            w = "abcdefghij"[i % 10]
            res = mem.search(f"where does service {w} run?", k=3, now=T0 + i)
            gold = ids["abcdefghij".index(w)]
            ok = gold in res.ids
            mem.feedback(res.search_id, success=ok, cited_ids=[gold] if ok else None, now=T0 + i)


def test_replaying_the_logging_configuration_gives_back_its_own_choice(tmp_path: Path) -> None:
    _logged_store(tmp_path / "s")
    with ReMem(tmp_path / "s") as mem:
        decisions, without = read_decisions(mem.store)
        assert len(decisions) == 40 and without == 0
        utility = EXPLORING.make_utility()
        with mem.store.read() as tx:
            stored = {sid: decision["policy"] for sid, _, _, _, decision in tx.decisions()}
        for d in decisions:
            p, _ = d.view.scores(utility)
            assert sorted(d.view.choose(EXPLORING, p)) == sorted(stored[d.search_id]["greedy"])


def test_evaluate_policy_on_the_logging_configuration_matches_its_greedy_sets(tmp_path: Path) -> None:
    _logged_store(tmp_path / "s")
    with ReMem(tmp_path / "s") as mem:
        decisions, _ = read_decisions(mem.store)
        res = evaluate_policy(mem.store, EXPLORING)
    greedy_served = [d for d in decisions if d.probability >= 0.5 and d.served in d.support]
    assert res.searches == 40 and 0 < res.match_rate <= 1 and res.support_rate == 1.0
    # IPS by hand: the logged sets the target (= the greedy ranking) also chooses, weighted by 1 / mu
    w = [1 / d.probability if _target_set(d) == d.served else 0.0 for d in decisions]
    r = [d.reward for d in decisions]
    assert res.ips.value == pytest.approx(float(np.mean(np.array(w) * np.array(r))))
    assert res.snips.value == pytest.approx(sum(a * b for a, b in zip(w, r, strict=True)) / sum(w))
    assert len(greedy_served) >= 1
    for e in (res.ips, res.snips, res.dr, res.logged):
        assert isinstance(e, Estimate) and e.low <= e.value <= e.high
    assert set(res.to_dict()) >= {"ips", "snips", "dr", "match_rate", "support_rate", "effective_n"}


def test_a_target_with_the_floor_exemption_is_replayed(tmp_path: Path) -> None:
    """A stored pool holds what the exemption reads (each candidate's outcome features and recorded priors), so a
    target with ``p_floor_exempt`` is estimated like any other, and it serves a superset of the same target
    without it."""
    _logged_store(tmp_path / "s")
    plain = replace(EXPLORING, p_floor=0.9)
    target = replace(plain, p_floor_exempt=1.0)
    with ReMem(tmp_path / "s") as mem:
        decisions, _ = read_decisions(mem.store)
        res = evaluate_policy(mem.store, target)
    assert res.searches == 40
    grew = 0
    for d in decisions:
        p, _ = d.view.scores(target.make_utility())
        without, with_ = set(d.view.choose(plain, p)), set(d.view.choose(target, p))
        assert without <= with_ or len(with_) == d.view.k
        grew += len(with_) > len(without)
    assert grew > 0
    for e in (res.ips, res.snips, res.dr):
        assert e.low <= e.value <= e.high


def test_a_target_with_the_store_reranker_is_refused(tmp_path: Path) -> None:
    _logged_store(tmp_path / "s")
    with ReMem(tmp_path / "s") as mem, pytest.raises(UserInputError, match="re-ranker"):
        evaluate_policy(mem.store, replace(EXPLORING, rerank="store"))


def _target_set(d: LoggedDecision) -> frozenset[int]:
    p, _ = d.view.scores(EXPLORING.make_utility())
    return frozenset(d.view.choose(EXPLORING, p))


def test_a_target_that_changes_k_is_replayed_with_that_k(tmp_path: Path) -> None:
    _logged_store(tmp_path / "s")
    with ReMem(tmp_path / "s") as mem:
        one = evaluate_policy(mem.store, EXPLORING, k=1)
        with pytest.raises(UserInputError):
            evaluate_policy(mem.store, EXPLORING, k=0)
    # only a logged set of one memory can match, and only if it is the target's one memory
    decisions, _ = read_decisions_of(tmp_path / "s")
    utility = EXPLORING.make_utility()
    matched = []
    for d in decisions:
        view = replace(d.view, k=1)
        chosen = frozenset(view.choose(EXPLORING, view.scores(utility)[0]))
        assert len(chosen) <= 1
        matched.append(chosen == d.served)
    assert any(len(d.served) > 1 for d in decisions)
    assert one.match_rate == pytest.approx(float(np.mean(matched))) and one.match_rate < 1
    assert 0 <= one.dr.value <= 1


def read_decisions_of(path: Path) -> tuple[list[LoggedDecision], int]:
    with ReMem(path) as mem:
        return read_decisions(mem.store)


def test_a_store_without_propensities_is_refused_naming_the_migration(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        _fill(mem)
        res = mem.search("where does service a run?", now=T0)
        mem.feedback(res.search_id, success=True)
        with pytest.raises(NoPropensitiesError, match="migration 15"):
            evaluate_policy(mem.store, RememConfig())


def test_a_malformed_stored_decision_is_a_typed_error() -> None:
    with pytest.raises(UserInputError):
        LoggedDecision.parse("s1", None, {"success": True}, {"policy": {"chosen": [0]}})
    with pytest.raises(UserInputError):
        LoggedDecision.parse("s1", None, {"success": True}, {"policy": {}, "pool": {}})


def test_the_cli_prints_base_and_target_estimates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _logged_store(tmp_path / "s")
    code = cli_main(
        [
            "evaluate-policy",
            str(tmp_path / "s"),
            "--base",
            json.dumps({"explore_serving": 0.5, "explore_width": 3, "explore_seed": 7}),
            "--target",
            '{"p_floor": 0.5, "guard_top": 0}',
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"base", "target"} and out["base"]["searches"] == 40
    for est in ("ips", "snips", "dr"):
        assert out["target"][est]["low"] <= out["target"][est]["value"] <= out["target"][est]["high"]
    assert cli_main(["evaluate-policy", str(tmp_path / "s"), "--target", '{"no_such_field": 1}']) == 2
    assert "unknown config field" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["evaluate-policy", str(tmp_path / "s"), "--target", "[1, 2]"])


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"explore_serving": 1.0}, "explore_serving"),
        ({"explore_serving": -0.1}, "explore_serving"),
        ({"explore_width": 0}, "explore_width"),
        ({"explore_seed": -1}, "explore_seed"),
        ({"explore_serving": True}, "explore_serving"),
    ],
)
def test_bad_exploration_settings_are_a_typed_error(over: dict[str, Any], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        RememConfig(**over)


def test_overriding_a_configuration_checks_names_and_types() -> None:
    cfg = RememConfig().overriding(
        {"p_floor": 1, "features.groups": ["static"], "heuristic_weights": {"similarity": 2}}
    )
    assert cfg.p_floor == 1.0 and cfg.features.groups == ("static",)
    for bad in (
        {"nope": 1},
        {"p_floor": "high"},
        {"guard_top": True},
        {"features.nope": 1},
        {"k.x": 1},
        {"features": 1},
    ):
        with pytest.raises(UserInputError):
            RememConfig().overriding(bad)


def test_the_outcome_model_is_a_logistic_fit() -> None:
    X = np.array([[0.0], [0.0], [1.0], [1.0], [1.0], [0.0]])
    y = np.array([0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    q = ope.OutcomeModel.fit(X, y, lam=0.0).predict(np.array([[0.0], [1.0]]))
    assert q.tolist() == pytest.approx([1 / 3, 2 / 3], abs=1e-4)  # the group means, unpenalised


# -- both backends -----------------------------------------------------------------------------------------


def test_decisions_are_logged_evaluated_pruned_and_copied_on_each_backend(store_location: Any, tmp_path: Path) -> None:
    import time

    from remem_agent.store.copy import copy_store
    from remem_agent.store.pruning import GrowthLimits

    loc = store_location("s")
    with ReMem(loc, config=EXPLORING, embedder="hash") as mem:
        ids = mem.add_many([{"text": t, "timestamp": T0 - 3600} for t in NOTES])
        for i in range(12):
            w = "abcdefghij"[i % 10]
            res = mem.search(f"where does service {w} run?", k=3, now=T0 + i)
            if i < 8:  # the last four stay unjudged
                gold = ids["abcdefghij".index(w)]
                mem.feedback(res.search_id, success=gold in res.ids, now=T0 + i)
        decisions, without = read_decisions(mem.store)
        assert len(decisions) == 8 and without == 0
        before = evaluate_policy(mem.store, RememConfig(p_floor=0.5)).to_dict()
        with mem.store.read() as tx:
            assert len(list(tx.decisions())) == 12
        copy = tmp_path / "copy"
        copy_store(loc, copy)  # the decisions travel with their searches, and verify there
        with ReMem(copy, embedder="hash") as other:
            assert other.verify().ok
            assert evaluate_policy(other.store, RememConfig(p_floor=0.5)).to_dict() == before
        report = mem.store.prune(GrowthLimits(answer_ttl_s=86_400, retention_s=86_400), now=time.time() + 10 * 86_400)
        assert report.pruned_searches == 4
        with mem.store.read() as tx:
            assert len(list(tx.decisions())) == 8  # the unjudged searches' decisions went with them
        assert mem.verify().ok


def test_a_cut_short_set_keeps_the_rankings_order() -> None:
    p = np.array([0.9, 0.8, 0.7])
    # selection takes 2 first (the guard's), then 0 and 1; S* is served by score: 0, 1, 2
    d = draw(
        _choose({None: [0, 1, 2]}),
        p,
        priority=lambda chosen: [2, 0, 1],
        epsilon=0.5,
        width=0,
        u=0.99,
        excluded=None,
        fits=np.ones(3, dtype=bool),
    )
    assert dict(d.support) == pytest.approx({(0, 1, 2): 0.5, (2,): 0.25, (0, 2): 0.25})
    assert d.chosen == (0, 2)  # the prefix {2, 0}, served in S*'s order
