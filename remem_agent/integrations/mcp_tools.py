"""The tools of ``remem-mcp`` (:mod:`remem_agent.integrations.mcp_server`) as plain methods on a ``ReMem``.

Each tool takes JSON-able arguments and returns a JSON-able dict; bad arguments raise ``RememError``s, which
the server turns into MCP tool errors.

Inferred feedback (when the client never calls ``feedback``), by the rules every surface applies
(:mod:`remem_agent.outcomes.rules`):

* ``remember`` of a ``state`` fact that supersedes a memory served by a recall with no outcome yet:
  that recall failed, blamed on the corrected memory (``source="inferred"``). A recall reports no
  citations, so everything it served counts as relied on.
* a later ``recall`` for the same task with no correction in between: the earlier recall was a weak
  success (``WEAK_SUCCESS_WEIGHT``, ``source="inferred"``, the top-ranked memory counted as cited).
* an explicit ``feedback`` on a recall disables inference for it. ``REMEM_AUTO_FEEDBACK=0`` turns
  inference off.

Recalls waiting for their outcome are ledger rows (``pending_outcomes``, :mod:`remem_agent.store.pending`,
threads ``mcp:["<scope>", "<task>"]``), claimed atomically by whichever verdict comes first. A client
starts a new server process for each session, so a correction made in the next session, or by another
server process on the same store, still settles the recall that served the corrected memory. A new
process also continues the task threads: its first recall for a task settles the last recall of that task
as a weak success. Only this server's threads are judged here: answers waiting in the gateway's or a
``MemoryAgent``'s threads are theirs to settle.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from remem_agent._time import now as wall_now
from remem_agent._time import to_epoch
from remem_agent.errors import FeedbackConflictError, UnknownSearchError, UserInputError
from remem_agent.memory import ReMem
from remem_agent.outcomes import rules
from remem_agent.outcomes.rules import Verdict
from remem_agent.store import pending
from remem_agent.store.pending import PendingRecord
from remem_agent.types import Hit, Memory, MemoryInfo, iso_time
from remem_agent.validate import check_int, check_scope, check_task, check_text

if TYPE_CHECKING:
    pass

log = logging.getLogger("remem_agent.mcp")

THREAD_PREFIX = "mcp:"  # this server's threads in the ledger's pending_outcomes

RoleArg = Literal["state", "preference", "note"]
StateArg = Literal["ACTIVE", "LOW_VALUE", "COMPRESSED", "ARCHIVED", "INVALIDATED", "ERASED"]


# -- conversions to JSON-able dicts ------------------------------------------------------------------
def _validity(valid_from: float, valid_to: float | None) -> dict[str, Any]:
    return {"from": iso_time(valid_from), "to": iso_time(valid_to), "current": valid_to is None}


def _times(record: Any) -> dict[str, Any]:
    """``record.to_dict("iso")``; epoch seconds for a record whose time cannot be shown as a date.

    Times outside years 1-9999 are refused at the door (``_time.to_epoch``), but a ledger written by an
    older remem-agent may hold some: the tools must still list, recall and inspect those memories.
    """
    try:
        out: dict[str, Any] = record.to_dict("iso")
    except (ValueError, OverflowError, OSError):
        out = record.to_dict("epoch")
    return out


def _memory_dict(m: Memory | Hit) -> dict[str, Any]:
    """The records' one JSON shape (``to_dict``), ISO times, plus a ``validity`` block for the model to read."""
    out = _times(m)
    try:
        out["validity"] = _validity(m.valid_from, m.valid_to)
    except (ValueError, OverflowError, OSError):
        out["validity"] = {"from": m.valid_from, "to": m.valid_to, "current": m.valid_to is None}
    return out


