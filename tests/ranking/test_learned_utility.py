"""The learned utility: IRLS fit, CV lambda choice, metrics, persistence, and training rows from a real ledger."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from remem_agent import ReMem, RememConfig, UserInputError
from remem_agent.ranking.features import FEATURE_NAMES
from remem_agent.ranking.learned import DEFAULT_LAMBDAS, FORMAT_VERSION, LearnedUtility, irls, metrics, objective
from remem_agent.ranking.training import TrainingSet, concat, training_rows

D = len(FEATURE_NAMES)


def synthetic(
    n: int = 600, *, signal: str | None = "rate_class", strength: float = 3.0, groups: int = 3, seed: int = 0
) -> TrainingSet:
    """Rows whose label depends only on ``signal`` (or on nothing when ``signal`` is None)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    X[:, FEATURE_NAMES.index("stale")] = 0.0  # a constant feature
    z = -0.5 + (strength * X[:, FEATURE_NAMES.index(signal)] if signal else 0.0)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-z))).astype(np.int8)
    return TrainingSet(
        X=X,
        y=y,
        groups=np.array([f"seed{i % groups}" for i in range(n)]),
        feature_names=FEATURE_NAMES,
        search_ids=np.array([f"s{i // 5}" for i in range(n)]),
        memory_ids=np.array([f"m{i}" for i in range(n)]),
    )


def as_features(X: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
    return {name: X[:, j] for j, name in enumerate(FEATURE_NAMES)}


def standardised(ts: TrainingSet) -> NDArray[np.float64]:
    std = ts.X.std(axis=0)
    out: NDArray[np.float64] = (ts.X - ts.X.mean(axis=0)) / np.where(std > 0, std, 1.0)
    return out


# -- the solver --------------------------------------------------------------------------------------
def test_irls_gradient_is_zero_at_the_solution() -> None:
    ts = synthetic()
    S = standardised(ts)
    for lam in (1e-4, 1e-2, 1.0):
        w, b, iters = irls(S, ts.y, lam)
        _, gw, gb = objective(w, b, S, ts.y.astype(np.float64), lam)
        assert max(float(np.abs(gw).max()), abs(gb)) < 1e-8
        assert iters < 50


def test_irls_matches_scipy_on_the_same_objective() -> None:
    optimize = pytest.importorskip("scipy.optimize")
    ts = synthetic(n=300, seed=4)
    S = standardised(ts)
    y = ts.y.astype(np.float64)
    lam = 3e-3

    def fun(theta: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        j, gw, gb = objective(theta[:D], float(theta[D]), S, y, lam)
        return j, np.append(gw, gb)

    ref = optimize.minimize(fun, np.zeros(D + 1), jac=True, method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 0})
    w, b, _ = irls(S, ts.y, lam)
    np.testing.assert_allclose(w, ref.x[:D], atol=1e-5)
    assert abs(b - ref.x[D]) < 1e-5
    assert objective(w, b, S, y, lam)[0] <= ref.fun + 1e-12


def test_separable_data_and_constant_features_stay_finite() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, D))
    X[:, 5] = 7.0  # constant
    y = (X[:, 0] > 0).astype(np.int8)  # perfectly separable
    ts = TrainingSet(X, y, np.array(["a"] * 200), FEATURE_NAMES, np.array(["s"] * 200), np.array(["m"] * 200))
    model = LearnedUtility.fit(ts, lambdas=(1e-4,))
    assert np.isfinite(model.weights).all() and np.isfinite(model.intercept)
    assert model.weights[5] == 0.0
    assert model.weights[0] > 1.0
    # a single-class training fold (leave-one-group-out) still gives finite predictions
    groups = np.where(y == 1, "pos", "neg")
    ts2 = TrainingSet(X, y, groups, FEATURE_NAMES, np.array(["s"] * 200), np.array(["m"] * 200))
    m2 = LearnedUtility.fit(ts2, lambdas=(1e-2, 1.0))
    assert all(np.isfinite(e["log_loss"]) for e in m2.report["cv_log_loss"])


def test_fit_is_deterministic() -> None:
    ts = synthetic()
    a = LearnedUtility.fit(ts)
    b = LearnedUtility.fit(ts)
    assert np.array_equal(a.weights, b.weights)
    assert a.intercept == b.intercept
    assert a.report == b.report
    one = synthetic(groups=1)
    assert np.array_equal(LearnedUtility.fit(one).weights, LearnedUtility.fit(one).weights)


