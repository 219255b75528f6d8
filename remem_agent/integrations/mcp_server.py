"""``remem-mcp``: ReMem as an MCP server (stdio), so Claude Code, Claude Desktop or any MCP client can use it.

Tools: ``remember``, ``recall``, ``feedback``, ``inspect``, ``list_memories``, ``stats``. Arguments are
JSON-schema'd from typed parameters; results are structured (JSON objects). Bad arguments come back as
MCP tool errors (``isError``) and the server keeps serving; every store write is one transaction, so a
rejected call leaves the ledger as it was. A tool that reports failure has changed nothing: ``remember``
validates before it writes, and once the fact is committed it always answers (with ``error_after_write``
if reading it back failed). Every error names its cause: ``RememError`` subclasses by type and message,
anything else as an internal error with its type and message.

Inferred feedback (when the client never calls ``feedback``), the same rules as
:class:`remem_agent.agent.middleware.MemoryAgent`:

* ``remember`` of a ``state`` fact that supersedes a memory served by a recall with no outcome yet:
  that recall failed, blamed on the corrected memory (``source="inferred"``).
* a later ``recall`` for the same task with no correction in between: the earlier recall was a weak
  success (``weight=0.3``, ``source="inferred"``, the top-ranked memory counted as cited).
* an explicit ``feedback`` on a recall disables inference for it. ``REMEM_AUTO_FEEDBACK=0`` turns
  inference off.

Recalls waiting for their outcome are ledger rows (``pending_outcomes``, :mod:`remem_agent.store.pending`,
threads ``mcp:["<scope>", "<task>"]``), claimed atomically by whichever verdict comes first. A client
starts a new server process for each session, so a correction made in the next session, or by another
server process on the same store, still settles the recall that served the corrected memory. A new
process also continues the task threads: its first recall for a task settles the last recall of that task
as a weak success. Only this server's threads are judged here: answers waiting in the gateway's or a
``MemoryAgent``'s threads are theirs to settle.

Environment: ``REMEM_PATH`` (store folder, default ``~/.remem/default``, or a ``postgresql://`` URL
for a store shared by several machines), ``REMEM_EMBEDDER`` (``hash``, the default; ``minilm``, the
real all-MiniLM-L6-v2 on onnxruntime when the ``onnx`` extra is installed, else on sentence-transformers;
``onnx``; or ``sentence-transformers``), ``REMEM_ST_MODEL`` (model name or local folder for
sentence-transformers), ``REMEM_EMBED_THREADS`` (the embedder's threads, default 1),
``REMEM_AUTO_FEEDBACK`` (``0`` turns inference off), ``REMEM_SCOPE`` (the scope every tool reads and
writes, e.g. ``user:alice``; default ``default``), ``REMEM_LOG_LEVEL``.
stdout carries the protocol; logs go to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from remem_agent._time import now as wall_now
from remem_agent._time import to_epoch
from remem_agent.embedders.base import Embedder
from remem_agent.errors import FeedbackConflictError, RememError, UnknownSearchError, UserInputError
from remem_agent.ingest import check_int, check_scope, check_task, check_text
from remem_agent.memory import ReMem
from remem_agent.store import pending
from remem_agent.store.base import is_postgres_url
from remem_agent.store.pending import PendingRecord
from remem_agent.types import Hit, Memory, MemoryInfo, iso_time

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

log = logging.getLogger("remem_agent.mcp")

WEAK_SUCCESS_WEIGHT = 0.3  # same as the middleware: "moved on without correcting" counts this much
THREAD_PREFIX = "mcp:"  # this server's threads in the ledger's pending_outcomes
DEFAULT_PATH = "~/.remem/default"

INSTRUCTIONS = """\
ReMem is long-term memory that learns which memories help.
- Before answering anything that may depend on earlier facts, call `recall` (pass the same `task` for one
  kind of work). Cite the ids you relied on.
- When you learn a fact, call `remember`. For a fact with one current value, give `entity` and `attribute`
  (e.g. entity="server", attribute="region"): a new value then replaces the old one, and if the old one was
  served by a recall, that recall counts as a failure of the old memory.
- After the task, call `feedback(search_id, success, used_ids, cited_ids)`. Without it the server infers
  a weak success when you move on to the next recall of the same task.