def _info_dict(info: MemoryInfo) -> dict[str, Any]:
    out = _memory_dict(info.memory)
    out.update(
        reason=info.reason,
        supersedes=list(info.supersedes),
        stats={task: _times(s) for task, s in info.stats.items()},
        overall=_times(info.overall),
        credits=[_times(c) for c in info.credits],
        history=[_times(e) for e in info.history],
    )
    return out


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- the server state -----------------------------------------------------------------------------
def thread_of(scope: str, task: str | None) -> str:
    """The ledger thread of this server's recalls for ``task`` in ``scope`` (JSON: no two pairs collide)."""
    return THREAD_PREFIX + json.dumps([scope, task], ensure_ascii=False)


class RememTools:
    """The six tools over one ReMem; the recalls waiting for an outcome are rows of its ledger.

    Calls are serialised by one lock: the SDK runs sync tools on worker threads. Between processes on one
    store, each waiting recall is claimed once (:func:`remem_agent.store.pending.claim`): of an explicit
    feedback and an inference, or of two inferences, exactly one judges it.
    """

    def __init__(self, memory: ReMem, *, auto_feedback: bool = True, scope: str | None = None) -> None:
        self.memory = memory
        self.auto_feedback = auto_feedback
        self.scope = check_scope(scope)  # every tool works in this one scope (REMEM_SCOPE)
        self._lock = threading.Lock()
        self._claimant = f"mcp-{os.getpid()}"  # kept in a claimed row, for the audit

    # -- tools --------------------------------------------------------------------------------
    def remember(
        self,
        text: str,
        entity: str | None = None,
        attribute: str | None = None,
        role: RoleArg = "state",
        task: str | list[str] | None = None,
        timestamp: str | float | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            t0 = wall_now()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                mid = self.memory.add(
                    text,
                    entity=entity,
                    attribute=attribute,
                    role=role,
                    task=task,
                    timestamp=timestamp,
                    scope=self.scope,
                )
            # The fact is committed: from here on this call must not report failure (a failed tool call
            # must have changed nothing), so what follows degrades to a smaller answer instead of raising.
            notes = [str(w.message) for w in caught]
            try:
                info = self.memory.inspect(mid, scope=self.scope)
            except Exception as exc:  # reported in the answer: the write stands
                log.exception("remember stored %s but could not read it back", mid)
                return {"id": mid, "new": None, "warnings": notes, "error_after_write": _describe(exc)}
            is_new = info.memory.created_at >= t0 - 1e-6
            inferred: list[dict[str, Any]] = []
            if self.auto_feedback and is_new and role == "state" and entity and attribute and info.supersedes:
                try:
                    inferred = self._infer_correction(set(info.supersedes), by=mid)
                except Exception as exc:  # the write stands; say why inference was skipped
                    log.exception("remember stored %s; inferring feedback failed", mid)
                    inferred = [{"skipped": _describe(exc)}]
            out = _memory_dict(info.memory)
            out.update(
                new=is_new,
                supersedes=list(info.supersedes) if is_new else [],
                warnings=notes,
                inferred_feedback=inferred,
            )
            return out

    def recall(
        self,
        query: str,
        k: int | None = None,
        task: str | None = None,
        as_of: str | float | None = None,
        token_budget: int | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            inferred: list[dict[str, Any]] = []
            if self.auto_feedback:
                # validate first so a rejected recall does not settle the previous one
                key = self._precheck_recall(query, k, task, as_of, token_budget)
                inferred = self._infer_moved_on(key)
            res = self.memory.search(query, k=k, task=task, as_of=as_of, token_budget=token_budget, scope=self.scope)
            if self.auto_feedback and res.items:
                rec = PendingRecord(
                    answer_id=res.search_id,
                    scope=self.scope,
                    thread=thread_of(self.scope, res.task),
                    turn="",
                    search_id=res.search_id,
                    served_ids=tuple(res.ids),
                    cited_ids=(),
                    used_ids=(),
                    value=None,
                    created_at=wall_now(),
                )
                self.memory.store.transact(lambda tx: pending.put(tx, rec))
            return {
                "search_id": res.search_id,
                "query": res.query,
                "task": res.task,
                "as_of": iso_time(res.as_of),
                "ids": res.ids,
                "items": [_memory_dict(h) for h in res.items],
                "abstained": res.abstained,
                "tokens": res.tokens,
                "token_budget": res.token_budget,
                "inferred_feedback": inferred,
            }

    def feedback(
        self,
        search_id: str,
        success: bool,
        used_ids: list[str] | None = None,
        cited_ids: list[str] | None = None,
    ) -> dict[str, Any]:
        search_id = check_text(search_id, "search_id")  # before the waiting-recall lookup
        with self._lock:
            # An explicit outcome disables inference for this recall: claim it first, so no inference (here
            # or in another process) judges it meanwhile; a refused feedback gives the claim back.
            claimed = self._claim(search_id) if self.auto_feedback else None
            try:
                receipt = self.memory.feedback(
                    search_id, success=success, used_ids=used_ids, cited_ids=cited_ids, scope=self.scope
                )
            except FeedbackConflictError as exc:
                if claimed is not None:
                    self._release(claimed)
                if self._inferred_before(search_id):
                    raise UserInputError(
                        f"search {search_id!r} already has an inferred outcome (a later remember corrected a memory "
                        "it served, or a later recall for the same task counted it as a weak success); the ledger "
                        "is append-only, so call feedback before the next recall or correction. "
                        f"Detail: {exc.detail}"
                    ) from exc
                raise
            except BaseException:
                if claimed is not None:
                    self._release(claimed)
                raise
            return {
                "search_id": receipt.search_id,
                "success": receipt.success,
                "source": receipt.source,
                "repeated": receipt.repeated,
                "credit": {k: round(v, 6) for k, v in receipt.credit.items()},
                "blame": {k: round(v, 6) for k, v in receipt.blame.items()},
                "transitions": [e.to_dict("iso") for e in receipt.transitions],
            }

    def inspect(self, memory_id: str) -> dict[str, Any]:
        with self._lock:
            return _info_dict(self.memory.inspect(memory_id, scope=self.scope))

    def erase(self, memory_ids: Sequence[str], reason: str | None = None) -> dict[str, Any]:
        """Erase memories of this server's scope for good (``ReMem.erase``); another scope's id is unknown."""
        with self._lock:
            report = self.memory.erase(
                list(memory_ids) if isinstance(memory_ids, list | tuple) else memory_ids,
                scope=self.scope,
                reason="erased on request (MCP)" if reason is None else reason,
            )
            return report.to_dict()

    def list_memories(
        self,
        state: StateArg | None = None,
        role: RoleArg | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> dict[str, Any]:
        with self._lock:
            rows = self.memory.list(state, role=role, limit=limit, offset=offset, scope=self.scope)
            return {
                "memories": [_memory_dict(m) for m in rows],
                "count": len(rows),
                "limit": limit,
                "offset": offset,
            }

    def stats(self) -> dict[str, Any]:
        with self._lock:
            s = self.memory.stats(scope=self.scope)
            return {
                "path": str(self.memory.path),
                "memories": s.memories,
                "by_state": dict(s.by_state),
                "by_role": dict(s.by_role),
                "events": s.events,
                "searches": s.searches,
                "feedbacks": s.feedbacks,
                "tokens_active": s.tokens_active,
                "embedder": s.embedder,
                "dim": s.dim,
                "schema_version": s.schema_version,
                "auto_feedback": self.auto_feedback,
                "pending_recalls": len(self.pending_recalls()),
            }

    def pending_recalls(self) -> list[str]:
        """The search ids of this scope's recalls that still wait for an outcome, newest first."""
        with self.memory.store.read() as tx:
            rows = pending.waiting(tx, scope=self.scope, thread_prefix=THREAD_PREFIX)
        return [r.search_id for r in rows]

    # -- inference ----------------------------------------------------------------------------
    def _claim(self, search_id: str) -> PendingRecord | None:
        """This scope's waiting recall ``search_id``, claimed (None: not waiting, or judged already)."""
        return self.memory.store.transact(
            lambda tx: pending.claim(tx, search_id, scope=self.scope, by=self._claimant, at=wall_now())
        )

    def _release(self, rec: PendingRecord) -> None:
        """Give back a claim whose verdict the ledger did not record: the recall waits again."""
        self.memory.store.transact(lambda tx: pending.release(tx, rec.answer_id))

    def _inferred_before(self, search_id: str) -> bool:
        with self.memory.store.read() as tx:
            rec = tx.search(search_id)
        fb = rec.feedback if rec else None
        return isinstance(fb, Mapping) and fb.get("source") == "inferred"

    @staticmethod
    def _precheck_recall(query: object, k: object, task: object, as_of: object, token_budget: object) -> str | None:
        """Validate a recall before inference touches the previous one; returns the normalised task."""
        check_text(query, "query")
        if k is not None:
            check_int(k, "k", minimum=1)
        if token_budget is not None:
            check_int(token_budget, "token_budget", minimum=0)
        if as_of is not None:
            to_epoch(as_of, name="as_of")  # type: ignore[arg-type]
        return check_task(task)

    def _infer_correction(self, corrected: set[str], *, by: str) -> list[dict[str, Any]]:
        """A new fact superseded memories served by waiting recalls: those recalls failed (oldest first)."""
        with self.memory.store.read() as tx:
            rows = pending.waiting(tx, scope=self.scope, thread_prefix=THREAD_PREFIX)
        out: list[dict[str, Any]] = []
        for rec in reversed(rows):
            # an MCP recall reports no citations: the client's model read everything it was served
            blamed = rules.blamed(corrected, rec.served_ids)
            if not blamed:
                continue
            got = self._claim(rec.search_id)
            if got is None:  # judged meanwhile (another process)
                continue
            log.info("inferred failure of recall %s: corrected %s", got.search_id, blamed)
            out.append(self._inferred(got, rules.corrected(blamed, by=by), used_ids=blamed))
        return out

    def _infer_moved_on(self, task: str | None) -> list[dict[str, Any]]:
        """A new recall for the same task with no correction since: the previous recall was a weak success.

        The previous recall is the task thread's newest, and only while it waits (one judged by feedback
        or a correction is not judged again, and an older one is not reached past it)."""
        thread = thread_of(self.scope, task)
        got = self.memory.store.transact(lambda tx: pending.claim_latest(tx, thread, by=self._claimant, at=wall_now()))
        if got is None:
            return []
        log.info("inferred weak success of recall %s (moved on)", got.search_id)
        # The top-ranked memory counts as cited: with no signal at all a success would only add "wasted"
        # exposures, and moving on without a correction would slowly sink what is recalled most.
        return [
            self._inferred(got, rules.moved_on("the next recall moved on"), used_ids=[], cited_ids=got.served_ids[:1])
        ]

    def _inferred(
        self,
        p: PendingRecord,
        verdict: Verdict,
        *,
        used_ids: Sequence[str],
        cited_ids: Sequence[str] = (),
    ) -> dict[str, Any]:
        if verdict.success is None:
            raise ValueError("an inferred verdict must decide success or failure")
        success, weight = verdict.success, verdict.weight
        try:
            receipt = self.memory.feedback(
                p.search_id,
                scope=self.scope,
                success=success,
                used_ids=used_ids,
                cited_ids=list(cited_ids),
                weight=weight,
                source=verdict.source,
            )
        except UnknownSearchError:  # pragma: no cover - the store was replaced under us
            return {"search_id": p.search_id, "skipped": "unknown search"}
        except UserInputError as exc:  # e.g. it already has an outcome (given before waiting rows existed)
            log.warning("inferred feedback for %s skipped: %s", p.search_id, exc)
            return {"search_id": p.search_id, "skipped": str(exc)}
        except BaseException:  # not recorded (the store failed, the call was cancelled): it waits again
            self._release(p)
            raise
        return {
            "search_id": p.search_id,
            "success": success,
            "weight": weight,
            "source": receipt.source,
            "blamed_ids": list(used_ids),
            "credit": {k: round(v, 6) for k, v in receipt.credit.items() if v},
            "blame": {k: round(v, 6) for k, v in receipt.blame.items() if v},
        }
