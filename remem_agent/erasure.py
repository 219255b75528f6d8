"""Erasing memories on request: what ``ReMem.erase`` (and ``remem erase``, the MCP tool, the gateway's
``DELETE``) does, in order.

1. Check the request (ids, or a filter, or a whole scope; a reason; trace paths that exist) before writing.
2. One ledger transaction redacts the memories and everything of the ledger that quotes them
   (:mod:`remem_agent.store.erasure`): all of it, or (on any error or a crash) none of it.
3. The in-process vector index forgets their vectors, and the ranking's memo of folded texts is emptied.
4. Trace files lose every line that names an erased memory (or, for a whole scope, one of its searches or
   answers) or quotes its text (:mod:`remem_agent.trace_io`).
5. The store's files are rewritten so that freed space keeps none of the bytes (``Store.scrub``).

Steps 3 to 5 come after the commit and are idempotent: erasing an erased memory again repeats them (a crash
after the commit is completed that way). Step 4 then finds lines by id only: the text is gone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from remem_agent.errors import UserInputError
from remem_agent.ranking.select import forget_folded_texts
from remem_agent.store import erasure as ledger
from remem_agent.store.base import Store
from remem_agent.store.erasure import Erased, ScrubReport
from remem_agent.store.sql import LedgerTx
from remem_agent.trace_io import files_of, remove_lines
from remem_agent.types import ROLES
from remem_agent.validate import check_ids, check_scope, check_text

MIN_CONTAINS = 4  # characters: a shorter ``contains`` would match unrelated memories
DEFAULT_REASON = "erased on request"


@dataclass(frozen=True, kw_only=True)
class EraseRequest:
    """What to erase: ``ids``, or the memories matching a filter (``entity`` ... ``contains``), or, with
    ``whole_scope``, everything of ``scope``. ``scope`` limits ids and filters to one scope (another scope's
    id is then unknown). Build it with :meth:`checked`, which refuses a request that names nothing."""

    ids: tuple[str, ...] = ()
    scope: str | None = None
    whole_scope: bool = False
    entity: str | None = None
    attribute: str | None = None
    speaker: str | None = None
    session: str | None = None
    role: str | None = None
    contains: str | None = None
    reason: str = DEFAULT_REASON

    @classmethod
    def checked(cls, ids: str | Sequence[str] | None = None, **kw: Any) -> EraseRequest:
        """The request, its values validated (``UserInputError`` otherwise)."""
        ids_t = () if ids is None else tuple(check_ids([ids] if isinstance(ids, str) else ids, "ids"))
        scope = kw.get("scope")
        kw["scope"] = None if scope is None else check_scope(scope)
        for name in ("entity", "attribute", "speaker", "session", "role", "contains"):
            if kw.get(name) is not None:
                kw[name] = check_text(kw[name], name)
        kw["reason"] = check_text(kw.get("reason", DEFAULT_REASON), "reason")
        req = cls(ids=ids_t, **kw)
        filters = [n for n in ("entity", "attribute", "speaker", "session", "role", "contains") if getattr(req, n)]
        if not isinstance(req.whole_scope, bool):
            raise UserInputError("whole_scope must be true or false")
        modes = [bool(req.ids), bool(filters), req.whole_scope]
        if sum(modes) != 1:
            raise UserInputError(
                "erase needs exactly one of: memory ids, a filter (entity, attribute, speaker, session, role, "
                "contains), or whole_scope with a scope"
            )
        if req.whole_scope and req.scope is None:
            raise UserInputError("whole_scope erases one scope: name it with scope=")
        if req.role is not None and req.role not in ROLES:
            raise UserInputError(f"role must be one of {ROLES}")
        if req.contains is not None and len(req.contains) < MIN_CONTAINS:
            raise UserInputError(f"contains must be at least {MIN_CONTAINS} characters (it erases every match)")
        return req


@dataclass(frozen=True, kw_only=True)
class ErasureReport:
    """What an erasure did (never the erased text)."""

    erased: tuple[str, ...]
    already_erased: tuple[str, ...]
    events_redacted: int
    answers_dropped: int
    searches_redacted: int
    responses_cleared: int
    trace_lines_removed: int
    trace_files_rewritten: int
    scrub: ScrubReport | None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["erased"], out["already_erased"] = list(self.erased), list(self.already_erased)
        if self.scrub is not None:
            out["scrub"]["steps"] = list(self.scrub.steps)
        return out


def check_trace_paths(store: Store, paths: Sequence[str | Path] | None) -> tuple[Path, ...]:
    """Trace files or folders to scrub; each must exist (a typo would leave lines behind silently). None: the
    store folder's ``traces`` (where the agent and the gateway write by default), if it exists."""
    if paths is None:
        folder = getattr(store, "folder", None)
        return (folder / "traces",) if folder is not None and (folder / "traces").is_dir() else ()
    if isinstance(paths, str | Path):
        raise UserInputError("traces must be a list of files or folders")
    out = []
    for p in paths:
        path = Path(p).expanduser()
        if not path.exists():
            raise UserInputError(f"trace path {path} does not exist")
        out.append(path)
    return tuple(out)


