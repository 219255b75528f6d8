"""The contribution utility: relevance as a prior, scaled by how often a memory was used when served."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from remem_agent import RememConfig
from remem_agent.errors import UserInputError
from remem_agent.ranking.features import FEATURE_NAMES
from remem_agent.ranking.utility import ContributionUtility, HeuristicUtility


def _features(
    retrieval: list[float], shown: list[float], credit: list[float], other_shown: float = 0.0, k: float = 2.0
) -> dict[str, np.ndarray]:
    """Feature arrays as build_features writes them for these per-class counts (every exposure in-class
    unless ``other_shown`` adds exposures, never credited, in another class)."""
    n = len(retrieval)
    f = {name: np.zeros(n) for name in FEATURE_NAMES}
    ret = np.array(retrieval)
    f["retrieval"] = f["similarity"] = ret
    f["gap"] = ret.max() - ret
    sh, cr = np.array(shown), np.array(credit)
    f["evidence"] = sh / (sh + k)
    f["rate_class"] = (1 + cr) / (2 + sh)
    sh_all = sh + other_shown
    f["evidence_all"] = sh_all / (sh_all + k)
    f["rate_all"] = (1 + cr) / (2 + sh_all)
    return f


def _prior(retrieval: list[float]) -> np.ndarray:
    h = HeuristicUtility()
    ret = np.array(retrieval)
    z = h.bias + h.weights["retrieval"] * ret + h.weights["gap"] * (ret.max() - ret)
    return 1 / (1 + np.exp(-z))


def test_an_unseen_memory_is_ranked_by_its_relevance_prior() -> None:
    u = ContributionUtility(explore="none")
    p, comps = u.score(_features([0.9, 0.5], [0, 0], [0, 0]))
    assert p == pytest.approx(_prior([0.9, 0.5]))
    assert p[0] > p[1]
    assert comps["posterior"] == pytest.approx(p)


def test_p_is_the_prior_times_the_gamma_poisson_posterior_of_the_contribution_factor() -> None:
    u = ContributionUtility(kappa=2.0, other_weight=0.5, explore="none")
    p, comps = u.score(_features([0.9, 0.5], [6, 3], [1.5, 2.0], other_shown=4))
    m0 = _prior([0.9, 0.5])
    # hand-computed: m0 (kappa + a_c + w a_o) / (kappa + m0 (n_c + w n_o)); 4 uncredited exposures elsewhere
    assert p[0] == pytest.approx(m0[0] * (2 + 1.5) / (2 + m0[0] * (6 + 0.5 * 4)))
    assert p[1] == pytest.approx(m0[1] * (2 + 2.0) / (2 + m0[1] * (3 + 0.5 * 4)))
    assert comps["contribution"][1] > 1 > comps["contribution"][0]  # used more / less than its relevance said


def test_a_never_used_look_alike_sinks_below_a_less_similar_memory_within_a_few_exposures() -> None:
    u = ContributionUtility(kappa=2.0, explore="none")
    sank_after = None
    for n in range(0, 20):
        p, _ = u.score(_features([1.0, 0.5], [n, 0], [0, 0]))
        if p[0] < p[1]:
            sank_after = n
            break
    m0 = _prior([1.0, 0.5])
    bound = math.floor(2.0 * (1 / m0[1] - 1 / m0[0])) + 1  # kappa / (kappa / m0 + n) < m0' from this n on
    assert sank_after is not None and sank_after <= bound <= 12, (sank_after, bound)


def test_a_look_alike_that_starts_contributing_recovers() -> None:
    u = ContributionUtility(kappa=2.0, explore="none")
    sunk, _ = u.score(_features([1.0, 0.5], [10, 0], [0, 0]))
    assert sunk[0] < sunk[1]
    risen, _ = u.score(_features([1.0, 0.5], [16, 0], [6, 0]))  # then used on each of 6 exposures
    assert risen[0] > risen[1] and risen[0] > sunk[0]


def test_exploration_favours_the_memory_with_the_least_evidence() -> None:
    u = ContributionUtility(explore="ucb", explore_c=0.2)
    p, comps = u.score(_features([0.7, 0.7], [0, 30], [0, 15]))
    assert comps["explore"][0] > comps["explore"][1] > 0
    assert p[0] - comps["posterior"][0] == pytest.approx(comps["explore"][0])


def test_thompson_draws_are_seeded() -> None:
    feats = _features([0.9, 0.5, 0.3], [1, 2, 0], [0, 1, 0])
    a, _ = ContributionUtility(explore="thompson", seed=3).score(feats)
    b, _ = ContributionUtility(explore="thompson", seed=3).score(feats)
    assert a.tolist() == b.tolist()


def test_the_config_builds_it_and_refuses_bad_settings() -> None:
    cfg = RememConfig(utility="contribution", contribution_kappa=3.0, contribution_other_weight=0.25)
    model = cfg.make_utility()
    assert isinstance(model, ContributionUtility) and model.kappa == 3.0 and model.other_weight == 0.25
    for bad in ({"contribution_kappa": 0.0}, {"contribution_other_weight": 1.5}, {"item_cost": -0.1}):
        with pytest.raises(UserInputError):
            RememConfig(**bad)  # type: ignore[arg-type]


# -- each kind's contribution (ledger schema 16) -------------------------------------------------------------


def test_a_kinds_factor_is_the_gamma_poisson_mean_of_its_uses_over_expected_uses() -> None:
    from remem_agent.ranking.utility import group_factors

    groups = {"note": (0.0, 10.0), "state": (6.0, 4.0)}
    got = group_factors(groups, ["note", "state", "preference"], 5.0)
    assert got.tolist() == pytest.approx([5 / 15, 11 / 9, 1.0])  # a kind never judged starts at 1
    assert group_factors(groups, ["note"], 0.0).tolist() == pytest.approx([0.0])


def test_an_unseen_memory_of_a_kind_that_never_helps_starts_below_one_of_a_kind_that_does() -> None:
    u = ContributionUtility(kappa=1.0, explore="none")
    feats = _features([0.8, 0.7], [0, 0], [0, 0])
    plain, _ = u.score(feats)
    assert plain[0] > plain[1]  # by relevance alone the look-alike note leads
    feats["group_factor"] = np.array([0.2, 1.3])  # notes of this scope were never used, states were
    p, comps = u.score(feats)
    assert p[1] > p[0] and comps["contribution"].tolist() == pytest.approx([0.2, 1.3])
    # its own evidence still decides: the kind's prior is worth kappa uses, so a note of that kind used on each
    # of its exposures climbs, and passes the state fact once its own record outweighs the kind's (30 uses)
    climb = []
    for n in (5, 30):
        used = _features([0.8, 0.7], [n, 0], [n, 0])
        used["group_factor"] = np.array([0.2, 1.3])
        p2, c2 = u.score(used)
        m0 = _prior([0.8, 0.7])[0]
        # theta = (kappa + a) / (kappa / g + E), E = m0 * n (no recorded priors), a = n
        assert c2["contribution"][0] == pytest.approx((1.0 + n) / (1.0 / 0.2 + m0 * n))
        climb.append(p2[0] > p2[1])
    assert climb == [False, True]


def test_one_lucky_use_lifts_a_memory_of_a_rarely_used_kind_no_more_than_one_of_a_common_kind() -> None:
    """The kind's prior is worth kappa uses whatever its mean: one use moves theta by the same share of the
    prior's mean for a rare kind (g = 0.2) as for a common one (g = 1), instead of several times more."""
    u = ContributionUtility(kappa=4.0, explore="none")
    lifts = []
    for g in (0.2, 1.0):
        f = _features([0.5, 0.5], [1, 0], [1, 0])
        f["group_factor"] = np.array([g, g])
        _, comps = u.score(f)
        lifts.append(comps["contribution"][0] / comps["contribution"][1])  # used once vs unseen, same kind
    assert lifts[0] == pytest.approx(lifts[1], rel=0.35) and lifts[0] < 1.3


