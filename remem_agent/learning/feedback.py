"""The body of a feedback transaction: credit -> staleness -> retention, in one ledger transaction.

``ReMem.feedback`` validates the call; :func:`plan_feedback` reads the search it refers to (gather) and
optionally replays the task leave-one-out (outside any lock: it calls the agent), giving a
:class:`FeedbackPlan` that ``ReMem.feedback`` hands to :func:`apply_feedback` inside ``store.transact``.
On PostgreSQL that body may be rerun after a serialization conflict, so it has no effect outside the
transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from remem_agent._time import now as wall_now
from remem_agent.errors import FeedbackConflictError, UnknownSearchError, UserInputError
from remem_agent.learning.credit import Replay, leave_one_out, values_used
from remem_agent.learning.policy import LearningPolicy
from remem_agent.ranking.features import snapshot_features
from remem_agent.ranking.utility import HeuristicUtility, PriorCalibration, relevance_prior
from remem_agent.store.base import Store
from remem_agent.store.sql import LedgerTx
from remem_agent.types import CreditRecord, Event, FeedbackReceipt, OutcomeSource, calibration_bin


@dataclass(frozen=True, kw_only=True)
class FeedbackPlan:
    """A validated verdict about one search, ready to be written."""

    search_id: str
    task: str | None  # the task class the search was made for
    served: Sequence[str]
    success: bool
    cited: Sequence[str]
    used: Sequence[str]
    essential: frozenset[str]  # leave-one-out: served ids whose removal failed the replay
    weight: float
    source: OutcomeSource
    at: float
    replay_calls: int = 0
    scope: str = "default"  # the search's scope: whose calibration of the relevance prior the verdict updates
    # each served memory's relevance prior at the search, where the snapshot had one
    priors: Mapping[str, float] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        """What the search row keeps as its verdict (and what a repeated call must equal)."""
        out: dict[str, Any] = {"success": self.success, "used": sorted(self.used), "cited": sorted(self.cited)}
        if self.weight != 1.0:
            out["weight"] = self.weight
        if self.source != "api":
            out["source"] = self.source
        return out


def exposure_priors(served: Sequence[Mapping[str, Any]], static: HeuristicUtility) -> dict[str, float]:
    """Each served memory's relevance prior when it was served, from the search's feature snapshots (the
    expected uses of that exposure, ``ContributionUtility``); none for a search recorded without snapshots."""
    rows = [item["f"] for item in served if item.get("f") is not None]
    if not served or len(rows) != len(served):
        return {}
    features = snapshot_features(rows)
    if features is None:
        return {}
    m0 = np.clip(relevance_prior(static, features), 0.0, 1.0)
    return {str(item["id"]): float(v) for item, v in zip(served, m0.tolist(), strict=True) if v == v}


def _expected_uses(tx: LedgerTx, plan: FeedbackPlan, config: LearningPolicy) -> dict[str, float]:
    """Each judged exposure's expected uses: its prior as the scope's calibration rates it now (the prior itself
    with ``contribution_calibration`` 0)."""
    if not plan.priors:
        return {}
    if config.contribution_calibration <= 0:
        return dict(plan.priors)
    cal = PriorCalibration.from_rows(tx.prior_calibration(plan.scope), strength=config.contribution_calibration)
    ids = list(plan.priors)
    rated = cal(np.array([plan.priors[i] for i in ids], dtype=np.float64))
    return {i: min(1.0, max(0.0, float(v))) for i, v in zip(ids, rated.tolist(), strict=True)}


def apply_feedback(tx: LedgerTx, plan: FeedbackPlan, config: LearningPolicy) -> FeedbackReceipt:
    """Record the verdict once, write credit rows, then let staleness and retention move states."""
    payload = plan.payload()
    served = list(plan.served)
    mems = tx.memories(served)
    # Before this transaction writes or locks any row: a writer superseding facts of these attributes finishes
    # first (LedgerTx.lock_attributes), and searches never queue behind a feedback that waits for one.
    tx.lock_attributes(config.staleness.attributes_at_stake(mems, plan.used))
    if not tx.record_feedback(plan.search_id, payload, plan.at):  # another writer answered meanwhile
        first = tx.search(plan.search_id)
        assert first is not None and first.feedback is not None
        return repeat_receipt(tx, plan.search_id, first.feedback, payload, plan.success)
    cited, used = set(plan.cited), set(plan.used)
    expected = _expected_uses(tx, plan, config)
    assigned = config.credit.assign(
        served, success=plan.success, cited=list(plan.cited), used=list(plan.used), essential=plan.essential
    )
    records = [
        CreditRecord(
            plan.search_id,
            mid,
            plan.task,
            plan.at,
            plan.success,
            mid in cited,
            mid in used,
            cr * plan.weight,
            bl * plan.weight,
            plan.priors.get(mid),
            expected.get(mid),
        )
        for mid, (cr, bl) in assigned.items()
    ]
    tx.insert_credits(records)
    tx.add_to_calibration(
        plan.scope, [(calibration_bin(r.prior), min(1.0, r.credit)) for r in records if r.prior is not None]
    )
    tx.add_to_groups(
        plan.scope,
        [
            (mems[r.memory_id].role, min(1.0, r.credit), r.expected)
            for r in records
            if r.expected is not None and r.memory_id in mems
        ],
    )
    transitions: list[Event] = config.staleness.after_feedback(tx, mems, records, at=plan.at)
    if transitions:
        mems = tx.memories(served)
    transitions += config.retention.after_feedback(tx, mems, tx.stats_all_classes(served), records, at=plan.at)
    return FeedbackReceipt(
        plan.search_id,
        plan.success,
        {r.memory_id: r.credit for r in records},
        {r.memory_id: r.blame for r in records},
        tuple(transitions),
        replay_calls=plan.replay_calls,
        source=plan.source,
    )


def repeat_receipt(
    tx: LedgerTx, search_id: str, first: Mapping[str, Any], payload: Mapping[str, Any], success: bool
) -> FeedbackReceipt:
    """Identical repeated feedback returns the first receipt (nothing counted twice); a different verdict raises."""
    if dict(first) != dict(payload):
        raise FeedbackConflictError(search_id, f"first {dict(first)}, now {dict(payload)}")
    rows = tx.credits_for_search(search_id)
    return FeedbackReceipt(
        search_id,
        success,
        {r.memory_id: r.credit for r in rows},
        {r.memory_id: r.blame for r in rows},
        (),
        True,
    )


def plan_feedback(
    store: Store,
    config: LearningPolicy,
    search_id: str,
    *,
    success: bool,
    used: list[str],
    cited: list[str],
    answer: Any,
    replay: Replay | None,
    weight: float,
    source: OutcomeSource,
    scope: str | None,
    at: float | None,
) -> tuple[FeedbackPlan, FeedbackReceipt | None]:
    """Feedback's gather stage: the plan for a validated verdict on ``search_id`` and, when the search was
    judged already, the receipt a repeat gets (:func:`repeat_receipt`; the plan is then not to be applied).

    Raises ``UnknownSearchError`` for an unknown search or another scope's, and ``UserInputError`` for ids the
    search did not serve. With ``answer``, served memories holding a value the answer committed to count as
    used; with ``replay`` (and ``config.credit.loo`` on) the essential memories come from leave-one-out.
    """
    with store.read() as tx:
        rec = tx.search(search_id)
        if rec is None or (scope is not None and rec.scope != scope):
            raise UnknownSearchError(search_id)
        served = rec.served_ids
        unknown = [i for i in used + cited if i not in served]
        if unknown:
            raise UserInputError(f"ids not served by search {search_id}: {unknown}")
        if answer is not None:
            texts = {m.id: m.original_text for m in tx.memories(served).values()}
            used = used + sorted(values_used(texts, answer) - set(used))
    essential: set[str] = set()
    calls = 0
    policy = config.credit
    if replay is not None and success and policy.loo != "off":
        essential, calls = leave_one_out(served, policy.replay_candidates(served, cited, used), replay)
    plan = FeedbackPlan(
        search_id=search_id,
        task=rec.task,
        served=tuple(served),
        success=success,
        cited=tuple(cited),
        used=tuple(used),
        essential=frozenset(essential),
        weight=weight,
        source=source,
        at=at if at is not None else rec.now if rec.now is not None else wall_now(),
        replay_calls=calls,
        scope=rec.scope,
        priors=exposure_priors(rec.served, config.relevance_static),
    )
    if rec.feedback is not None:
        with store.read() as rtx:
            return plan, repeat_receipt(rtx, search_id, rec.feedback, plan.payload(), success)
    return plan, None
