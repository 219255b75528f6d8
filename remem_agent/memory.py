"""``ReMem``: the memory facade that wires ledger, embedder, index, ranking, selection and credit.

Three calls make the loop: ``add`` facts, ``search`` before answering, ``feedback`` after. The
facade is synchronous and thread-safe; ``aadd``/``asearch``/``afeedback`` run the same work on a
worker thread so an event loop never stalls on embedding or SQLite.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent._time import Timestamp, to_epoch
from remem_agent._time import now as wall_now
from remem_agent.config import RememConfig
from remem_agent.embedders import context
from remem_agent.embedders.base import Embedder, check_vectors
from remem_agent.embedders.cache import QueryCache
from remem_agent.embedders.registry import make_embedder
from remem_agent.errors import UserInputError
from remem_agent.gather import Gather, NewRows
from remem_agent.index.base import IndexBackend
from remem_agent.index.flat import FlatIndex
from remem_agent.ingest import FactExtractor, conversation_items, insert_fact, new_id, state_keys
from remem_agent.learning.credit import Replay
from remem_agent.learning.feedback import apply_feedback, plan_feedback
from remem_agent.learning.rerank_fit import RerankKeeper, RerankState
from remem_agent.maintenance import Maintenance
from remem_agent.ranking.explore import draw_for
from remem_agent.ranking.gate import NULL_TEXTS, GateDecision, decide, null_threshold
from remem_agent.ranking.pipeline import Candidates, Ranking, rank_and_select
from remem_agent.ranking.utility import UtilityModel
from remem_agent.store.base import Store, VectorSearch
from remem_agent.store.factory import open_store
from remem_agent.store.sql import LedgerTx
from remem_agent.store_terms import agree
from remem_agent.transcripts import parse_conversation
from remem_agent.types import (
    DEFAULT_SCOPE,
    OUTCOME_SOURCES,
    FeedbackReceipt,
    MemoryInfo,
    OutcomeSource,
    Role,
    SearchResult,
)
from remem_agent.validate import (
    MemoryInput,
    check_ids,
    check_int,
    check_items,
    check_scope,
    check_task,
    check_text,
    check_weight,
    validate_facts,
)

__all__ = ["ReMem", "RememConfig"]  # RememConfig lives in remem_agent.config; re-exported for old imports

log = logging.getLogger("remem_agent")


class ReMem(Maintenance):
    """A memory store in a folder (SQLite) or a PostgreSQL database (a ``postgresql://`` URL).

    Reopening the folder or URL restores everything; several processes (and, with PostgreSQL,
    several machines) can share one store.

    >>> mem = ReMem("my_memory")
    >>> mem.add("Our server is in east-1.", entity="server", attribute="region")
    >>> hits = mem.search("Where is our server?")
    >>> mem.feedback(hits.search_id, success=True, used_ids=[hits.items[0].id])

    ``embedder``: an :class:`Embedder` or a name of :mod:`remem_agent.embedders.registry` ("minilm", "hash",
    ...). Left out, an existing store reopens with the embedder it was built with (a store records it and
    refuses another: ``remem reembed`` moves a store to a new one), and a new store gets
    ``new_store_embedder``: the dependency-free hash embedder unless told otherwise, so that what a program
    stores never depends on which optional packages happen to be installed. Pass ``embedder="minilm"`` for
    real semantic recall (what the demo and ``remem serve`` use when it is installed).
    """

    def __init__(
        self,
        path: str | Path,
        embedder: Embedder | str | None = None,
        backend: IndexBackend | None = None,
        *,
        utility: UtilityModel | None = None,
        config: RememConfig | None = None,
        synchronous: str = "NORMAL",
        store_options: Mapping[str, Any] | None = None,
        new_store_embedder: str = "hash",
    ) -> None:
        if isinstance(embedder, str):
            embedder = make_embedder(embedder)
        if embedder is not None and not isinstance(embedder, Embedder):
            raise UserInputError("embedder must have name, dim and embed(texts), or be an embedder's name")
        if backend is not None and not isinstance(backend, IndexBackend):
            raise UserInputError("backend must have ingest(ids, vectors), candidates(query, k) and __len__")
        self.config = config or RememConfig()
        # Repeated questions (retries, re-asks, agents asking again) skip the query embedding.
        self.query_cache = QueryCache(self.config.query_cache_size)
        self.utility: UtilityModel = utility or self.config.make_utility()
        # store_options go to the backend, e.g. {"pool_size": 16, "ef_search": 400} for PostgreSQL.
        self.store: Store = open_store(path, synchronous=synchronous, **dict(store_options or {}))
        # A folder for SQLite; the URL without its password for PostgreSQL.
        self.path: Path | str = getattr(self.store, "folder", None) or self.store.location
        try:
            terms = agree(self.store, embedder, self.config, path=self.path, new_store_embedder=new_store_embedder)
        except BaseException:
            self.store.close()
            raise
        self.embedder: Embedder = terms.embedder
        self.dim = terms.dim
        self.turn_context = terms.turn_context
        self._null_vectors: NDArray[np.float64] | None = None  # the abstain gate's null corpus, when first needed
        self.reranker = RerankKeeper(self.store)  # the store's re-ranker (RememConfig.rerank="store")
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
        # Our own flat index knows each row's scope and ranks only the readable ones (no pool widening).
        self._flat: FlatIndex | None = self.index if isinstance(self.index, FlatIndex) else None
        self._gather = Gather(
            store=self.store,
            index=self.index,
            flat=self._flat,
            synced_by_ledger=self._index_synced_by_ledger,
            config=self.config,
            dim=self.dim,
        )
        self._gather.sync()

    # -- housekeeping ---------------------------------------------------------------------------
    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> ReMem:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        scope: str | None = None,
    ) -> str:
        """Store one fact in ``scope`` (default "default"); returns its id (an existing id when restated)."""
        item = MemoryInput(text, entity, attribute, role, task, timestamp, confidence)
        return self.add_many([item], scope=scope)[0]

    def add_many(
        self, items: Iterable[MemoryInput | Mapping[str, Any] | str], *, scope: str | None = None
    ) -> list[str]:
        """Store many facts in one transaction (all or nothing), in the given order, in ``scope``.

        ``items`` is a list (or other iterable, not a string or a mapping) of ``MemoryInput``, dicts with
        its fields, or strings. An item may name its scope only if it is the call's.
        """
        clean = validate_facts(items, scope=None if scope is None else check_scope(scope))
        if not clean:
            return []
        vecs = check_vectors(
            self.embedder.embed([c.text for c in clean]), len(clean), self.dim, source=self.embedder.name
        )

        def insert_all(tx: LedgerTx) -> tuple[list[str], list[str], NewRows]:
            ids: list[str] = []
            warned: list[str] = []  # fresh per attempt: a retried transaction must not warn twice
            before = tx.max_seq()
            tx.inserted = []
            keys = state_keys(clean)
            tx.lock_attributes(attribute for _, _, attribute in keys)  # before any memory row is locked
            tx.prefetch_keys(keys)  # the batch's key reads in a few statements, not one per fact
            turns = [context.turn_key(c.scope, c.role, c.speaker, c.session) for c in clean]
            last = tx.last_turn_vectors({t for t in turns if t is not None}) if self.turn_context else {}
            chained = context.chain_vectors(turns, vecs, self.turn_context, last)
            for c, vec in zip(clean, chained, strict=True):
                ids.append(insert_fact(tx, c, vec, warned, self.config.staleness))
            tx.drop_key_view()
            new_rows = NewRows(before, tx.max_seq(), tx.inserted)
            tx.inserted = None
            return ids, warned, new_rows

        ids, pending_warnings, new_rows = self.store.transact(insert_all)
        for msg in pending_warnings:
            warnings.warn(msg, UserWarning, stacklevel=3)
        self._gather.ingest_new(new_rows)
        self._gather.sync()
        return ids

    def add_conversation(
        self,
        transcript: str | Sequence[Mapping[str, Any]] | Mapping[str, Any],
        extractor: FactExtractor | None = None,
        *,
        task: str | Sequence[str] | None = None,
        timestamp: Timestamp | None = None,
        scope: str | None = None,
        turns: bool | None = None,
    ) -> list[str]:
        """Store a conversation's turns (speaker and session as fields), and with ``extractor`` its facts.

        ``transcript`` is OpenAI messages, LoCoMo's conversation, a LongMemEval entry, a list of turns or a
        string (remem_agent/transcripts.py lists the shapes). Each turn becomes a ``note`` "speaker: text"
        stamped with its own or its session's time (else ``timestamp``). With ``extractor``, each session's
        transcript is given to it and the facts it returns are stored too, stamped with the session's last
        turn when they carry no time: keyed ``state`` facts then supersede what they replace. ``turns``
        (default: True without an extractor, False with one) says whether the turns themselves are stored.
        Every turn given is stored (notes are not de-duplicated): an agent loop passes each round's new
        messages, not its whole history again.

        Everything is validated and extracted before the one write: a bad turn raises ``BadTurnError`` (a
        ``UserInputError``) and nothing is stored. Returns the ids in order: turns first, then facts.
        """
        parsed = parse_conversation(transcript, timestamp=timestamp)
        keep_turns = extractor is None if turns is None else bool(turns)
        items = conversation_items(parsed, extractor, task=task, keep_turns=keep_turns)
        return self.add_many(items, scope=scope)

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
        scope: str | None = None,
    ) -> SearchResult:
        """Rank and select memories for ``query``; the result's ``search_id`` is what feedback refers to.

        Only memories of ``scope`` (default "default") are served, plus those of
        ``RememConfig.shared_scope`` when one is configured.

        ``as_of`` asks about the past: facts valid at that time are returned, including ones retired
        since. ``now`` sets the present (default: the wall clock); memories valid only after it are not
        served.
        """
        query = check_text(query, "query")
        scope = check_scope(scope)
        k = check_int(self.config.k if k is None else k, "k", minimum=1)
        task = check_task(task)
        if token_budget is not None:
            token_budget = check_int(token_budget, "token_budget", minimum=0)
        t_now = to_epoch(now, name="now", default=wall_now())
        t_as_of = to_epoch(as_of, name="as_of")
        assert t_now is not None
        at = t_as_of if t_as_of is not None else t_now

        qvec = self.query_cache.vector(self.embedder, query)
        self._gather.sync()
        # gather (I/O) -> rank and select (pure) -> record (I/O)
        candidates = self.candidates(
            qvec, k=k, task=task, at=at, historical=t_as_of is not None, scope=scope, query=query, time_anchor=t_now
        )
        gate = self._gate(qvec, candidates.similarities)
        abstained = gate is not None and gate.abstained
        ranking = (
            Ranking(hits=(), features=())
            if abstained
            else self._rank(candidates, query, task, at, t_now, t_as_of, k, token_budget, explain, scope)
        )
        search_id = new_id("s")
        record = ranking.search_record()
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
                scope=scope,
                decision=ranking.decision,
            ),
            commutative=True,  # a new row and counter increments: concurrent searches commute
        )
        return SearchResult(search_id, query, task, ranking.hits, t_as_of, t_now, token_budget, scope, abstained)

    def _rank(
        self,
        candidates: Candidates,
        query: str,
        task: str | None,
        at: float,
        t_now: float,
        t_as_of: float | None,
        k: int,
        token_budget: int | None,
        explain: bool,
        scope: str,
    ) -> Ranking:
        """Search's pure middle stage (``rank_and_select``) with this handle's utility, exploration draw and
        re-ranker."""
        config = self.config
        reranking = config.rerank == "store"
        return rank_and_select(
            candidates,
            config=config,
            utility=self.utility,
            task=task,
            at=at,
            k=k,
            token_budget=token_budget,
            explain=explain,
            explore_u=(
                draw_for(config.explore_seed, scope, query, task, t_now, t_as_of, k, token_budget)
                if config.explore_serving > 0
                else None
            ),
            rerank_query=query if reranking else None,
            reranker=self.reranker.model() if reranking else None,
        )

    def _gate(self, qvec: Any, similarities: Any) -> GateDecision | None:
        """The abstain gate's decision for this query and pool (None when the gate is off)."""
        if self.config.abstain == "off":
            return None
        if self._null_vectors is None:  # embedded once per store handle (one embedder per handle)
            self._null_vectors = np.asarray(self.embedder.embed(list(NULL_TEXTS)), dtype=np.float64)
        threshold = null_threshold(
            qvec, self._null_vectors, quantile=self.config.abstain_quantile, margin=self.config.abstain_margin
        )
        return decide(np.asarray(similarities, dtype=np.float64), threshold)

    def readable_scopes(self, scope: str) -> frozenset[str]:
        """What a search in ``scope`` may serve: that scope, and the shared scope when one is configured."""
        return self._gather.readable_scopes(scope)

    def candidates(
        self,
        qvec: NDArray[np.float32],
        *,
        k: int,
        at: float,
        task: str | None = None,
        historical: bool = False,
        scope: str = DEFAULT_SCOPE,
        query: str | None = None,
        time_anchor: float | None = None,
    ) -> Candidates:
        """Search's gather stage (:meth:`remem_agent.gather.Gather.candidates`): the pool eligible at ``at`` and the
        ledger's evidence about it, in one read. Public for harnesses and baselines that must rank exactly the
        pool a search ranks (``evals/``)."""
        return self._gather.candidates(
            qvec, k=k, at=at, task=task, historical=historical, scope=scope, query=query, time_anchor=time_anchor
        )

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
        scope: str | None = None,
        now: Timestamp | None = None,
    ) -> FeedbackReceipt:
        """Report the outcome of the task that used ``search_id``'s memories.

        ``now`` is the feedback's time in the caller's clock; the credit rows and every lifecycle event the
        feedback causes are stamped with it (default: the search's ``now``, so a caller that works in its
        own time, like a replay, gets timelines in that time rather than the wall clock's).

        With ``scope``, the search must have been made in that scope (a caller can only judge its own
        searches; another scope's search id is an ``UnknownSearchError``, as if it did not exist).

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
        search_id = check_text(search_id, "search_id")
        if not isinstance(success, bool | np.bool_):
            raise UserInputError("success must be True or False")
        weight = check_weight(weight)
        scope = None if scope is None else check_scope(scope)
        t_feedback = to_epoch(now, name="now")
        if source not in OUTCOME_SOURCES:
            raise UserInputError(f"source must be one of {OUTCOME_SOURCES}, got {source!r}")
        plan, repeated = plan_feedback(
            self.store,
            self.config,
            search_id,
            success=bool(success),
            used=check_ids(used_ids, "used_ids"),
            cited=check_ids(cited_ids, "cited_ids"),
            answer=answer,
            replay=replay,
            weight=weight,
            source=source,
            scope=scope,
            at=t_feedback,
        )
        if repeated is not None:
            return repeated
        receipt = self.store.transact(lambda tx: apply_feedback(tx, plan, self.config))
        if self.config.rerank == "store":
            self.reranker.answered(at=wall_now())
        return receipt

    def fit_reranker(self) -> RerankState:
        """Fit the store's re-ranker now on its answered searches (``learning/rerank_fit.py``), whether or not a fit
        is due, and store it; with ``RememConfig.rerank="store"`` searches use it from then on. Returns the
        state: the model, or None when the feedback cannot support one yet."""
        return self.reranker.refit(at=wall_now())

    # -- async twins ----------------------------------------------------------------------------
    # The same signatures as the sync calls (so calls are type-checked); the work runs on a worker thread.
    async def aadd(
        self,
        text: str,
        *,
        entity: str | None = None,
        attribute: str | None = None,
        role: Role = "state",
        task: str | Sequence[str] | None = None,
        timestamp: Timestamp | None = None,
        confidence: float = 1.0,
        scope: str | None = None,
    ) -> str:
        return await asyncio.to_thread(
            self.add,
            text,
            entity=entity,
            attribute=attribute,
            role=role,
            task=task,
            timestamp=timestamp,
            confidence=confidence,
            scope=scope,
        )

    async def aadd_many(
        self, items: Iterable[MemoryInput | Mapping[str, Any] | str], *, scope: str | None = None
    ) -> builtins.list[str]:
        items = check_items(items)
        return await asyncio.to_thread(self.add_many, items, scope=scope)

    async def asearch(
        self,
        query: str,
        *,
        k: int | None = None,
        task: str | None = None,
        as_of: Timestamp | None = None,
        now: Timestamp | None = None,
        token_budget: int | None = None,
        explain: bool = False,
        scope: str | None = None,
    ) -> SearchResult:
        return await asyncio.to_thread(
            self.search,
            query,
            k=k,
            task=task,
            as_of=as_of,
            now=now,
            token_budget=token_budget,
            explain=explain,
            scope=scope,
        )

    async def afeedback(
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
        scope: str | None = None,
        now: Timestamp | None = None,
    ) -> FeedbackReceipt:
        return await asyncio.to_thread(
            self.feedback,
            search_id,
            success=success,
            used_ids=used_ids,
            cited_ids=cited_ids,
            answer=answer,
            replay=replay,
            weight=weight,
            source=source,
            scope=scope,
            now=now,
        )

    async def ainspect(self, memory_id: str, *, scope: str | None = None) -> MemoryInfo:
        return await asyncio.to_thread(self.inspect, memory_id, scope=scope)
