"""Each judged exposure's expected uses (schema 10): recorded at feedback, summed in the stats, used by the
contribution utility, replayed by verify, and absent (not invented) for feedback given before."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import _sqlite_downgrades
import numpy as np
import pytest
from _sqlite_downgrades import SQLITE_10_TO_9

from remem_agent import ReMem, RememConfig
from remem_agent.learning.feedback import exposure_priors
from remem_agent.ranking.features import FEATURE_NAMES, LEGACY_FEATURE_NAMES, snapshot_features
from remem_agent.ranking.utility import ContributionUtility, HeuristicUtility, relevance_prior
from remem_agent.store import migrations, pg_migrations
from remem_agent.types import ALL_TASKS, calibration_bin

NOTES = [
    "The deploy service runs in eu-west-2.",
    "The deploy pipeline was renamed last spring.",
    "Billing invoices are sent on the first Monday.",
    "The billing service retries failed charges three times.",
]


def _judge(mem: ReMem, query: str, task: str, *, used: bool) -> tuple[str, list[str]]:
    res = mem.search(query, k=3, task=task)
    ids = [h.id for h in res.items]
    mem.feedback(res.search_id, success=used, used_ids=ids[:1] if used else [])
    return res.search_id, ids


def test_feedback_records_each_served_memorys_prior_from_the_search_snapshot(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add_many(NOTES)
        sid, ids = _judge(mem, "where does the deploy service run", "deploy", used=True)
        with mem.store.read() as tx:
            rec = tx.search(sid)
            assert rec is not None
            credits = tx.credits_for_search(sid)
            stats = tx.stats(ids, ("deploy", ALL_TASKS))
        # the prior of the snapshot, recomputed by hand: the static score of the default weights
        rows = np.array([item["f"] for item in rec.served])
        f = dict(zip(FEATURE_NAMES, rows.T, strict=True))
        w, bias = HeuristicUtility().weights, HeuristicUtility().bias
        z = bias + sum(w[n] * f[n] for n in ("retrieval", "similarity", "gap", "stale"))
        z = z + f["evidence_all"] * sum(w[n] * f[n] for n in ("recency", "confidence", "tokens"))
        want = 1 / (1 + np.exp(-z))
        prior = {c.memory_id: c.prior for c in credits}
        assert [prior[i] for i in ids] == pytest.approx(want.tolist())
        assert all(0 < v < 1 for v in want)  # type: ignore[operator]
        # the first verdict of the scope: its calibration is empty, so each exposure is rated at its bin's middle
        expected = {c.memory_id: c.expected for c in credits}
        for i in ids:
            assert expected[i] == pytest.approx((calibration_bin(prior[i]) + 0.5) / 10)  # type: ignore[arg-type]
        for i in ids:  # the stats sum them per class and overall, one exposure each
            for t in ("deploy", ALL_TASKS):
                assert stats[(i, t)].expected_sum == pytest.approx(expected[i]) and stats[(i, t)].expected_n == 1
        assert mem.verify().ok


def test_the_calibration_counts_each_judged_exposure_by_the_bin_of_its_prior(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add_many(NOTES)
        sid, _ = _judge(mem, "where does the deploy service run", "deploy", used=True)
        with mem.store.read() as tx:
            first = {c.memory_id: c for c in tx.credits_for_search(sid)}
            cal = tx.prior_calibration("default")
            assert tx.prior_calibration("user:alice") == {}  # per scope
        want: dict[int, list[float]] = {}
        for c in first.values():
            acc = want.setdefault(calibration_bin(c.prior), [0.0, 0])  # type: ignore[arg-type]
            acc[0] += min(1.0, c.credit)
            acc[1] += 1
        assert {b: (pytest.approx(u), n) for b, (u, n) in want.items()} == cal
        assert sum(c.credit > 0 for c in first.values()) == 1  # the one used memory
        # the next verdict rates its exposures with that calibration: (5 * middle + uses) / (5 + exposures)
        sid2, _ = _judge(mem, "where does the deploy service run", "deploy", used=False)
        with mem.store.read() as tx:
            for c in tx.credits_for_search(sid2):
                b = calibration_bin(c.prior)  # type: ignore[arg-type]
                uses, n = cal.get(b, (0.0, 0))
                assert c.expected == pytest.approx((5 * (b + 0.5) / 10 + uses) / (5 + n))
        report = mem.verify()
        assert report.ok, report.problems


def test_a_tampered_calibration_is_reported_by_verify(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add_many(NOTES)
        _judge(mem, "where does the deploy service run", "deploy", used=True)
        assert mem.verify().ok
    conn = sqlite3.connect(tmp_path / "s" / "ledger.db")
    conn.execute("UPDATE prior_calibration SET uses = uses + 0.5 WHERE bin = (SELECT MIN(bin) FROM prior_calibration)")
    conn.commit()
    conn.close()
    with ReMem(tmp_path / "s") as mem:
        report = mem.verify()
        assert not report.ok and any("prior calibration" in p for p in report.problems), report.problems


def test_the_prior_of_a_legacy_width_snapshot_reads_it_as_a_dense_pool() -> None:
    legacy = [float(i) / 20 for i in range(len(LEGACY_FEATURE_NAMES))]
    f = snapshot_features([legacy])
    assert f is not None and f["lexical"][0] == 0 and f["retrieval"][0] == f["similarity"][0]
    assert snapshot_features([[0.5, 0.5]]) is None  # neither width: no prior rather than a misread one
    served = [{"id": "a", "f": legacy}, {"id": "b", "f": [0.5, 0.5]}]
    assert exposure_priors(served, HeuristicUtility()) == {}
    assert exposure_priors([{"id": "a"}], HeuristicUtility()) == {}  # recorded without snapshots
    only = exposure_priors(served[:1], HeuristicUtility())
    assert only == {"a": pytest.approx(float(relevance_prior(HeuristicUtility(), f)[0]))}


def test_recorded_priors_replace_todays_prior_times_the_count() -> None:
    """A gold fact served 6 times as filler, each time with a low prior (0.05), and never used there, keeps its
    contribution factor near 1; counted at today's high prior it would look like a look-alike."""
    u = ContributionUtility(kappa=1.0, explore="none")

    def feats(expected_sum: float, expected_n: float) -> dict[str, np.ndarray]:
        f = {name: np.zeros(1) for name in FEATURE_NAMES}
        f["retrieval"] = f["similarity"] = np.array([0.9])
        shown = 6.0
        f["evidence"] = f["evidence_all"] = np.array([shown / (shown + 2)])
        f["rate_class"] = f["rate_all"] = np.array([1 / (2 + shown)])
        for k in ("class", "all"):
            f[f"expected_{k}"], f[f"expected_n_{k}"] = np.array([expected_sum]), np.array([expected_n])
        return f

    recorded, comps = u.score(feats(6 * 0.05, 6))
    legacy, legacy_comps = u.score(feats(0.0, 0))
    m0 = float(comps["prior"][0])
    assert m0 > 0.5
    assert float(comps["contribution"][0]) == pytest.approx(1 / (1 + 0.3))
    assert float(legacy_comps["contribution"][0]) == pytest.approx(1 / (1 + 6 * m0))
    assert recorded[0] > 2 * legacy[0]
    # half recorded: three exposures at 0.05, three counted at today's prior
    _, half = u.score(feats(3 * 0.05, 3))
    assert float(half["expected_uses"][0]) == pytest.approx(0.15 + 3 * m0)


