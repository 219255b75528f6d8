"""Learning from outcomes: each rule pinned by a small hand-built scenario on a real ledger.

Every scenario on a ledger runs on both backends (``[sqlite]`` and ``[postgres]``, via the
``store_location`` fixture of conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from remem_agent import ReMem, RememConfig, State
from remem_agent.learning.retention import RetentionPolicy, compress_text
from remem_agent.learning.staleness import StalenessPolicy

DAY = 86_400.0
StoreLocation = Callable[[str], "str | Path"]


def rounds(
    mem: ReMem, query: str, n: int, *, helpful: str | None, task: str | None = None, k: int = 5, t0: float = 10.0
) -> None:
    """n search+feedback rounds: success iff ``helpful`` was served (then it is used and cited)."""
    for r in range(n):
        res = mem.search(query, k=k, task=task, now=t0 + r)
        ok = helpful is not None and helpful in res.ids
        used = [helpful] if ok and helpful else []
        mem.feedback(res.search_id, success=ok, used_ids=used, cited_ids=used)


def test_lookalike_that_never_helps_drops_below_a_less_similar_helpful_memory(store_location: StoreLocation) -> None:
    # p_floor 0: keep serving the look-alike so its score can be compared (the default floor drops it).
    mem = ReMem(store_location("store"), config=RememConfig(retention=RetentionPolicy(enabled=False), p_floor=0.0))
    q = "How do I ship the release to production?"
    lookalike = mem.add(
        "Release day notes: the production release channel has a new bot avatar.", role="note", timestamp=1
    )
    helpful = mem.add(
        "Before shipping, run the database migration script, then tag the build.", role="note", timestamp=1
    )
    first = mem.search(q, k=2, task="deploy", now=5, explain=True)
    by_id = {h.id: h for h in first.items}
    assert by_id[lookalike].similarity > by_id[helpful].similarity
    assert first.ids[0] == lookalike
    rounds(mem, q, 6, helpful=helpful, task="deploy", k=2)
    after = mem.search(q, k=2, task="deploy", now=50, explain=True)
    assert after.ids[0] == helpful
    h = {x.id: x for x in after.items}
    assert h[helpful].score > h[lookalike].score
    # its own contribution factor fell below the helpful note's (the same kind: only their records differ)
    assert h[lookalike].explain is not None and h[helpful].explain is not None
    assert h[lookalike].explain["component.contribution"] < h[helpful].explain["component.contribution"]


def test_similarity_only_ranking_without_outcome_group_keeps_the_lookalike_on_top(
    store_location: StoreLocation,
) -> None:
    """Control for the test above: with the outcome features off, feedback changes nothing."""
    from remem_agent.ranking.features import FeatureConfig

    cfg = RememConfig(features=FeatureConfig(groups=("static",)), retention=RetentionPolicy(enabled=False))
    mem = ReMem(store_location("store"), config=cfg)
    q = "How do I ship the release to production?"
    lookalike = mem.add("Release day notes: the production release channel has a new bot avatar.", timestamp=1)
    helpful = mem.add("Before shipping, run the database migration script, then tag the build.", timestamp=1)
    rounds(mem, q, 6, helpful=helpful, task="deploy", k=2)
    assert mem.search(q, k=2, task="deploy", now=50).ids[0] == lookalike


# Retention reacts to exposures; with the default p_floor a useless memory soon stops being shown at all.
SHOW_ALL = RememConfig(p_floor=0.0)


def long_note(i: int) -> str:
    return (
        f"Weekly status digest number {i}: the coffee machine on floor three was descaled, the plants were "
        "watered, and the parking garage lights were replaced by facilities."
    )


def test_retention_path_demote_compress_archive_with_reasons(store_location: StoreLocation) -> None:
    mem = ReMem(store_location("store"), config=SHOW_ALL)
    useless = mem.add(long_note(1), role="note", timestamp=1)
    other = mem.add("Deploys need approval from Dana in the release channel.", role="note", timestamp=1)
    q = "status digest coffee machine release approval"
    states = []
    for r in range(25):
        res = mem.search(q, k=5, task="ops", now=10 + r)
        mem.feedback(res.search_id, success=True, used_ids=[other], cited_ids=[other])
        states.append(mem.get(useless).state)
        if useless not in res.ids:
            break
    info = mem.inspect(useless)
    kinds = [e.kind for e in info.history]
    assert kinds == ["add", "demote", "compress", "archive"]
    assert info.state is State.ARCHIVED
    assert states.index(State.LOW_VALUE) == 4  # the 5th exposure with no credit demotes
    assert states.index(State.COMPRESSED) == 9
    assert states.index(State.ARCHIVED) == 19
    demote = info.history[1]
    assert "posterior contribution rate" in demote.reason and demote.evidence["task"] == "ops"
    assert info.memory.original_text == long_note(1)  # nothing is lost
    assert len(info.memory.text) < len(info.memory.original_text)
    assert useless not in mem.search(q, k=5, task="ops", now=100).ids  # archived: not served
    assert mem.search(q, k=5, task="ops", as_of=5).ids  # as_of still works for other memories
    assert mem.verify().ok


def test_compressed_memory_serves_short_text_and_revives_on_credited_use(store_location: StoreLocation) -> None:
    mem = ReMem(store_location("store"), config=SHOW_ALL)
    target = mem.add(long_note(2), role="note", timestamp=1)
    q = "status digest coffee machine"
    rounds(mem, q, 10, helpful=None, task="ops")
    assert mem.get(target).state is State.COMPRESSED
    res = mem.search(q, k=5, task="ops", now=100)
    hit = next(h for h in res.items if h.id == target)
    assert hit.text == mem.get(target).text != long_note(2)
    assert hit.token_cost < mem.inspect(target).memory.token_cost or hit.text.endswith("…")
    mem.feedback(res.search_id, success=True, used_ids=[target], cited_ids=[target])
    info = mem.inspect(target)
    assert info.state is State.ACTIVE and info.history[-1].kind == "revive"
    assert info.memory.text == long_note(2)  # the original text is served again


def test_credited_memory_is_never_archived(store_location: StoreLocation) -> None:
    mem = ReMem(store_location("store"), config=SHOW_ALL)
    target = mem.add(long_note(3), role="note", timestamp=1)
    q = "status digest coffee machine"
    res = mem.search(q, task="ops", now=2)
    mem.feedback(res.search_id, success=True, used_ids=[target], cited_ids=[target])  # credited once
    # then it helps no more for a long time
    rounds(mem, q, 40, helpful=None, task="ops", t0=10)
    info = mem.inspect(target)
    assert info.overall.credit_sum > 0
    assert info.state is State.COMPRESSED  # demoted and compressed, but never archived
    assert "archive" not in [e.kind for e in info.history]


def test_demotion_is_per_task_class(store_location: StoreLocation) -> None:
    mem = ReMem(store_location("store"))
    target = mem.add("Dana approves production deploys.", role="note", timestamp=1)
    q = "Dana approves production deploys"
    # useful for approvals ...
    rounds(mem, q, 3, helpful=target, task="approvals")
    # ... useless for incident triage
    rounds(mem, q, 8, helpful=None, task="triage", t0=100)
    assert mem.get(target).state is State.ACTIVE  # helpful elsewhere: not demoted
    stats = mem.inspect(target).stats
    assert stats["triage"].contribution_rate < 0.2 < stats["approvals"].contribution_rate


def learned_mem(path: str | Path) -> ReMem:
    return ReMem(path, config=RememConfig(staleness=StalenessPolicy(mode="learned")))


def test_blamed_stale_memory_is_invalidated_when_a_newer_same_key_fact_exists(store_location: StoreLocation) -> None:
    mem = learned_mem(store_location("store"))
    old = mem.add("The billing service runs on host alpha.", entity="billing", attribute="host", timestamp=1)
    new = mem.add("The billing service runs on host beta.", entity="billing", attribute="host", timestamp=2)
    # learned mode, no update wording: both stay current (a pending conflict)
    assert mem.get(old).state is State.ACTIVE and mem.get(new).state is State.ACTIVE
    res = mem.search("which host runs billing", now=3, explain=True)
    stale = {h.id: h.explain["feature.stale"] for h in res.items if h.explain}
    assert stale == {old: 1.0, new: 0.0}
    r = mem.feedback(res.search_id, success=False, used_ids=[old])
    info = mem.inspect(old)
    assert info.state is State.INVALIDATED and info.memory.superseded_by == new
    assert "outcome-triggered" in (info.reason or "")
    assert [e.memory_id for e in r.transitions] == [old]
    assert mem.search("which host runs billing", now=4).ids == [new]
    assert mem.verify().ok


def test_failure_without_a_newer_fact_invalidates_nothing(store_location: StoreLocation) -> None:
    mem = learned_mem(store_location("store"))
    only = mem.add("The billing service runs on host alpha.", entity="billing", attribute="host", timestamp=1)
    res = mem.search("which host runs billing", now=3)
    mem.feedback(res.search_id, success=False, used_ids=[only])
    assert mem.get(only).state is State.ACTIVE


def test_learned_schema_needs_two_confirmations_and_supersedes_retroactively(store_location: StoreLocation) -> None:
    mem = learned_mem(store_location("store"))
    a1 = mem.add("Service a runs on host one.", entity="a", attribute="host", timestamp=1)
    a2 = mem.add("Service a runs on host two.", entity="a", attribute="host", timestamp=2)
    b1 = mem.add("Service b runs on host three.", entity="b", attribute="host", timestamp=1)
    b2 = mem.add("Service b runs on host four.", entity="b", attribute="host", timestamp=2)
    c1 = mem.add("Service c runs on host five.", entity="c", attribute="host", timestamp=1)
    c2 = mem.add("Service c runs on host six.", entity="c", attribute="host", timestamp=2)
    for stale_id, q in ((a1, "service a host one"), (b1, "service b host three")):
        res = mem.search(q, k=6, now=3)
        assert stale_id in res.ids
        mem.feedback(res.search_id, success=False, used_ids=[stale_id])
    # two confirmations: 'host' is now single-valued, so the pending c conflict is resolved too
    assert mem.get(c1).state is State.INVALIDATED and mem.get(c1).superseded_by == c2
    assert "retroactive" in (mem.inspect(c1).reason or "")
    assert {mem.get(i).state for i in (a2, b2, c2)} == {State.ACTIVE}
    # from now on a new 'host' fact supersedes on key alone
    c3 = mem.add("Service c runs on host seven.", entity="c", attribute="host", timestamp=5)
    assert mem.get(c2).state is State.INVALIDATED and mem.get(c2).superseded_by == c3
    assert mem.verify().ok


def test_counter_evidence_blocks_the_learned_schema(store_location: StoreLocation) -> None:
    mem = learned_mem(store_location("store"))
    # deps are multi-valued: the older value is still credited after a newer one arrived
    d1 = mem.add("The app depends on redis.", entity="app", attribute="dep", timestamp=1)
    mem.add("The app depends on kafka.", entity="app", attribute="dep", timestamp=2)
    res = mem.search("app depends redis", k=5, now=3)
    mem.feedback(res.search_id, success=True, used_ids=[d1])
    e1 = mem.add("Service e depends on s3.", entity="e", attribute="dep", timestamp=1)
    mem.add("Service e depends on sqs.", entity="e", attribute="dep", timestamp=2)
    f1 = mem.add("Service f depends on nats.", entity="f", attribute="dep", timestamp=1)
    mem.add("Service f depends on grpc.", entity="f", attribute="dep", timestamp=2)
    for stale_id, q in ((e1, "service e depends s3"), (f1, "service f depends nats")):
        res = mem.search(q, k=6, now=4)
        mem.feedback(res.search_id, success=False, used_ids=[stale_id])
    assert mem.get(d1).state is State.ACTIVE  # no retroactive supersession
    with mem.store.read() as tx:
        info = tx.attributes(["dep"])["dep"]
    assert info.confirmations == 2 and info.counter == 1 and not info.single_valued


def test_confidence_decays_only_for_attributes_observed_to_change(store_location: StoreLocation) -> None:
    mem = ReMem(store_location("store"))
    mem.add("The API region is us-east.", entity="api", attribute="region", timestamp=0)
    mem.add("The API moved to eu-west.", entity="api", attribute="region", timestamp=DAY)
    stable = mem.add("The founder of the company is Ada.", entity="company", attribute="founder", timestamp=0)
    later = 400 * DAY
    res = mem.search("API region eu-west founder company Ada", k=5, now=later, explain=True)
    conf = {h.id: h.explain["feature.confidence"] for h in res.items if h.explain}
    assert conf[stable] == pytest.approx(1.0)  # old but never changed: not punished for age
    changed = next(i for i in conf if i != stable)
    assert conf[changed] < 0.5


def test_compress_text_keeps_meaning_bearing_words() -> None:
    short = compress_text(long_note(7))
    assert len(short) < len(long_note(7)) and "digest" in short and short.endswith("…")
    assert compress_text("Tiny fact.") == "Tiny fact."


def test_exploration_modes() -> None:
    import numpy as np

    from remem_agent.ranking.features import FEATURE_NAMES
    from remem_agent.ranking.utility import HeuristicUtility

    feats = {n: np.zeros(4) for n in FEATURE_NAMES}
    feats["post_std"] = np.array([0.0, 0.1, 0.2, 0.3])
    p_none, _ = HeuristicUtility(explore="none").score(feats)
    p_ucb, comps = HeuristicUtility(explore="ucb").score(feats)
    assert np.allclose(p_ucb - p_none, 0.1 * feats["post_std"]) and np.allclose(comps["explore"], p_ucb - p_none)
    t1, _ = HeuristicUtility(explore="thompson", seed=7).score(feats)
    t2, _ = HeuristicUtility(explore="thompson", seed=7).score(feats)
    assert np.array_equal(t1, t2) and not np.allclose(t1, p_ucb)
    assert t1[0] == p_none[0]  # no uncertainty, no noise


def test_utility_is_selectable_by_config(store_location: StoreLocation) -> None:
    from remem_agent import UserInputError

    with pytest.raises(UserInputError, match="utility_path"):
        ReMem(store_location("a"), config=RememConfig(utility="learned"))
    assert ReMem(store_location("b"), config=RememConfig(utility="heuristic")).utility.name == "heuristic"


@pytest.mark.parametrize("retrieval", ["dense", "hybrid"])
def test_default_floor_stops_serving_a_learned_lookalike(store_location: StoreLocation, retrieval: str) -> None:
    """After 8 useless exposures the look-alike ranks below the helpful note; a few more and its score falls
    under the floor (a share of the best score, scaled by evidence), so it is not served at all. In hybrid mode
    it is also the best *lexical* match ("release", "production"), which the same evidence has to outweigh."""
    cfg = RememConfig(retention=RetentionPolicy(enabled=False), retrieval=retrieval)  # type: ignore[arg-type]
    mem = ReMem(store_location("store"), config=cfg)
    q = "How do I ship the release to production?"
    lookalike = mem.add(
        "Release day notes: the production release channel has a new bot avatar.", role="note", timestamp=1
    )
    helpful = mem.add(
        "Before shipping, run the database migration script, then tag the build.", role="note", timestamp=1
    )
    cold = mem.search(q, k=2, task="deploy", now=5)
    assert lookalike in cold.ids
    rounds(mem, q, 8, helpful=helpful, task="deploy", k=2)
    warm = mem.search(q, k=2, task="deploy", now=50)
    assert warm.ids[0] == helpful
    rounds(mem, q, 4, helpful=helpful, task="deploy", k=2, t0=60)
    assert mem.search(q, k=2, task="deploy", now=90).ids == [helpful]  # the look-alike is not worth context


def test_without_the_calibration_a_high_floor_drops_a_used_memory_for_good(tmp_path: Path) -> None:
    """Why the default keeps the calibrated prior under a floor of 0.35 (results/benchmark/tuning/
    uncalibrated_floor.md): without the calibration and with the floor at 0.9 of the best, the helpful note, used on
    its first exposure but far less similar than the look-alike, falls under the floor at once. Never served again,
    it never earns the credit that would lift it, while the look-alike's record and its kind's factor sink both."""
    cfg = RememConfig(retention=RetentionPolicy(enabled=False), contribution_calibration=0.0, p_floor=0.9)
    mem = ReMem(tmp_path / "store", config=cfg)
    q = "How do I ship the release to production?"
    lookalike = mem.add(
        "Release day notes: the production release channel has a new bot avatar.", role="note", timestamp=1
    )
    helpful = mem.add(
        "Before shipping, run the database migration script, then tag the build.", role="note", timestamp=1
    )
    assert mem.search(q, k=2, task="deploy", now=5).ids == [lookalike, helpful]
    rounds(mem, q, 30, helpful=helpful, task="deploy", k=2)
    assert mem.search(q, k=2, task="deploy", now=50).ids == [lookalike]
    mem.close()
    # the default, on the same feedback: the helpful note comes first (test_default_floor_stops_serving_a_...)
    with ReMem(tmp_path / "default", config=RememConfig(retention=RetentionPolicy(enabled=False))) as mem:
        lookalike = mem.add(
            "Release day notes: the production release channel has a new bot avatar.", role="note", timestamp=1
        )
        helpful = mem.add(
            "Before shipping, run the database migration script, then tag the build.", role="note", timestamp=1
        )
        rounds(mem, q, 30, helpful=helpful, task="deploy", k=2)
        assert mem.search(q, k=2, task="deploy", now=50).ids[0] == helpful


def test_with_the_exemption_the_used_memory_stays_and_the_lookalike_goes(tmp_path: Path) -> None:
    """The same feedback as above with ``p_floor_exempt``: the helpful note, used whenever it is served, has a record
    above 1.5 after its first use, so the floor never drops it; once its score overtakes the look-alike's, the
    look-alike falls under the floor."""
    cfg = RememConfig(
        retention=RetentionPolicy(enabled=False), contribution_calibration=0.0, p_floor=0.9, p_floor_exempt=1.5
    )
    with ReMem(tmp_path / "store", config=cfg) as mem:
        q = "How do I ship the release to production?"
        lookalike = mem.add(
            "Release day notes: the production release channel has a new bot avatar.", role="note", timestamp=1
        )
        helpful = mem.add(
            "Before shipping, run the database migration script, then tag the build.", role="note", timestamp=1
        )
        rounds(mem, q, 1, helpful=helpful, task="deploy", k=2)
        assert mem.search(q, k=2, task="deploy", now=20).ids == [lookalike, helpful]  # still served
        rounds(mem, q, 30, helpful=helpful, task="deploy", k=2, t0=30)
        assert mem.search(q, k=2, task="deploy", now=90).ids == [helpful]


def test_one_feedback_that_learns_the_schema_and_retires_another_used_fact(store_location: StoreLocation) -> None:
    """Regression: the learning step retroactively invalidates a fact that the same feedback also blames."""
    mem = learned_mem(store_location("store"))
    a1 = mem.add("Service a runs on host one.", entity="a", attribute="host", timestamp=1)
    mem.add("Service a runs on host two.", entity="a", attribute="host", timestamp=2)
    b1 = mem.add("Service b runs on host three.", entity="b", attribute="host", timestamp=1)
    mem.add("Service b runs on host four.", entity="b", attribute="host", timestamp=2)
    c1 = mem.add("Service c runs on host five.", entity="c", attribute="host", timestamp=1)
    mem.add("Service c runs on host six.", entity="c", attribute="host", timestamp=2)
    res = mem.search("service a host one", k=6, now=3)
    mem.feedback(res.search_id, success=False, used_ids=[a1])  # first confirmation
    res = mem.search("service host three five", k=6, now=4)
    assert b1 in res.ids and c1 in res.ids
    # second confirmation learns the schema, which retires c1 retroactively; c1 is blamed in the same call
    r = mem.feedback(res.search_id, success=False, used_ids=[b1, c1])
    assert {e.memory_id for e in r.transitions} >= {b1, c1}
    assert mem.get(c1).state is State.INVALIDATED and mem.verify().ok


def test_lifecycle_events_of_a_feedback_carry_the_callers_time_not_the_wall_clock(tmp_path: Path) -> None:
    from remem_agent import ReMem as _ReMem

    day = 86_400.0
    t0 = 1_735_689_600.0  # 2025-01-01, far from the wall clock
    with _ReMem(tmp_path / "logical") as mem:
        old = mem.add("Billing runs in us-east-1.", entity="billing", attribute="region", timestamp=t0)
        new = mem.add("Billing moved to eu-west-1.", entity="billing", attribute="region", timestamp=t0 + day)
        res = mem.search("Where does billing run?", now=t0 + 2 * day, as_of=t0 + 0.5 * day)
        assert res.ids == [old]
        receipt = mem.feedback(res.search_id, success=False, used_ids=[old])  # default: the search's now
        info = mem.inspect(old)
        assert info.credits[-1].at == t0 + 2 * day
        later = mem.search("Where does billing run?", now=t0 + 3 * day)
        mem.feedback(later.search_id, success=True, used_ids=[new], now=t0 + 3 * day + 60)
        assert mem.inspect(new).credits[-1].at == t0 + 3 * day + 60
        for ev in [*info.history, *mem.inspect(new).history]:
            assert ev.at < t0 + 10 * day, ev  # nothing stamped with today's wall clock
        assert receipt.search_id == res.search_id