"""

RoleArg = Literal["state", "preference", "note"]
StateArg = Literal["ACTIVE", "LOW_VALUE", "COMPRESSED", "ARCHIVED", "INVALIDATED"]


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
                    inferred = self._infer_correction(set(info.supersedes))
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

    def _infer_correction(self, corrected: set[str]) -> list[dict[str, Any]]:
        """A new fact superseded memories served by waiting recalls: those recalls failed (oldest first)."""
        with self.memory.store.read() as tx:
            rows = pending.waiting(tx, scope=self.scope, thread_prefix=THREAD_PREFIX)
        out: list[dict[str, Any]] = []
        for rec in reversed(rows):
            blamed = sorted(corrected & set(rec.served_ids))
            if not blamed:
                continue
            got = self._claim(rec.search_id)
            if got is None:  # judged meanwhile (another process)
                continue
            log.info("inferred failure of recall %s: corrected %s", got.search_id, blamed)
            out.append(self._inferred(got, success=False, used_ids=blamed, weight=1.0))
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
            self._inferred(got, success=True, used_ids=[], cited_ids=got.served_ids[:1], weight=WEAK_SUCCESS_WEIGHT)
        ]

    def _inferred(
        self,
        p: PendingRecord,
        *,
        success: bool,
        used_ids: Sequence[str],
        weight: float,
        cited_ids: Sequence[str] = (),
    ) -> dict[str, Any]:
        try:
            receipt = self.memory.feedback(
                p.search_id,
                scope=self.scope,
                success=success,
                used_ids=used_ids,
                cited_ids=list(cited_ids),
                weight=weight,
                source="inferred",
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


# -- MCP wiring -----------------------------------------------------------------------------------
_Text = Annotated[str, Field(description="The fact, in one self-contained sentence.")]
_Entity = Annotated[
    str | None,
    Field(description="What the fact is about (e.g. 'server'). With attribute, a new 'state' fact replaces the old."),
]
_Attribute = Annotated[str | None, Field(description="Which property of the entity (e.g. 'region').")]
_Role = Annotated[
    RoleArg,
    Field(
        description="'state' (one current value per entity+attribute; newer replaces older), "
        "'preference' or 'note' (multi-valued, never replaced)."
    ),
]
_TaskTags = Annotated[
    str | list[str] | None, Field(description="Task class(es) this fact belongs to (e.g. 'support').")
]
_Timestamp = Annotated[
    str | float | None,
    Field(
        description="When it became true: ISO-8601 (e.g. '2025-03-01T00:00:00Z') or epoch seconds (not milliseconds), "
        "within years 1-9999 UTC; default now. Passing the same timestamp again makes a repeated remember harmless."
    ),
]
_Query = Annotated[str, Field(description="What you need to know, as a question or keywords.")]
_K = Annotated[int | None, Field(ge=1, le=100, description="How many memories at most (default 5).")]
_Task = Annotated[
    str | None,
    Field(description="Task class of this recall (e.g. 'support'); outcomes are learned per task class."),
]
_AsOf = Annotated[
    str | float | None,
    Field(description="Ask about the past: ISO-8601 or epoch seconds; returns facts valid at that time."),
]
_Budget = Annotated[int | None, Field(ge=0, description="Maximum total tokens of the returned memories.")]
_SearchId = Annotated[str, Field(description="The search_id returned by recall.")]
_Success = Annotated[bool, Field(strict=True, description="Did the task that used this recall succeed?")]
_Used = Annotated[list[str] | None, Field(description="Ids of served memories whose content the answer relied on.")]
_Cited = Annotated[list[str] | None, Field(description="Ids of served memories you cited.")]
_MemoryId = Annotated[str, Field(description="A memory id (as returned by remember or recall).")]
_State = Annotated[StateArg | None, Field(description="Only memories in this lifecycle state.")]
_RoleFilter = Annotated[RoleArg | None, Field(description="Only memories with this role.")]
_Limit = Annotated[int, Field(ge=0, le=1000, description="Page size.")]
_Offset = Annotated[int, Field(ge=0, description="How many memories to skip (insertion order).")]


def build_server(tools: RememTools) -> MCPServer:
    """An MCPServer exposing ``tools``; ReMem errors become tool errors (``isError`` results)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server: MCPServer = MCPServer(name="remem", instructions=INSTRUCTIONS, log_level=_log_level())

    def _call(fn: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = fn(**kwargs)
        except RememError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # a library bug: still say what went wrong, not an opaque error
            log.exception("tool %s failed", getattr(fn, "__name__", fn))
            raise ToolError(f"internal error of remem-agent ({_describe(exc)}); please report it") from exc
        return result

    @server.tool(
        description="Store a fact in long-term memory. Give entity+attribute for facts with one current value; "
        "a new value then supersedes the old one (and counts as a correction of any recall that served it)."
    )
    def remember(
        text: _Text,
        entity: _Entity = None,
        attribute: _Attribute = None,
        role: _Role = "state",
        task: _TaskTags = None,
        timestamp: _Timestamp = None,
    ) -> dict[str, Any]:
        return _call(
            tools.remember, text=text, entity=entity, attribute=attribute, role=role, task=task, timestamp=timestamp
        )

    @server.tool(
        description="Retrieve the memories most likely to help with a query (ranked by learned usefulness, not "
        "just similarity). Returns a search_id for feedback, and each memory's id, text, score, state and validity."
    )
    def recall(
        query: _Query,
        k: _K = None,
        task: _Task = None,
        as_of: _AsOf = None,
        token_budget: _Budget = None,
    ) -> dict[str, Any]:
        return _call(tools.recall, query=query, k=k, task=task, as_of=as_of, token_budget=token_budget)

    @server.tool(
        description="Report whether the task that used a recall succeeded, and which served memories were used "
        "or cited. This is how memory learns what helps. Identical repeats are harmless."
    )
    def feedback(
        search_id: _SearchId,
        success: _Success,
        used_ids: _Used = None,
        cited_ids: _Cited = None,
    ) -> dict[str, Any]:
        return _call(tools.feedback, search_id=search_id, success=success, used_ids=used_ids, cited_ids=cited_ids)

    @server.tool(description="Everything known about one memory: state, validity, credit statistics, history.")
    def inspect(memory_id: _MemoryId) -> dict[str, Any]:
        return _call(tools.inspect, memory_id=memory_id)

    @server.tool(description="List stored memories in insertion order, optionally by lifecycle state and role.")
    def list_memories(
        state: _State = None,
        role: _RoleFilter = None,
        limit: _Limit = 50,
        offset: _Offset = 0,
    ) -> dict[str, Any]:
        return _call(tools.list_memories, state=state, role=role, limit=limit, offset=offset)

    @server.tool(description="Counts of the memory store: memories by state and role, searches, feedbacks.")
    def stats() -> dict[str, Any]:
        return _call(tools.stats)

    return server


# -- configuration --------------------------------------------------------------------------------
def _log_level() -> Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]:
    level = os.environ.get("REMEM_LOG_LEVEL", "INFO").strip().upper()
    if level == "DEBUG":
        return "DEBUG"
    if level == "WARNING":
        return "WARNING"
    if level == "ERROR":
        return "ERROR"
    if level == "CRITICAL":
        return "CRITICAL"
    return "INFO"