def in_ledger(tx: LedgerTx, req: EraseRequest, *, at: float) -> Erased:
    """Step 2: the ledger transaction (may run more than once: no effects outside ``tx``)."""
    if req.ids:
        ids: Sequence[str] = req.ids
    else:
        ids = ledger.select_ids(
            tx,
            scope=req.scope,
            entity=req.entity,
            attribute=req.attribute,
            speaker=req.speaker,
            session=req.session,
            role=req.role,
            contains=req.contains,
        )
    also = (req.contains,) if req.contains else ()
    done = ledger.erase(tx, ids, at=at, reason=req.reason, scope=req.scope, also=also)
    if not req.whole_scope:
        return done
    assert req.scope is not None
    traffic = ledger.erase_scope_traffic(tx, req.scope)
    return Erased(
        memories=done.memories,
        already_erased=done.already_erased,
        events_redacted=done.events_redacted,
        answers_dropped=done.answers_dropped + traffic.answers_dropped,
        searches_redacted=done.searches_redacted + traffic.searches_redacted,
        responses_cleared=done.responses_cleared + traffic.responses_cleared,
        texts=done.texts,
        search_ids=traffic.search_ids,
        answer_ids=done.answer_ids | traffic.answer_ids,
    )


def _names(value: Any, out: set[str]) -> None:
    """Every string of a parsed trace line (ids are strings wherever a line holds them)."""
    if isinstance(value, str):
        out.add(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            out.add(str(k))
            _names(v, out)
    elif isinstance(value, list):
        for v in value:
            _names(v, out)


def line_filter(erased: Erased) -> Callable[[str], bool]:
    """Whether a trace line must go: it names an erased memory, search or answer, or quotes an erased text
    (as written, or JSON-escaped)."""
    ids = set(erased.memories) | set(erased.already_erased) | set(erased.search_ids) | set(erased.answer_ids)
    quoted = ledger.variants(erased.texts)

    def drop(line: str) -> bool:
        if any(q in line for q in quoted):
            return True
        if not ids:
            return False
        try:
            rec = json.loads(line)
        except ValueError:  # not a JSON line: by substring
            return any(i in line for i in ids)
        found: set[str] = set()
        _names(rec, found)
        return not found.isdisjoint(ids)

    return drop


def run(
    store: Store,
    req: EraseRequest,
    *,
    traces: Sequence[Path],
    scrub: bool,
    at: float,
    forget_vectors: Callable[[Sequence[str]], None] | None = None,
) -> ErasureReport:
    """Steps 2 to 5 of a checked request (step 1: ``EraseRequest.checked``, ``check_trace_paths``)."""
    if not isinstance(scrub, bool):
        raise UserInputError("scrub must be true or false")
    done = store.transact(lambda tx: in_ledger(tx, req, at=at))
    return finish(store, done, traces=traces, scrub=scrub, forget_vectors=forget_vectors)


def finish(
    store: Store,
    erased: Erased,
    *,
    traces: Sequence[Path],
    scrub: bool,
    forget_vectors: Callable[[Sequence[str]], None] | None = None,
) -> ErasureReport:
    """Steps 3 to 5, after the commit."""
    if forget_vectors is not None:
        forget_vectors([*erased.memories, *erased.already_erased])
    forget_folded_texts()
    drop = line_filter(erased)
    lines = files = 0
    for f in files_of(traces):
        n = remove_lines(f, drop)
        lines += n
        files += n > 0
    report = store.scrub() if scrub else None
    return ErasureReport(
        erased=erased.memories,
        already_erased=erased.already_erased,
        events_redacted=erased.events_redacted,
        answers_dropped=erased.answers_dropped,
        searches_redacted=erased.searches_redacted,
        responses_cleared=erased.responses_cleared,
        trace_lines_removed=lines,
        trace_files_rewritten=files,
        scrub=report,
    )
