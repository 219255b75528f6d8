"""Search's gather stage (I/O): the pool a search ranks and the ledger's evidence about it, in one read; and the
vector index kept in step with the ledger it gathers from.

``ReMem.search`` runs three stages: gather (here: the index's and the ledger's candidates, eligibility, the
statistics, keys and calibration the ranking needs), rank and select (:mod:`remem_agent.ranking.pipeline`,
pure), and record (the search row). :class:`Gather` holds what gathering needs of the store, the vector
index and the configuration; ``ReMem`` makes one per handle.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from numpy.typing import NDArray

from remem_agent.config import RememConfig
from remem_agent.index.base import IndexBackend
from remem_agent.index.flat import FlatIndex, Scan
from remem_agent.ranking.fusion import FusedPool, fuse
from remem_agent.ranking.lifts import QueryContext, lifts
from remem_agent.ranking.pipeline import Candidates, EvidenceNeeds, eligible_rows
from remem_agent.ranking.utility import PriorCalibration
from remem_agent.store.base import Store, VectorSearch
from remem_agent.store.sql import LedgerTx
from remem_agent.types import ALL_TASKS, DEFAULT_SCOPE, Memory


@dataclass(frozen=True)
class NewRows:
    """What one ``add_many`` transaction inserted: the highest seq before and after it, and its new memories
    (id, embedding, scope) in insertion order."""

    before: int
    after: int
    rows: list[tuple[str, NDArray[np.float32], str]]


class Gather:
    """The gather stage of one store handle's searches."""

    def __init__(
        self,
        *,
        store: Store,
        index: IndexBackend | VectorSearch,
        flat: FlatIndex | None,
        synced_by_ledger: bool,
        config: RememConfig,
        dim: int,
    ) -> None:
        self.store, self.index, self.config, self.dim = store, index, config, dim
        self._flat = flat  # our own flat index knows each row's scope and ranks only the readable ones
        self._index_synced_by_ledger = synced_by_ledger
        self.seq = 0  # the ledger's rows up to this seq are in the index
        self._lock = threading.Lock()

    # -- the index in step with the ledger ------------------------------------------------------------
    def sync(self) -> None:
        """Bring the index up to date with the ledger (new rows from this or other processes)."""
        if self._index_synced_by_ledger:
            return
        index = cast(IndexBackend, self.index)  # not a runtime Protocol check: this runs on every search
        with self._lock:
            if self.store.max_seq() <= self.seq:
                return
            if self._flat is not None:
                last, ids, mat, scopes = self.store.scoped_embeddings_after(self.seq, self.dim)
                if ids:
                    self._flat.ingest(ids, mat, groups=scopes)
            else:
                last, ids, mat = self.store.embeddings_after(self.seq, self.dim)
                if ids:
                    index.ingest(ids, mat)
            self.seq = last

    def ingest_new(self, new: NewRows) -> None:
        """Give the flat index the rows one ``add_many`` just committed, without reading them back: when the
        index held every row up to the transaction's start and the transaction's new seqs are exactly its
        own inserts (in order), those are the rows :meth:`sync` would read. Otherwise it reads them."""
        if self._flat is None or self._index_synced_by_ledger or not new.rows:
            return
        with self._lock:
            if self.seq != new.before or new.after - new.before != len(new.rows):
                return
            self._flat.ingest(
                [mid for mid, _, _ in new.rows],
                np.stack([vec for _, vec, _ in new.rows]).astype(np.float32, copy=False),
                groups=[scope for _, _, scope in new.rows],
            )
            self.seq = new.after

    # -- candidates ----------------------------------------------------------------------------------------

    def readable_scopes(self, scope: str) -> frozenset[str]:
        """What a search in ``scope`` may serve: that scope, and the shared scope when one is configured."""
        shared = self.config.shared_scope
        return frozenset({scope, shared} if shared else {scope})

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
        """Search's gather stage: the pool eligible at ``at`` and the ledger's evidence about it, in one read.

        Public for harnesses and baselines that must rank exactly the pool a search ranks (``evals/``).

        With ``RememConfig.retrieval`` "hybrid" (default) the dense index's candidates and the ledger's
        lexical candidates for ``query`` are fused into one pool (remem_agent/ranking/fusion.py); "dense" or
        "lexical" use one channel. Without ``query`` (callers that only have a vector) the pool is dense.
        Both channels pass the same eligibility test (:func:`is_eligible`: scopes, state, validity, ``as_of``).

        ``time_anchor`` (the search's ``now``) resolves the times ``query`` names ("in May 2023", "last week":
        remem_agent/temporal.py, questions looking back); pooled memories valid from within such a range, or whose
        text speaks of one (their stored time mentions), gain ``RememConfig.time_weight`` in fusion.

        The dense pool is over-fetched (``k * pool_factor``, at least ``min_pool``) and widened when filtering
        leaves too few; each widening is a new index lookup and read (rare: most searches read once). The
        lexical channel fetches ``lexical_pool`` (default: the same size) once, in the same read.
        """
        size = len(self.index)
        want = max(self.config.min_pool, k * self.config.pool_factor)
        pool = min(size, want)
        scopes = self.readable_scopes(scope)
        mode = self.config.retrieval if query is not None else "dense"
        lex_limit = self.config.lexical_pool or want
        # An as_of search leaves times out: its question's time is the as_of, and validity at that time (the
        # eligibility test) decides, not when a memory was said (measured on the synthetic state_change family).
        # A weight of 0 (the flat-store baselines) skips reading the query for it at all.
        cfg = self.config
        anchor = None if historical or cfg.time_weight == 0 else time_anchor
        lifted = query is not None and mode != "dense" and (anchor is not None or cfg.speaker_weight > 0)
        context = QueryContext.of(query, anchor, words=cfg.speaker_weight > 0) if lifted and query is not None else None
        while True:
            ids, sims, scan = self._dense(qvec, pool, scopes) if mode != "lexical" else ([], [], None)
            with self.store.read() as tx:
                lexical: list[tuple[str, float]] = []
                if mode != "dense" and query is not None:
                    # The words of a time the query names stay words to match as well: taking them out of the
                    # lexical query was measured on LoCoMo's dev conversations and lost recall (a turn that says
                    # "last year" is often the one a question about "last year" wants).
                    lexical = tx.lexical_candidates(query, limit=lex_limit, scopes=scopes, current_only=not historical)
                wanted = list(dict.fromkeys([*ids, *(mid for mid, _ in lexical)]))
                rows = tx.memories(wanted)
                eligible = eligible_rows(rows, wanted, at, historical=historical, scopes=scopes)
                # tolist(): one conversion of the whole array (float32 -> float is exact), not one per element
                sims_list = sims.tolist() if isinstance(sims, np.ndarray) else [float(s) for s in sims]
                dense = [(mid, s) for mid, s in zip(ids, sims_list, strict=True) if mid in eligible]
                # Widen while filtering left too few, unless the index already gave every row it has for these
                # scopes (fewer than asked: the flat index and the ledger's rank only the readable scopes).
                exhausted = len(ids) < pool and (self._flat is not None or self._index_synced_by_ledger)
                if mode != "lexical" and len(dense) < min(want, k * 2) and pool < size and not exhausted:
                    pool = min(size, pool * 4)
                    continue
                dense = dense[:want]
                lex = [(mid, float(s)) for mid, s in lexical if mid in eligible]
                lift = self._lifts(tx, context, eligible, dense, lex) if context is not None else None
                fused = fuse(dense, lex, self._cosines(qvec, dense, lex, scan, tx), config=self.config, lift=lift)
                if not fused.ids:
                    return Candidates(memories=(), similarities=np.zeros(0, dtype=np.float64))
                cands = list(map(eligible.__getitem__, fused.ids))
                return self._evidence(tx, cands, fused, task=task, scope=scope, lexical=mode != "dense")

    def _dense(
        self, qvec: NDArray[np.float32], pool: int, scopes: frozenset[str]
    ) -> tuple[Sequence[str], Sequence[float] | NDArray[np.float32], Scan | None]:
        """The dense channel's ``pool`` nearest ids and their cosines (and the flat index's scan, when flat)."""
        if self._flat is not None:
            scan = self._flat.scan(qvec, pool, groups=scopes)
            return scan.ids, scan.sims, scan
        if self._index_synced_by_ledger:  # the ledger's own index (pgvector) filters by scope itself
            ids, sims = cast(VectorSearch, self.index).candidates(qvec, pool, scopes=scopes)
            return ids, sims, None
        # a caller's backend knows no scopes: filtered by the caller, widening if needed
        ids, sims = cast(IndexBackend, self.index).candidates(qvec, pool)
        return ids, sims, None

    def _evidence(
        self, tx: LedgerTx, cands: list[Memory], fused: FusedPool, *, task: str | None, scope: str, lexical: bool
    ) -> Candidates:
        """The fused pool with what the ledger knows about it, as far as the ranking reads it (``EvidenceNeeds``)."""
        needs = EvidenceNeeds.of(self.config)
        tasks = (ALL_TASKS, task) if task else (ALL_TASKS,)
        # ``Memory.key`` written out: a pool's every row is tested, and two property calls each were most of it
        keyed = [
            (m.scope, m.entity, m.attribute)
            for m in cands
            if m.role == "state" and m.entity is not None and m.attribute is not None
        ]
        return Candidates(
            memories=cands,
            similarities=fused.similarity,
            lexical=fused.lexical if lexical else None,
            retrieval=fused.retrieval if lexical else None,
            stats=tx.stats(fused.ids, tasks) if needs.stats else {},  # the ids of cands
            calibration=self._calibration(tx, scope) if needs.calibration else None,
            groups=tx.group_contribution(scope) if needs.groups else None,
            keys=tx.key_summary(keyed) if keyed and needs.keys else {},
            changing_attributes=frozenset(
                a for a, info in tx.attributes([key[2] for key in keyed]).items() if info.changes > 0
            )
            if keyed and needs.attributes
            else frozenset(),
        )

    def _calibration(self, tx: LedgerTx, scope: str) -> PriorCalibration:
        """The relevance prior's calibration in ``scope`` (the contribution utility)."""
        return PriorCalibration.from_rows(tx.prior_calibration(scope), strength=self.config.contribution_calibration)

    def _lifts(
        self,
        tx: LedgerTx,
        context: QueryContext,
        eligible: Mapping[str, Memory],
        dense: Sequence[tuple[str, float]],
        lexical: Sequence[tuple[str, float]],
    ) -> dict[str, float]:
        """The pool's lifts for what the query says about times and speakers (reads the stored time mentions
        only when the query names a time)."""
        pooled = [eligible[mid] for mid in dict.fromkeys(mid for mid, _ in (*dense, *lexical))]
        cfg = self.config
        mentions = tx.times_of([m.id for m in pooled]) if context.times and cfg.time_weight > 0 else {}
        return lifts(context, pooled, mentions, time_weight=cfg.time_weight, speaker_weight=cfg.speaker_weight)

    def _cosines(
        self,
        qvec: NDArray[np.float32],
        dense: Sequence[tuple[str, float]],
        lexical: Sequence[tuple[str, float]],
        scan: Scan | None = None,
        tx: LedgerTx | None = None,
    ) -> dict[str, float]:
        """Every pooled id's cosine: the dense channel's own, the flat index's for lexical-only candidates
        (from its scan when there was one: every row was scored there), else computed from the embeddings
        the ledger keeps for every memory, read in the search's transaction ``tx``.

        Why not a stand-in value: pgvector and a caller's backend cannot score a given id, and giving a
        lexical-only candidate the dense pool's lowest cosine ranked the same pool differently on
        PostgreSQL than on SQLite. Only a row the ledger does not hold gets that lowest cosine.
        """
        out = dict(dense)
        missing = [mid for mid, _ in lexical if mid not in out]
        if missing and scan is not None:
            out.update(scan.similarities(missing))
            missing = [mid for mid in missing if mid not in out]  # rows ingested after the scan (none in a search)
        if missing:
            if self._flat is not None:
                out.update(self._flat.similarities(qvec, missing))
            elif tx is not None:  # pgvector or a caller's backend: from the ledger's copy of the vectors
                out.update(_cosine_to(qvec, tx.embeddings_of(missing)))
            floor = min(out.values(), default=0.0)
            out.update((mid, floor) for mid in missing if mid not in out)
        return out


def _cosine_to(qvec: NDArray[np.float32], vectors: Mapping[str, NDArray[np.float32]]) -> dict[str, float]:
    """Cosine of ``qvec`` with each vector, in float32. Stored embeddings and queries are unit vectors
    (``check_vectors``), so this is the inner product the flat index and pgvector's ``<=>`` give; dividing by
    the norms keeps it a cosine for a vector that is not."""
    if not vectors:
        return {}
    ids = list(vectors)
    mat = np.stack([np.asarray(vectors[i], dtype=np.float32).reshape(-1) for i in ids])
    q = np.asarray(qvec, dtype=np.float32).reshape(-1)
    norms = np.linalg.norm(mat, axis=1) * float(np.linalg.norm(q))
    sims = np.divide(mat @ q, norms, out=np.zeros(len(ids), dtype=np.float32), where=norms > 0)
    return {mid: float(v) for mid, v in zip(ids, sims, strict=True)}