def test_contribution_ranking_uses_the_recorded_priors(tmp_path: Path) -> None:
    with ReMem(tmp_path / "s", config=RememConfig(utility="contribution", explore="none")) as mem:
        mem.add_many(NOTES)
        for _ in range(3):
            _judge(mem, "where does the deploy service run", "deploy", used=False)
        res = mem.search("where does the deploy service run", k=4, task="deploy", explain=True)
        for h in res.items:
            assert h.explain is not None
            with mem.store.read() as tx:
                s = tx.stats([h.id], ("deploy",)).get((h.id, "deploy"))
            if s is None:
                continue
            assert h.explain["feature.expected_class"] == pytest.approx(s.expected_sum)
            assert h.explain["feature.expected_n_class"] == s.expected_n == s.shown
            assert h.explain["component.expected_uses"] == pytest.approx(s.expected_sum, rel=1e-9)


def test_a_version_9_sqlite_store_upgrades_with_no_priors_for_its_old_feedback(tmp_path: Path) -> None:
    assert migrations.LATEST == pg_migrations.LATEST == 16
    loc = tmp_path / "s"
    with ReMem(loc) as mem:
        mem.add_many(NOTES)
        old_sid, old_ids = _judge(mem, "when are invoices sent", "billing", used=True)
        before = mem.stats()
    conn = sqlite3.connect(loc / "ledger.db")
    _sqlite_downgrades.downgrade(conn, SQLITE_10_TO_9)
    conn.close()
    with ReMem(loc) as mem:
        assert mem.stats() == before and mem.stats().schema_version == 16
        assert mem.verify().ok, mem.verify().problems
        with mem.store.read() as tx:
            assert all(c.expected is None for c in tx.credits_for_search(old_sid))
            old_stats = tx.stats(old_ids, (ALL_TASKS,))
        assert all(s.expected_n == 0 and s.expected_sum == 0 for s in old_stats.values())
        new_sid, new_ids = _judge(mem, "when are invoices sent", "billing", used=False)
        with mem.store.read() as tx:
            assert all(c.expected is not None for c in tx.credits_for_search(new_sid))
            for i in set(old_ids) & set(new_ids):
                s = tx.stats([i], (ALL_TASKS,))[(i, ALL_TASKS)]
                assert s.shown == 2 and s.expected_n == 1
        report = mem.verify()
        assert report.ok, report.problems