def test_learns_the_informative_feature() -> None:
    ts = synthetic(signal="rate_class")
    model = LearnedUtility.fit(ts)
    j = FEATURE_NAMES.index("rate_class")
    assert model.weights[j] > 0
    assert int(np.argmax(np.abs(model.weights))) == j
    rep = model.report
    assert rep["cv"] == "leave-one-group-out" and rep["folds"] == 3
    assert rep["n"] == len(ts) and rep["positives"] == ts.positives
    assert rep["cv_metrics"]["auc"] > 0.8
    assert rep["in_sample"]["auc"] > 0.8
    for key in ("auc", "brier", "ece"):
        assert 0.0 <= rep["cv_metrics"][key] <= 1.0


def test_cv_picks_more_regularisation_on_noise() -> None:
    clean = LearnedUtility.fit(synthetic(signal="rate_class", strength=3.0))
    noise = LearnedUtility.fit(synthetic(signal=None))
    assert noise.lam > clean.lam
    for model in (clean, noise):
        assert [e["lambda"] for e in model.report["cv_log_loss"]] == sorted(DEFAULT_LAMBDAS)
        best = min(e["log_loss"] for e in model.report["cv_log_loss"])
        assert model.report["cv_metrics"]["log_loss"] == pytest.approx(best)


def test_single_group_falls_back_to_kfold() -> None:
    model = LearnedUtility.fit(synthetic(groups=1), lambdas=(0.01, 0.1))
    assert model.report["cv"] == "kfold-5" and model.report["folds"] == 5
    assert LearnedUtility.fit(synthetic(groups=1), cv="kfold", k=3).report["cv"] == "kfold-3"


def test_fit_refuses_bad_input() -> None:
    ts = synthetic()
    only_neg = TrainingSet(ts.X, np.zeros(len(ts), np.int8), ts.groups, FEATURE_NAMES, ts.search_ids, ts.memory_ids)
    with pytest.raises(UserInputError, match="both labels"):
        LearnedUtility.fit(only_neg)
    with pytest.raises(UserInputError, match="lambdas"):
        LearnedUtility.fit(ts, lambdas=(0.0,))
    with pytest.raises(UserInputError, match="cv"):
        LearnedUtility.fit(synthetic(groups=1), cv="bootstrap")


# -- metrics -----------------------------------------------------------------------------------------
def test_metrics_known_values() -> None:
    assert metrics([0, 1], [0.2, 0.8])["auc"] == 1.0
    assert metrics([1, 0], [0.2, 0.8])["auc"] == 0.0
    assert metrics([0, 1], [0.5, 0.5])["auc"] == 0.5  # ties count half
    assert metrics([1, 1], [0.2, 0.8])["auc"] is None
    m = metrics([0, 1], [0.05, 0.95])
    assert m["brier"] == pytest.approx(0.0025)
    assert m["ece"] == pytest.approx(0.05)
    assert metrics([1], [1.0])["ece"] == 0.0  # p = 1 lands in the last bin