def _served_and_judged(mem: Any) -> None:
    ids = mem.add_many(
        [
            {"text": "The billing service runs in eu-west-1.", "entity": "billing", "attribute": "region"},
            {"text": "Where does billing run? Ask the billing team.", "role": "note"},
        ]
    )
    for _ in range(3):
        res = mem.search("Where does the billing service run?", k=2)
        mem.feedback(res.search_id, success=True, used_ids=[ids[0]] if ids[0] in res.ids else None)


def test_feedback_counts_each_kinds_uses_and_verify_checks_them(store_location: Any) -> None:
    from remem_agent import ReMem

    cfg = RememConfig(utility="contribution")
    with ReMem(store_location("s"), config=cfg, embedder="hash") as mem:
        _served_and_judged(mem)
        with mem.store.read() as tx:
            groups = tx.group_contribution("default")
            rows = tx.run(
                "SELECT m.role, c.credit, c.expected FROM credits c JOIN memories m ON m.id = c.memory_id"
            ).fetchall()
        assert len(rows) == 6 and set(groups) == {"state", "note"}
        for role in ("state", "note"):  # the credit rows' uses (capped at 1) and expected uses, summed per kind
            mine = [(min(1.0, cr), ex) for r, cr, ex in rows if r == role]
            assert groups[role] == pytest.approx((sum(u for u, _ in mine), sum(e for _, e in mine)))
        assert groups["state"][0] > 0 and groups["note"][0] == 0.0 and groups["note"][1] > 0
        assert mem.verify().ok
        with mem.store.write() as tx:
            tx.run("UPDATE group_contribution SET uses = uses + 1 WHERE role = 'note'")
        problems = mem.verify().problems
        assert any("contribution of note memories" in p for p in problems)


def test_migration_16_counts_the_credits_already_written(tmp_path: Any) -> None:
    import sqlite3

    import _sqlite_downgrades
    from _sqlite_downgrades import SQLITE_16_TO_15

    from remem_agent import ReMem

    cfg = RememConfig(utility="contribution")
    with ReMem(tmp_path / "s", config=cfg, embedder="hash") as mem:
        _served_and_judged(mem)
        with mem.store.read() as tx:
            before = tx.group_contribution("default")
    conn = sqlite3.connect(tmp_path / "s" / "ledger.db")
    _sqlite_downgrades.downgrade(conn, SQLITE_16_TO_15)
    conn.close()
    with ReMem(tmp_path / "s", config=cfg, embedder="hash") as mem:
        assert mem.store.schema_version == 16
        with mem.store.read() as tx:
            after = tx.group_contribution("default")
        assert after.keys() == before.keys()
        for role, (uses, expected) in before.items():
            assert after[role] == pytest.approx((uses, expected))
        assert mem.verify().ok