def test_postgres_records_the_same_priors_and_upgrades_from_version_9(tmp_path: Path, pg_url: str) -> None:
    import _pg_downgrades
    import psycopg
    from _pg_downgrades import DOWNGRADE_10_TO_9

    first: list[set[str]] = []
    for loc in (tmp_path / "lite", pg_url):
        with ReMem(loc) as mem:
            mem.add_many(NOTES)
            _, served = _judge(mem, "where does the deploy service run", "deploy", used=True)
            text = {m.id: m.text for m in mem.list()}
            first.append({text[i] for i in served})
    assert first[0] == first[1]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        _pg_downgrades.downgrade(conn, DOWNGRADE_10_TO_9)
    with ReMem(pg_url) as pg, ReMem(tmp_path / "lite") as lite:
        assert pg.stats().schema_version == 16 and pg.verify().ok, pg.verify().problems
        for mem in (pg, lite):
            _judge(mem, "where does the deploy service run", "deploy", used=False)
        got = []
        for mem in (pg, lite):
            text = {m.id: m.text for m in mem.list()}
            with mem.store.read() as tx:
                stats = tx.stats(list(text), ("deploy", ALL_TASKS))
            got.append({(text[i], t): (s.shown, s.expected_n, round(s.expected_sum, 9)) for (i, t), s in stats.items()})
        pg_rows, lite_rows = got
        # the same searches on both: PostgreSQL lost the priors of the first search in the downgrade, SQLite kept
        # them (one fewer recorded prior for each memory the first search served)
        assert pg_rows.keys() == lite_rows.keys()
        for (memory_text, task), (shown, n, _) in pg_rows.items():
            lost = 1 if memory_text in first[0] else 0
            assert shown == lite_rows[(memory_text, task)][0] and n == lite_rows[(memory_text, task)][1] - lost
        assert lite.verify().ok and pg.verify().ok