def test_auc_matches_pairwise_count_with_ties() -> None:
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, 80)
    p = np.round(rng.random(80), 1)  # many ties
    pos, neg = p[y == 1], p[y == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert metrics(y, p)["auc"] == pytest.approx(pairs / (len(pos) * len(neg)))


# -- scoring and persistence -------------------------------------------------------------------------
def test_score_components_explain_the_logit() -> None:
    ts = synthetic()
    model = LearnedUtility.fit(ts, explore="none")
    feats = as_features(ts.X[:20])
    p, comps = model.score(feats)
    assert set(FEATURE_NAMES) <= set(comps) and {"intercept", "explore"} <= set(comps)
    z = sum((v for k, v in comps.items() if k != "explore"), np.zeros(20))
    np.testing.assert_allclose(p, 1.0 / (1.0 + np.exp(-z)), rtol=1e-12)
    np.testing.assert_allclose(p, model.predict(ts.X[:20]))


def test_exploration_modes(tmp_path: Path) -> None:
    ts = synthetic()
    feats = as_features(ts.X[:50])
    feats["post_std"] = np.full(50, 0.2)
    base = LearnedUtility.fit(ts, explore="none")
    p0, _ = base.score(feats)
    ucb = LearnedUtility.fit(ts)  # default: UCB with c = 0.1
    p1, c1 = ucb.score(feats)
    np.testing.assert_allclose(c1["explore"], 0.02)
    np.testing.assert_allclose(p1, np.clip(p0 + 0.02, 0, 1))
    th = LearnedUtility.fit(ts, explore="thompson", seed=3)
    th.save(tmp_path / "th.json")
    again = LearnedUtility.load(tmp_path / "th.json")
    pa, ca = th.score(feats)
    pb, _ = again.score(feats)
    np.testing.assert_array_equal(pa, pb)  # same seed, same call order: same draws
    assert 0.1 < float(np.std(ca["explore"])) < 0.3
    assert ((pa >= 0) & (pa <= 1)).all()
    assert not np.array_equal(th.score(feats)[0], pa)  # the generator advances


def test_save_load_round_trip(tmp_path: Path) -> None:
    ts = synthetic()
    model = LearnedUtility.fit(ts)
    path = model.save(tmp_path / "models" / "utility.json")
    loaded = LearnedUtility.load(path)
    feats = as_features(ts.X)
    p1, c1 = model.score(feats)
    p2, c2 = loaded.score(feats)
    np.testing.assert_array_equal(p1, p2)
    assert c1.keys() == c2.keys()
    for k in c1:
        np.testing.assert_array_equal(c1[k], c2[k])
    assert loaded.lam == model.lam and loaded.report == model.report
    assert json.loads(path.read_text())["format_version"] == FORMAT_VERSION


def test_load_refuses_other_features_and_newer_versions(tmp_path: Path) -> None:
    data = LearnedUtility.fit(synthetic()).to_dict()
    renamed = dict(data, feature_names=[*FEATURE_NAMES[:-1], "something_else"])
    (tmp_path / "a.json").write_text(json.dumps(renamed))
    with pytest.raises(UserInputError, match="features"):
        LearnedUtility.load(tmp_path / "a.json")
    fewer = dict(data, feature_names=list(FEATURE_NAMES[:-1]))
    (tmp_path / "b.json").write_text(json.dumps(fewer))
    with pytest.raises(UserInputError, match="features"):
        LearnedUtility.load(tmp_path / "b.json")
    newer = dict(data, format_version=FORMAT_VERSION + 1)
    (tmp_path / "c.json").write_text(json.dumps(newer))
    with pytest.raises(UserInputError, match="format version"):
        LearnedUtility.load(tmp_path / "c.json")
    (tmp_path / "d.json").write_text("{not json")
    with pytest.raises(UserInputError):
        LearnedUtility.load(tmp_path / "d.json")
    (tmp_path / "e.json").write_text(json.dumps(dict(data, weights=[1.0])))
    with pytest.raises(UserInputError):
        LearnedUtility.load(tmp_path / "e.json")
    with pytest.raises(UserInputError):
        LearnedUtility.load(tmp_path / "missing.json")


# -- training rows from a real ledger -----------------------------------------------------------------
def test_training_rows_labels_follow_credit_and_success(tmp_path: Path) -> None:
    mem = ReMem(tmp_path / "w")
    a = mem.add("The server region is east-1.")
    b = mem.add("The database owner is Dana.")
    c = mem.add("The cache policy is LRU.")
    r1 = mem.search("server region database owner cache policy", k=3)
    assert set(r1.ids) == {a, b, c}
    mem.feedback(r1.search_id, success=True, used_ids=[a], cited_ids=[a, b])  # a: used+cited, b: cited, c: nothing
    r2 = mem.search("server region database owner cache policy", k=3)
    mem.feedback(r2.search_id, success=False, used_ids=[a], cited_ids=[a])  # failure: all 0
    mem.search("server region", k=3)  # unanswered: no rows
    ts = training_rows(mem)
    mem.close()
    assert len(ts) == 6 and ts.X.shape == (6, D)
    labels = {(str(s), str(m)): int(v) for s, m, v in zip(ts.search_ids, ts.memory_ids, ts.y, strict=True)}
    assert labels[(r1.search_id, a)] == 1
    assert labels[(r1.search_id, b)] == 1  # cited-only credit 0.5 on success: at the threshold
    assert labels[(r1.search_id, c)] == 0
    assert all(labels[(r2.search_id, m)] == 0 for m in (a, b, c))
    assert set(ts.groups.tolist()) == {"w"}
    # the same rows from the folder path, under a caller-given label
    again = training_rows(tmp_path / "w", group="seed7")
    np.testing.assert_array_equal(again.X, ts.X)
    np.testing.assert_array_equal(again.y, ts.y)
    assert set(again.groups.tolist()) == {"seed7"}
    both = concat([ts, again])
    assert len(both) == 12 and both.group_names == ("w", "seed7")


def test_training_rows_refuses_other_feature_names(tmp_path: Path) -> None:
    mem = ReMem(tmp_path / "w")
    with mem.store.write() as tx:
        tx.c.execute("UPDATE meta SET value = ? WHERE key = 'feature_names'", (json.dumps(["similarity", "old"]),))
    with pytest.raises(UserInputError, match="feature"):
        training_rows(mem)
    mem.close()
    with pytest.raises(UserInputError, match="not a remem-agent store"):
        training_rows(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()
    with pytest.raises(UserInputError):
        training_rows(42)  # type: ignore[arg-type]


def test_training_set_arrays_are_read_only_copies() -> None:
    X = np.zeros((2, D))
    ts = TrainingSet(
        X, np.array([0, 1]), np.array(["g", "g"]), FEATURE_NAMES, np.array(["s", "s"]), np.array(["a", "b"])
    )
    X[0, 0] = 5.0
    assert ts.X[0, 0] == 0.0
    with pytest.raises(ValueError):
        ts.X[0, 0] = 1.0
    with pytest.raises(UserInputError):
        TrainingSet(
            X, np.array([0, 2]), np.array(["g", "g"]), FEATURE_NAMES, np.array(["s", "s"]), np.array(["a", "b"])
        )


TOPICS = (
    "server region",
    "database owner",
    "deploy approval",
    "cache eviction policy",
    "pricing plan",
    "meeting schedule",
    "incident escalation",
    "password rotation",
    "backup retention",
    "api rate limit",
)


def _populate(mem: ReMem) -> tuple[dict[str, str], dict[str, list[str]]]:
    helpful: dict[str, str] = {}
    lookalikes: dict[str, list[str]] = {}
    for t in TOPICS:
        helpful[t] = mem.add(f"The {t} answer: the {t} is documented in runbook section {len(t)}.", task="ops")
        lookalikes[t] = [
            mem.add(f"Someone once asked about the {t} in a chat thread.", task="ops"),
            mem.add(f"A note mentions the {t} without details.", task="ops"),
        ]
    return helpful, lookalikes


def test_end_to_end_train_on_a_real_ledger_and_serve_with_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    mem = ReMem(tmp_path / "world_a", config=RememConfig(p_floor=0.0))  # always 5 served: 300 rows
    helpful, lookalikes = _populate(mem)  # 30 memories
    for r in range(60):
        topic = TOPICS[r % len(TOPICS)]
        res = mem.search(f"What is the {topic}?", k=5, task="ops")
        if helpful[topic] in res.ids and rng.random() < 0.85:
            # the helpful fact was used and cited; now and then the agent also cites a look-alike (noisy labels)
            cited = [helpful[topic]]
            if rng.random() < 0.15:
                cited += [m for m in lookalikes[topic] if m in res.ids][:1]
            mem.feedback(res.search_id, success=True, used_ids=[helpful[topic]], cited_ids=cited)
        else:
            mem.feedback(res.search_id, success=False, cited_ids=res.ids[:1])
    ts = training_rows(mem)
    mem.close()
    assert len(ts) == 300 and 0 < ts.positives < len(ts)
    assert ts.group_names == ("world_a",)

    learned = LearnedUtility.fit(ts)
    rep = learned.report
    assert rep["cv"] == "kfold-5"
    for part in ("in_sample", "cv_metrics"):
        assert rep[part]["auc"] > 0.7
        assert 0.0 <= rep[part]["brier"] <= 0.25 and 0.0 <= rep[part]["ece"] <= 1.0

    path = learned.save(tmp_path / "utility.json")
    served = ReMem(tmp_path / "world_b", utility=LearnedUtility.load(path))
    h2, _ = _populate(served)
    res = served.search("What is the server region?", k=3, task="ops", explain=True)
    assert res.items and res.items[0].explain is not None
    keys = set(res.items[0].explain)
    assert {f"component.{n}" for n in FEATURE_NAMES} <= keys
    assert {"component.intercept", "component.explore"} <= keys
    assert h2["server region"] in res.ids
    for hit in res.items:
        assert 0.0 <= hit.score <= 1.0
    served.close()
