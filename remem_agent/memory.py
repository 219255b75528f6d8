"""``ReMem``: the memory facade that wires ledger, embedder, index, ranking, selection and credit.

Three calls make the loop: ``add`` facts, ``search`` before answering, ``feedback`` after. The
facade is synchronous and thread-safe; ``aadd``/``asearch``/``afeedback`` run the same work on a
worker thread so an event loop never stalls on embedding or SQLite.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

from remem_agent._time import Timestamp, to_epoch
from remem_agent._time import now as wall_now
from remem_agent.embedders.base import Embedder, check_vectors
from remem_agent.errors import (
    FeedbackConflictError,
    LedgerIntegrityError,
    UnknownSearchError,
    UserInputError,
)
from remem_agent.index.base import IndexBackend
from remem_agent.index.flat import FlatIndex
from remem_agent.ingest import (
    FactExtractor,
    MemoryInput,
    check_ids,
    check_int,
    check_task,
    check_text,
    insert_fact,
    new_id,
    validate_fact,
)
from remem_agent.learning.credit import CreditPolicy, Replay, leave_one_out, values_used
from remem_agent.learning.retention import RetentionPolicy
from remem_agent.learning.staleness import StalenessPolicy
from remem_agent.ranking.features import FEATURE_NAMES, FeatureConfig, build_features
from remem_agent.ranking.features import matrix as feature_matrix
from remem_agent.ranking.select import select
from remem_agent.ranking.utility import HeuristicUtility, SimilarityUtility, UtilityModel
from remem_agent.store.base import Store, VectorSearch
from remem_agent.store.factory import open_store
from remem_agent.store.sql import LedgerTx
from remem_agent.types import (
    ALL_TASKS,
    OUTCOME_SOURCES,
    ROLES,
    SERVABLE_STATES,
    CreditRecord,
    Event,
    FeedbackReceipt,
    Hit,
    Memory,
    MemoryInfo,
    OutcomeSource,
    Role,
    SearchResult,
    State,
    StoreStats,
    VerifyReport,
)

log = logging.getLogger("remem_agent")


@dataclass(frozen=True)
class RememConfig:
    """Tunable defaults of search and feedback."""

    k: int = 5
    pool_factor: int = 4  # over-fetch k * pool_factor candidates ...
    min_pool: int = 40  # ... but never fewer than this
    p_floor: float = 0.35  # chosen on dev seeds 200-201 of the synthetic benchmark (see evals/)
    guard_top: int = 3
    guard_min_shown: int = 3  # guard exemption: shown at least this often ...
    guard_max_rate: float = 0.2  # ... with class contribution rate below this
    # Under a token budget: "knapsack" maximises the summed utility exactly; "greedy" fills the budget in
    # rank order (what a plain similarity search truncated to a budget does).
    selection: Literal["knapsack", "greedy"] = "knapsack"
    features: FeatureConfig = field(default_factory=FeatureConfig)
    credit: CreditPolicy = field(default_factory=CreditPolicy)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    staleness: StalenessPolicy = field(default_factory=StalenessPolicy)
    # Which utility model ranks candidates when none is passed to ReMem: the documented heuristic, or a
    # LearnedUtility loaded from ``utility_path`` (JSON written by LearnedUtility.save).
    utility: Literal["heuristic", "learned", "similarity"] = "heuristic"
    utility_path: str | None = None
    # Exploration of the heuristic utility: "ucb" adds explore_c * posterior std; "thompson" samples.
    explore: Literal["ucb", "thompson", "none"] = "ucb"
    explore_c: float = 0.1
    # Overrides of HeuristicUtility's documented weights (ablations, experiments); None keeps them.
    heuristic_weights: Mapping[str, float] | None = None

    @classmethod
    def similarity_only(cls, **overrides: Any) -> RememConfig:
        """System A: cosine ranking only; no guard, no outcome features, no retention or outcome staleness.

        Ingest-time supersession still applies (it is a property of the ledger, not of ranking).
        """
        base: dict[str, Any] = {
            "utility": "similarity",
            "guard_top": 0,
            "p_floor": 0.0,
            "selection": "greedy",
            "features": FeatureConfig(groups=("static",)),
            "retention": RetentionPolicy(enabled=False),
            "staleness": StalenessPolicy(outcome_invalidation=False),
        }
        return cls(**{**base, **overrides})

    def make_utility(self) -> UtilityModel:
        if self.utility == "heuristic":
            base = HeuristicUtility(explore=self.explore, explore_c=self.explore_c)
            if self.heuristic_weights:
                unknown = set(self.heuristic_weights) - set(base.weights)
                if unknown:
                    raise UserInputError(f"unknown heuristic weights {sorted(unknown)}; known: {sorted(base.weights)}")
                base = replace(base, weights={**base.weights, **self.heuristic_weights})
            return base
        if self.utility == "similarity":
            return SimilarityUtility()
        if self.utility == "learned":
            if not self.utility_path:
                raise UserInputError("utility='learned' needs utility_path (a LearnedUtility JSON file)")
            from remem_agent.ranking.learned import LearnedUtility

            return LearnedUtility.load(self.utility_path)
        raise UserInputError(f"unknown utility {self.utility!r}; use 'heuristic' or 'learned'")


class ReMem:
    """A memory store in a folder (SQLite) or a PostgreSQL database (a ``postgresql://`` URL).

    Reopening the folder or URL restores everything; several processes (and, with PostgreSQL,
    several machines) can share one store.

    >>> mem = ReMem("my_memory")
    >>> mem.add("Our server is in east-1.", entity="server", attribute="region")
    >>> hits = mem.search("Where is our server?")
    >>> mem.feedback(hits.search_id, success=True, used_ids=[hits.items[0].id])
    """

    def __init__(
        self,
        path: str | Path,
        embedder: Embedder | None = None,
        backend: IndexBackend | None = None,
        *,
        utility: UtilityModel | None = None,
        config: RememConfig | None = None,
        synchronous: str = "NORMAL",
        store_options: Mapping[str, Any] | None = None,
    ) -> None:
        if embedder is None:
            from remem_agent.embedders.hashing import ConceptHashEmbedder

            embedder = ConceptHashEmbedder()
        if not isinstance(embedder, Embedder):
            raise UserInputError("embedder must have name, dim and embed(texts)")
        if backend is not None and not isinstance(backend, IndexBackend):
            raise UserInputError("backend must have ingest(ids, vectors), candidates(query, k) and __len__")
        self.embedder = embedder
        self.config = config or RememConfig()
        self.utility: UtilityModel = utility or self.config.make_utility()
        # store_options go to the backend, e.g. {"pool_size": 16, "ef_search": 400} for PostgreSQL.
        self.store: Store = open_store(path, synchronous=synchronous, **dict(store_options or {}))
        # A folder for SQLite; the URL without its password for PostgreSQL.
        self.path: Path | str = getattr(self.store, "folder", None) or self.store.location
        stored_name = self.store.set_meta_default("embedder", embedder.name)
        stored_dim = int(self.store.set_meta_default("dim", str(embedder.dim)))
        if stored_name != embedder.name or stored_dim != embedder.dim:
            self.store.close()
            raise UserInputError(
                f"store {self.path} was built with embedder {stored_name!r} (dim {stored_dim}); "
                f"got {embedder.name!r} (dim {embedder.dim}). Open it with the same embedder."
            )
        self.dim = stored_dim
        self.store.set_meta_default("feature_names", json.dumps(FEATURE_NAMES))
        mode = self.store.set_meta_default("supersession", self.config.staleness.mode)
        if mode != self.config.staleness.mode:
            self.store.close()
            raise UserInputError(
                f"store {self.path} uses supersession mode {mode!r}; got {self.config.staleness.mode!r}"
            )
        self.store.bind_dimension(self.dim)
        # Candidate generation: the caller's backend, else the ledger's own vector index (pgvector),
        # else an exact in-process flat index built from the ledger and kept in sync by sequence number.
        native = self.store.vector_search() if backend is None else None
        self._index_synced_by_ledger = native is not None
        self.index: IndexBackend | VectorSearch = (
            native if native is not None else backend if backend is not None else FlatIndex(self.dim)
        )
        if backend is not None and len(backend) != 0:
            self.store.close()
            raise UserInputError("backend must be empty: ReMem fills it from the ledger")
        self._index_seq = 0
        import threading

        self._index_lock = threading.Lock()
        self._sync_index()

    # -- housekeeping ---------------------------------------------------------------------------
    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> ReMem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _sync_index(self) -> None:
        """Bring the index up to date with the ledger (new rows from this or other processes)."""
        if self._index_synced_by_ledger:
            return
        index = cast(IndexBackend, self.index)  # not a runtime Protocol check: this runs on every search
        with self._index_lock:
            if self.store.max_seq() <= self._index_seq:
                return
            last, ids, mat = self.store.embeddings_after(self._index_seq, self.dim)
            if ids:
                index.ingest(ids, mat)
            self._index_seq = last

    # -- add ------------------------------------------------------------------------------------
    def add(
        self,
        text: str,
        *,
        entity: str | None = None,
        attribute: str | None = None,
        role: Role = "state",
        task: str | Sequence[str] | None = None,
        timestamp: Timestamp | None = None,
        confidence: float = 1.0,
    ) -> str:
        """Store one fact; returns its id (an existing id when the same fact is restated)."""
        item = MemoryInput(text, entity, attribute, role, task, timestamp, confidence)
        return self.add_many([item])[0]

    def add_many(self, items: Iterable[MemoryInput | Mapping[str, Any] | str]) -> list[str]:
        """Store many facts in one transaction (all or nothing), in the given order."""
        clean = [validate_fact(it, i) for i, it in enumerate(items)]
        if not clean:
            return []
        vecs = check_vectors(
            self.embedder.embed([c.text for c in clean]), len(clean), self.dim, source=self.embedder.name
        )

        def insert_all(tx: LedgerTx) -> tuple[list[str], list[str]]:
            ids: list[str] = []
            warned: list[str] = []  # fresh per attempt: a retried transaction must not warn twice
            for c, vec in zip(clean, vecs, strict=True):
                ids.append(insert_fact(tx, c, vec, warned, self.config.staleness))
            return ids, warned

        ids, pending_warnings = self.store.transact(insert_all)
        for msg in pending_warnings:
            warnings.warn(msg, UserWarning, stacklevel=3)
        self._sync_index()
        return ids

    def add_conversation(
        self,
        transcript: str | Sequence[Mapping[str, str]],
        extractor: FactExtractor | None = None,
        *,
        task: str | Sequence[str] | None = None,
        timestamp: Timestamp | None = None,
    ) -> list[str]:
        """Store a conversation: facts from ``extractor``, else each sentence as a ``note``."""
        if isinstance(transcript, str):
            text = check_text(transcript, "transcript")
        elif isinstance(transcript, Sequence):
            lines = []
            for turn in transcript:
                if not isinstance(turn, Mapping) or not isinstance(turn.get("content"), str):
                    raise UserInputError("transcript turns must be mappings with a string 'content'")
                who = turn.get("role") or turn.get("speaker") or "user"
                lines.append(f"{who}: {turn['content']}")
            text = check_text("\n".join(lines), "transcript")
        else:
            raise UserInputError("transcript must be a string or a list of {role, content} turns")
        if extractor is not None:
            facts = list(extractor.extract(text))
        else:
            sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
            facts = [MemoryInput(s, role="note", task=task, timestamp=timestamp) for s in sentences]
        return self.add_many(facts)

    # -- search ---------------------------------------------------------------------------------
    def search(
        self,
        query: str,
        *,
        k: int | None = None,
        task: str | None = None,
        as_of: Timestamp | None = None,
        now: Timestamp | None = None,
        token_budget: int | None = None,
        explain: bool = False,
    ) -> SearchResult:
        """Rank and select memories for ``query``; the result's ``search_id`` is what feedback refers to.

        ``as_of`` asks about the past: facts valid at that time are returned, including ones retired
        since. ``now`` sets the present (default: the wall clock); memories valid only after it are not
        served.
        """
        query = check_text(query, "query")
        k = check_int(self.config.k if k is None else k, "k", minimum=1)
        task = check_task(task)
        if token_budget is not None:
            token_budget = check_int(token_budget, "token_budget", minimum=0)
        t_now = to_epoch(now, name="now", default=wall_now())
        t_as_of = to_epoch(as_of, name="as_of")
        assert t_now is not None
        at = t_as_of if t_as_of is not None else t_now

        qvec = check_vectors(self.embedder.embed([query]), 1, self.dim, source=self.embedder.name)[0]
        self._sync_index()
        cands, sims = self._pool(qvec, k, at, historical=t_as_of is not None)
        served: list[Hit] = []
        served_features: list[list[float]] = []  # feature snapshot at retrieval time, for training
        if cands:
            tasks = (ALL_TASKS, task) if task else (ALL_TASKS,)
            groups = set(self.config.features.groups)
            need_stats = bool(groups & {"history", "outcome"}) or self.config.guard_top > 0
            with self.store.read() as tx:
                stats = tx.stats([m.id for m in cands], tasks) if need_stats else {}
                keyed = [m.key for m in cands if m.key is not None and m.role == "state"]
                # Pending same-key conflicts exist only in learned-schema mode (key mode supersedes on arrival).
                learned = self.config.staleness.mode == "learned"
                keys = tx.key_summary(keyed) if keyed and learned and "contradiction" in groups else {}
                changing = (
                    {a for a, info in tx.attributes([k[1] for k in keyed]).items() if info.changes > 0}
                    if keyed and "static" in groups
                    else set()
                )
            feats = build_features(
                cands,
                sims,
                stats,
                task=task,
                now=at,
                config=self.config.features,
                keys=keys,
                changing_attributes=changing,
                decay_half_life_days=self.config.staleness.decay_half_life_days,
            )
            p, comps = self.utility.score(feats)
            exempt = np.array(
                [
                    (s := stats.get((m.id, task or ALL_TASKS))) is not None
                    and s.shown >= self.config.guard_min_shown
                    and s.contribution_rate < self.config.guard_max_rate
                    for m in cands
                ],
                dtype=bool,
            )
            tokens = np.array([m.token_cost for m in cands], dtype=np.int64)
            chosen = select(
                p,
                sims,
                tokens,
                k=k,
                token_budget=token_budget,
                p_floor=self.config.p_floor,
                guard_top=self.config.guard_top,
                guard_exempt=exempt,
                method=self.config.selection,
            )
            fmat = feature_matrix(feats)
            for rank, i in enumerate(chosen):
                m = cands[i]
                served_features.append(fmat[i].round(5).tolist())
                detail = None
                if explain:
                    detail = {f"feature.{n}": float(v[i]) for n, v in feats.items()}
                    detail.update({f"component.{n}": float(v[i]) for n, v in comps.items()})
                served.append(
                    Hit(
                        id=m.id,
                        text=m.text,
                        score=float(p[i]),
                        similarity=float(sims[i]),
                        state=m.state,
                        rank=rank,
                        valid_from=m.valid_from,
                        valid_to=m.valid_to,
                        entity=m.entity,
                        attribute=m.attribute,
                        role=m.role,
                        token_cost=m.token_cost,
                        explain=detail,
                    )
                )
        search_id = new_id("s")
        record = [
            {"id": h.id, "rank": h.rank, "score": round(h.score, 6), "similarity": round(h.similarity, 6), "f": f}
            for h, f in zip(served, served_features, strict=True)
        ]
        at_wall = wall_now()
        self.store.transact(
            lambda tx: tx.insert_search(
                search_id,
                at=at_wall,
                query=query,
                task=task,
                as_of=t_as_of,
                now=t_now,
                token_budget=token_budget,
                served=record,
            ),
            commutative=True,  # a new row and counter increments: concurrent searches commute
        )
        return SearchResult(search_id, query, task, tuple(served), t_as_of, t_now, token_budget)

    def _pool(self, qvec: np.ndarray, k: int, at: float, *, historical: bool) -> tuple[list[Memory], np.ndarray]:
        """Over-fetch candidates and keep the ones eligible at time ``at``; widen if too few survive."""
        size = len(self.index)
        want = max(self.config.min_pool, k * self.config.pool_factor)
        pool = min(size, want)
        while True:
            ids, sims = self.index.candidates(qvec, pool)
            with self.store.read() as tx:
                rows = tx.memories(ids)
            keep_m: list[Memory] = []
            keep_s: list[float] = []
            for mid, s in zip(ids, sims, strict=True):
                m = rows.get(mid)
                if m is None or not m.valid_at(at):
                    continue
                if historical:
                    if m.state is State.ARCHIVED:
                        continue
                elif m.state not in SERVABLE_STATES:
                    continue
                keep_m.append(m)
                keep_s.append(float(s))
            if len(keep_m) >= min(want, k * 2) or pool >= size:
                return keep_m[:want], np.array(keep_s[:want], dtype=np.float64)
            pool = min(size, pool * 4)

    # -- feedback -------------------------------------------------------------------------------
    def feedback(
        self,
        search_id: str,
        *,
        success: bool,
        used_ids: Sequence[str] | None = None,
        cited_ids: Sequence[str] | None = None,
        answer: Any = None,
        replay: Replay | None = None,
        weight: float = 1.0,
        source: OutcomeSource = "api",
    ) -> FeedbackReceipt:
        """Report the outcome of the task that used ``search_id``'s memories.

        ``used_ids``: served memories whose value the answer relied on; ``cited_ids``: served memories
        the agent cited. With ``answer`` (text or JSON), memories holding a value the answer committed to
        count as used too. With ``replay`` (a callback that re-runs the task on a subset of the served ids
        and returns success) and ``RememConfig.credit.loo`` set, leave-one-out credit is computed.
        Ids that were not served are an error (only shown memories get feedback). Repeating identical
        feedback is idempotent (returns the first receipt, counts nothing twice); a different verdict
        for an answered search raises FeedbackConflictError. ``weight`` (0, 1] scales credit and blame for
        weaker evidence, e.g. an inferred outcome. ``source`` records where the verdict came from
        ("api" for a direct call, or the middleware's "truth" / "user" / "inferred") in the ledger.
        """
        if not isinstance(search_id, str):
            raise UserInputError("search_id must be a string")
        if not isinstance(success, bool | np.bool_):
            raise UserInputError("success must be True or False")
        success = bool(success)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0.0 < float(weight) <= 1.0:
            raise UserInputError(f"weight must be a number in (0, 1], got {weight!r}")
        weight = float(weight)
        if source not in OUTCOME_SOURCES:
            raise UserInputError(f"source must be one of {OUTCOME_SOURCES}, got {source!r}")
        used = check_ids(used_ids, "used_ids")
        cited = check_ids(cited_ids, "cited_ids")
        with self.store.read() as tx:
            rec = tx.search(search_id)
            if rec is None:
                raise UnknownSearchError(search_id)
            served = [s["id"] for s in rec["served"]]
            unknown = [i for i in used + cited if i not in served]
            if unknown:
                raise UserInputError(f"ids not served by search {search_id}: {unknown}")
            if answer is not None:
                texts = {m.id: m.original_text for m in tx.memories(served).values()}
                used += sorted(values_used(texts, answer) - set(used))
        payload: dict[str, Any] = {"success": success, "used": sorted(used), "cited": sorted(cited)}
        if weight != 1.0:
            payload["weight"] = weight
        if source != "api":
            payload["source"] = source
        if rec["feedback"] is not None:
            return self._repeat(search_id, rec["feedback"], payload, success)
        essential: set[str] = set()
        calls = 0
        policy = self.config.credit
        if replay is not None and success and policy.loo != "off":
            essential, calls = leave_one_out(served, policy.replay_candidates(served, cited, used), replay)
        at = wall_now()

        def learn(tx: LedgerTx) -> FeedbackReceipt:
            if not tx.record_feedback(search_id, payload, at):  # another writer answered meanwhile
                first = tx.search(search_id)
                assert first is not None
                return self._repeat(search_id, first["feedback"], payload, success, tx)
            assigned = policy.assign(served, success=success, cited=cited, used=used, essential=essential)
            records = [
                CreditRecord(
                    search_id, mid, rec["task"], at, success, mid in cited, mid in used, cr * weight, bl * weight
                )
                for mid, (cr, bl) in assigned.items()
            ]
            tx.insert_credits(records)
            mems = tx.memories(served)
            transitions: list[Event] = self.config.staleness.after_feedback(tx, mems, records, at=at)
            if transitions:
                mems = tx.memories(served)
            transitions += self.config.retention.after_feedback(tx, mems, tx.stats_all_classes(served), records, at=at)
            return FeedbackReceipt(
                search_id,
                success,
                {r.memory_id: r.credit for r in records},
                {r.memory_id: r.blame for r in records},
                tuple(transitions),
                replay_calls=calls,
                source=source,
            )

        return self.store.transact(learn)

    def _repeat(
        self,
        search_id: str,
        first: Mapping[str, Any],
        payload: Mapping[str, Any],
        success: bool,
        tx: LedgerTx | None = None,
    ) -> FeedbackReceipt:
        if dict(first) != dict(payload):
            raise FeedbackConflictError(search_id, f"first {dict(first)}, now {dict(payload)}")
        if tx is not None:
            return self._receipt_from_ledger(tx, search_id, success, repeated=True)
        with self.store.read() as rtx:
            return self._receipt_from_ledger(rtx, search_id, success, repeated=True)

    def _receipt_from_ledger(self, tx: LedgerTx, search_id: str, success: bool, *, repeated: bool) -> FeedbackReceipt:
        rows = tx.credits_for_search(search_id)
        return FeedbackReceipt(
            search_id,
            success,
            {r.memory_id: r.credit for r in rows},
            {r.memory_id: r.blame for r in rows},
            (),
            repeated,
        )

    # -- inspection -----------------------------------------------------------------------------
    def get(self, memory_id: str) -> Memory:
        with self.store.read() as tx:
            return tx.memory(check_text(memory_id, "memory_id"))

    def inspect(self, memory_id: str) -> MemoryInfo:
        """State, credit statistics, credit history and every transition of one memory."""
        memory_id = check_text(memory_id, "memory_id")
        with self.store.read() as tx:
            m = tx.memory(memory_id)
            return MemoryInfo(
                memory=m,
                stats=tx.all_stats(memory_id),
                history=tuple(tx.events(memory_id)),
                credits=tuple(tx.credits_for(memory_id)),
                supersedes=tuple(tx.supersedes(memory_id)),
            )

    def list(
        self, state: State | str | None = None, *, role: Role | None = None, limit: int | None = None, offset: int = 0
    ) -> builtins.list[Memory]:
        """Memories in insertion order, optionally filtered by state and role."""
        st: State | None = None
        if state is not None:
            try:
                st = State(str(state).upper())
            except ValueError as exc:
                raise UserInputError(f"unknown state {state!r}; one of {[s.value for s in State]}") from exc
        if role is not None and role not in ROLES:
            raise UserInputError(f"role must be one of {ROLES}")
        if limit is not None:
            check_int(limit, "limit", minimum=0)
        check_int(offset, "offset", minimum=0)
        with self.store.read() as tx:
            return tx.list_memories(st, role, limit, offset)

    def stats(self) -> StoreStats:
        c = self.store.counts()
        return StoreStats(
            memories=c["memories"],
            by_state={s.value: c["by_state"].get(s.value, 0) for s in State},
            by_role={r: c["by_role"].get(r, 0) for r in ROLES},
            events=c["events"],
            searches=c["searches"],
            feedbacks=c["feedbacks"],
            tokens_active=c["tokens_active"],
            embedder=self.embedder.name,
            dim=self.dim,
            schema_version=self.store.schema_version,
        )

    def verify(self, *, raise_on_error: bool = False) -> VerifyReport:
        """Check the ledger's invariants (see remem_agent/store/verify.py)."""
        problems = self.store.verify(self.dim)
        c = self.store.counts()
        report = VerifyReport(not problems, tuple(problems), {"memories": c["memories"], "events": c["events"]})
        if problems and raise_on_error:
            raise LedgerIntegrityError(problems)
        return report

    # -- async twins ----------------------------------------------------------------------------
    async def aadd(self, text: str, **kwargs: Any) -> str:
        return await asyncio.to_thread(self.add, text, **kwargs)

    async def aadd_many(self, items: Iterable[MemoryInput | Mapping[str, Any] | str]) -> builtins.list[str]:
        items = list(items)
        return await asyncio.to_thread(self.add_many, items)

    async def asearch(self, query: str, **kwargs: Any) -> SearchResult:
        return await asyncio.to_thread(self.search, query, **kwargs)

    async def afeedback(self, search_id: str, **kwargs: Any) -> FeedbackReceipt:
        return await asyncio.to_thread(self.feedback, search_id, **kwargs)

    async def ainspect(self, memory_id: str) -> MemoryInfo:
        return await asyncio.to_thread(self.inspect, memory_id)