def _flag(value: str | None, default: bool) -> bool:
    if value is None or not value.strip():
        return default
    v = value.strip().lower()
    if v in ("0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    raise UserInputError(f"REMEM_AUTO_FEEDBACK must be 0 or 1, got {value!r}")


def make_embedder(env: Mapping[str, str]) -> Embedder:
    """The embedder named by ``REMEM_EMBEDDER`` (:mod:`remem_agent.embedders.registry`; ``hash`` by default)."""
    from remem_agent.embedders.registry import canonical_name
    from remem_agent.embedders.registry import make_embedder as by_name

    name = env.get("REMEM_EMBEDDER", "hash")
    model = env.get("REMEM_ST_MODEL") or None
    return by_name(name, model=model if canonical_name(name) == "sentence-transformers" else None)


def open_from_env(env: Mapping[str, str] | None = None) -> RememTools:
    """Open the store and tools configured by the environment."""
    env = os.environ if env is None else env
    raw = env.get("REMEM_PATH") or str(DEFAULT_PATH)
    # A postgresql:// URL selects the shared PostgreSQL store; anything else is a folder.
    path: str | Path = raw if is_postgres_url(raw) else Path(raw).expanduser()
    auto = _flag(env.get("REMEM_AUTO_FEEDBACK"), True)
    scope = env.get("REMEM_SCOPE") or None
    # REMEM_EMBEDDER unset: an existing store reopens with its own embedder, a new one gets the hash embedder.
    memory = ReMem(path, embedder=make_embedder(env) if env.get("REMEM_EMBEDDER") else None)
    try:
        return RememTools(memory, auto_feedback=auto, scope=scope)
    except BaseException:
        memory.close()
        raise


def main() -> int:
    """Entry point of ``remem-mcp``: serve the store over stdio until the client disconnects."""
    logging.basicConfig(stream=sys.stderr, level=_log_level(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import mcp  # noqa: F401
    except ImportError:
        print("remem-mcp needs the MCP SDK: pip install 'remem-agent[mcp]'", file=sys.stderr)
        return 2
    try:
        tools = open_from_env()
    except (RememError, ImportError) as exc:
        print(f"remem-mcp: {exc}", file=sys.stderr)
        return 2
    log.info(
        "remem-mcp serving %s (embedder %s, auto feedback %s)",
        tools.memory.path,
        tools.memory.embedder.name,
        "on" if tools.auto_feedback else "off",
    )
    try:
        build_server(tools).run("stdio")
    except KeyboardInterrupt:  # pragma: no cover
        pass
    finally:
        tools.memory.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
