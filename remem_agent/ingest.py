"""Ingest: validating facts at the API boundary and writing them with supersession applied.

Validation happens before anything is written; ``insert_fact`` runs inside the caller's write
transaction so a batch is all or nothing and supersession sees the batch's earlier facts.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from remem_agent._time import Timestamp, shown, to_epoch
from remem_agent._time import now as wall_now
from remem_agent.conversation import Turn
from remem_agent.errors import UserInputError
from remem_agent.learning.lifecycle import LifecycleEvent
from remem_agent.learning.staleness import StalenessPolicy, additive_wording, normalise, normalise_key, update_wording
from remem_agent.store.sql import LedgerTx
from remem_agent.tokens import count_tokens
from remem_agent.types import DEFAULT_SCOPE, ROLES, Memory, Role, State

_TASK_RE = re.compile(r"^[^\s*][^\n]{0,127}$")
_FIELDS = frozenset(
    {"text", "entity", "attribute", "role", "task", "timestamp", "confidence", "scope", "speaker", "session"}
)


@dataclass(frozen=True)
class MemoryInput:
    """One fact to add (``add_many`` also accepts plain dicts with these keys, or strings)."""

    text: str
    entity: str | None = None
    attribute: str | None = None
    role: Role = "state"
    task: str | Sequence[str] | None = None
    timestamp: Timestamp | None = None
    confidence: float = 1.0
    scope: str | None = None  # None: the caller's default scope (``add_many(..., scope=)``, else "default")
    speaker: str | None = None  # who said it (a conversation turn); stored, hashed, never changed
    session: str | None = None  # the conversation session it came from (an id or a date)


class FactExtractor(Protocol):
    """Turns a conversation transcript into facts (see ``add_conversation``)."""

    def extract(self, transcript: str) -> Sequence[MemoryInput]: ...


def new_id(prefix: str) -> str:
    """Time-ordered ids (48-bit ms clock + 48 random bits): B-tree inserts append instead of landing
    on a random leaf page, so the id and event indexes stay cache-friendly as the store grows.

    Interned, as the ids read back from the ledger are (``store.sql.row_to_memory``): the flat index takes an
    ``add_many``'s new ids from here, not from a read, and a later read of the row gives the same object."""
    return sys.intern(f"{prefix}_{time.time_ns() // 1_000_000:012x}{os.urandom(6).hex()}")  # uuid4().hex[:12], cheaper


# Documented maxima of the boundary checks (docs/concepts.md "Errors"). Integers are bounded by what every
# backend column holds (PostgreSQL ``integer``); texts by what a memory, a prompt and a ledger row can hold.
MAX_INT = 2**31 - 1
MAX_TEXT_CHARS = 1_000_000
MAX_KEY_CHARS = 1_000
MAX_LABEL_CHARS = 256  # speaker and session: names and ids, not text


def _check_storable(text: str, what: str) -> None:
    """Refuse strings the ledger cannot store: NUL (PostgreSQL text cannot hold it) and anything that is
    not encodable as UTF-8 (lone surrogates such as ``"\\ud800"``, e.g. from a broken JSON decoder)."""
    if "\x00" in text:
        raise UserInputError(f"{what} must not contain NUL characters")
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise UserInputError(
            f"{what} is not valid Unicode text: {bad!r} at position {exc.start} is a lone surrogate, "
            "which cannot be stored as UTF-8 (decode the input with errors='replace', or fix the source)"
        ) from None


def check_text(text: object, what: str = "text", *, max_chars: int = MAX_TEXT_CHARS) -> str:
    """A non-empty, storable string of at most ``max_chars`` characters, stripped."""
    if not isinstance(text, str):
        raise UserInputError(f"{what} must be a string, got {type(text).__name__}")
    if len(text) > max_chars:
        raise UserInputError(f"{what} is too long: {len(text)} characters (at most {max_chars})")
    _check_storable(text, what)
    if not text.strip():
        raise UserInputError(f"{what} must not be empty")
    return text.strip()


def check_key(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UserInputError(f"{what} must be a non-empty string or None")
    if len(value) > MAX_KEY_CHARS:
        raise UserInputError(f"{what} is too long: {len(value)} characters (at most {MAX_KEY_CHARS})")
    _check_storable(value, what)
    return normalise_key(value)


def check_label(value: object, what: str) -> str | None:
    """``speaker`` / ``session``: None, or one non-empty line of at most ``MAX_LABEL_CHARS`` characters
    (stripped). Control characters are refused because the label is rendered into prompts."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise UserInputError(f"{what} must be a string or None, got {type(value).__name__}")
    if len(value) > MAX_LABEL_CHARS:
        raise UserInputError(f"{what} is too long: {len(value)} characters (at most {MAX_LABEL_CHARS})")
    _check_storable(value, what)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value if ch not in " \t"):
        raise UserInputError(f"{what} must be a single line without control characters, got {value!r:.80}")
    value = value.strip()
    if not value:
        raise UserInputError(f"{what} must not be empty (use None for none)")
    return value


def check_task(task: object) -> str | None:
    if task is None:
        return None
    if not isinstance(task, str) or not _TASK_RE.match(task.strip()):
        raise UserInputError("task must be a non-empty single-line string (at most 128 chars, not '*')")
    _check_storable(task, "task")
    return task.strip()


def check_tasks(task: object) -> tuple[str, ...]:
    if task is None:
        return ()
    if isinstance(task, str):
        return (t,) if (t := check_task(task)) else ()
    if isinstance(task, Iterable) and not isinstance(task, bytes | bytearray | Mapping):
        out = []
        for t in task:
            ct = check_task(t)
            if ct and ct not in out:
                out.append(ct)
        return tuple(out)
    raise UserInputError("task must be a string or a list of strings")


def check_ids(ids: object, what: str) -> list[str]:
    if ids is None:
        return []
    if isinstance(ids, str | bytes | bytearray | Mapping) or not isinstance(ids, Iterable):
        raise UserInputError(f"{what} must be a list of memory ids")
    out = []
    for i in ids:
        if not isinstance(i, str):
            raise UserInputError(f"{what} must contain strings, got {type(i).__name__}")
        _check_storable(i, what)
        if i not in out:
            out.append(i)
    return out


def check_int(value: object, what: str, *, minimum: int, maximum: int = MAX_INT) -> int:
    """An int (not a bool) in ``[minimum, maximum]``; the default maximum is ``MAX_INT`` (2**31 - 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise UserInputError(f"{what} must be an integer in [{minimum}, {maximum}], got {shown(value)}")
    return int(value)


def check_fraction(value: object, what: str, *, low_open: bool = False) -> float:
    """A finite real number (not a bool) in [0, 1], or (0, 1] with ``low_open``. Ints are compared before
    ``float()``, so a huge one is refused instead of overflowing."""
    f = math.nan
    if isinstance(value, int) and not isinstance(value, bool):
        f = float(value) if -1 <= value <= 1 else math.nan
    elif isinstance(value, float):
        f = value
    ok = f > 0.0 if low_open else f >= 0.0  # False for NaN
    if not (ok and f <= 1.0):
        span = "(0, 1]" if low_open else "[0, 1]"
        raise UserInputError(f"{what} must be a number in {span}, got {shown(value)}")
    return float(f)


def check_weight(weight: object) -> float:
    """``feedback(weight=)``: a number in (0, 1]."""
    return check_fraction(weight, "weight", low_open=True)


def check_items(items: object) -> list[Any]:
    """``add_many``'s argument as a list: a list/tuple or other iterable of items, but not a single item
    (a string would store one memory per character, a dict one memory per key)."""
    if isinstance(items, str | bytes | bytearray | Mapping | MemoryInput):
        raise UserInputError(
            f"add_many takes a list of facts, got a single {type(items).__name__}; use add() or wrap it in a list"
        )
    if isinstance(items, AbstractSet):
        raise UserInputError("add_many takes a list of facts, got a set: facts are stored in order, a set has none")
    if not isinstance(items, Iterable):
        raise UserInputError(f"add_many takes a list of facts (MemoryInput, dict or str), got {type(items).__name__}")
    return list(items)


@dataclass(frozen=True)
class CleanFact:
    """A validated fact, ready to embed and insert."""

    text: str
    entity: str | None
    attribute: str | None
    role: Role
    tasks: tuple[str, ...]
    t: float
    confidence: float
    explicit_time: bool = False  # the caller passed ``timestamp`` (not defaulted to "now")
    scope: str = DEFAULT_SCOPE
    speaker: str | None = None
    session: str | None = None


_SCOPE = re.compile(r"[A-Za-z0-9_.:@/=+-]{1,128}")


def check_scope(value: object, what: str = "scope") -> str:
    """A scope name: 1-128 characters of letters, digits and ``_ . : @ / = + -`` (``user:alice/agent:ops``)."""
    if value is None:
        return DEFAULT_SCOPE
    if not isinstance(value, str) or not _SCOPE.fullmatch(value):
        raise UserInputError(
            f"{what} must be 1-128 characters of letters, digits and _ . : @ / = + - (like 'user:alice'), "
            f"got {value!r:.80}"
        )
    return value


def validate_fact(item: MemoryInput | Mapping[str, Any] | str, pos: int = 0, *, scope: str | None = None) -> CleanFact:
    """Check one fact of ``add``/``add_many``; raises UserInputError naming the item.

    ``scope`` is the call's scope; an item naming its own scope must name the same one (a batch is one scope's).
    """
    if isinstance(item, str):
        item = MemoryInput(item)
    elif isinstance(item, Mapping):
        unknown = set(item) - _FIELDS
        if unknown:
            raise UserInputError(f"item {pos}: unknown fields {sorted(unknown, key=repr)}")
        if "text" not in item:
            raise UserInputError(f"item {pos}: missing 'text'")
        item = MemoryInput(**item)
    elif not isinstance(item, MemoryInput):
        raise UserInputError(f"item {pos}: expected MemoryInput, dict or str, got {type(item).__name__}")
    text = check_text(item.text)
    if not isinstance(item.role, str) or item.role not in ROLES:
        raise UserInputError(f"role must be one of {ROLES}, got {item.role!r}")
    confidence = check_fraction(item.confidence, "confidence")
    t = to_epoch(item.timestamp, name="timestamp", default=wall_now())
    assert t is not None
    own = check_scope(item.scope) if item.scope is not None else None
    if own is not None and scope is not None and own != scope:
        raise UserInputError(f"item {pos}: scope {own!r} differs from the call's scope {scope!r}")
    return CleanFact(
        text=text,
        entity=check_key(item.entity, "entity"),
        attribute=check_key(item.attribute, "attribute"),
        role=item.role,
        tasks=check_tasks(item.task),
        t=t,
        confidence=confidence,
        explicit_time=item.timestamp is not None,
        scope=own or scope or DEFAULT_SCOPE,
        speaker=check_label(item.speaker, "speaker"),
        session=check_label(item.session, "session"),
    )


def validate_facts(items: object, *, scope: str | None = None) -> list[CleanFact]:
    """Check ``add_many``'s whole argument (see ``check_items``) and every fact in it."""
    return [validate_fact(it, i, scope=scope) for i, it in enumerate(check_items(items))]


def same_claim(tx: LedgerTx, c: CleanFact, claims: list[Memory] | None = None) -> Memory | None:
    """The stored memory that ``c`` replays exactly, if any (docs/concepts.md "Supersession", re-adding a fact).

    Same claim = same entity+attribute (both given), same role, same normalised text and the same
    ``valid_from`` as an explicitly passed timestamp, in any state (a superseded fact included).
    Without an explicit timestamp a fact is stated "now" and is always a new claim. ``claims``: the result of
    ``tx.claims_at`` for ``c``, when the caller has read it already.
    """
    if not c.explicit_time or c.entity is None or c.attribute is None:
        return None
    if claims is None:
        claims = tx.claims_at(c.entity, c.attribute, c.role, c.t, c.scope)
    if not claims:
        return None  # the usual case, without normalising c.text (2 of 3 normalise calls of the benchmark's adds)
    want = normalise(c.text)
    for m in claims:
        if normalise(m.original_text) == want:
            return m
    return None


def state_keys(clean: Iterable[CleanFact]) -> list[tuple[str, str, str]]:
    """The (scope, entity, attribute) keys whose role-'state' facts ``insert_fact`` reads for these facts: the
    keys of the keyed state facts (``LedgerTx.prefetch_keys`` reads them for a whole batch at once)."""
    return [
        (c.scope, c.entity, c.attribute)
        for c in clean
        if c.role == "state" and c.entity is not None and c.attribute is not None
    ]


def insert_fact(tx: LedgerTx, c: CleanFact, vec: np.ndarray, warn: list[str], staleness: StalenessPolicy) -> str:
    """Write one fact; apply supersession, restatement and backdating rules. Returns the memory id."""
    current: list[Memory] = []
    claims: list[Memory] | None = None
    if c.role == "state" and c.entity is not None and c.attribute is not None:
        if c.explicit_time:  # same_claim will ask for the claims at c.t too: one read for both
            current, claims = tx.current_and_claims(c.entity, c.attribute, c.t, c.scope)
        else:
            current = tx.current_for_key(c.entity, c.attribute, c.scope)
        restated = _restate(tx, c, current)
        if restated is not None:
            return restated
    replayed = same_claim(tx, c, claims)
    if replayed is not None:
        # The same claim again (e.g. a script run twice): nothing new is known, so nothing is written; a
        # superseded fact stays superseded instead of retiring its successor ("the server moved back").
        if set(replayed.tasks) | set(c.tasks) != set(replayed.tasks) or replayed.confidence != c.confidence:
            warn.append(
                f"{c.text!r} at {c.t} is already stored as {replayed.id} (same key, text and timestamp); the "
                f"stored task tags {list(replayed.tasks)} and confidence {replayed.confidence} are kept"
            )
        return replayed.id
    mem = _new_memory(c)
    tx.insert_memory(mem, vec, reason="added", at=c.t)
    if current:
        _supersede(tx, c, mem, current, warn, staleness)
    return mem.id


def _restate(tx: LedgerTx, c: CleanFact, current: list[Memory]) -> str | None:
    """The current fact of ``c``'s key with ``c``'s text, reconfirmed (or revived if archived); None if none."""
    for old in current:
        if normalise(old.original_text) == normalise(c.text):
            if old.state in (State.ACTIVE, State.LOW_VALUE, State.COMPRESSED):
                tx.transition(
                    old.id,
                    LifecycleEvent.RECONFIRM,
                    reason="the same fact was stated again",
                    at=c.t,
                    evidence={"text": c.text},
                )
            else:  # an archived fact stated again is in use again
                tx.transition(
                    old.id,
                    LifecycleEvent.REVIVE,
                    reason="revived: the same fact was stated again",
                    at=c.t,
                    evidence={"text": c.text},
                    updates={"text": old.original_text, "token_cost": count_tokens(old.original_text)},
                )
            return old.id
    return None


def _new_memory(c: CleanFact) -> Memory:
    """The ledger row of a new fact: active, valid from its time, its text's token cost."""
    return Memory(
        id=new_id("m"),
        text=c.text,
        original_text=c.text,
        entity=c.entity,
        attribute=c.attribute,
        role=c.role,
        tasks=c.tasks,
        created_at=wall_now(),
        valid_from=c.t,
        valid_to=None,
        superseded_by=None,
        state=State.ACTIVE,
        token_cost=count_tokens(c.text),
        confidence=c.confidence,
        scope=c.scope,
        speaker=c.speaker,
        session=c.session,
    )


def _supersede(
    tx: LedgerTx, c: CleanFact, mem: Memory, current: list[Memory], warn: list[str], staleness: StalenessPolicy
) -> None:
    """After inserting ``mem`` beside the ``current`` facts of its key: learn the schema from an update's wording,
    then retire the current facts (or ``mem`` itself when a newer one already holds)."""
    assert c.entity is not None and c.attribute is not None
    wording = update_wording(c.text)
    if wording:
        tx.bump_attribute(c.attribute, confirmations=1)
        # Learning the schema may have retired facts of this key: then it is read again. Otherwise no memories
        # row changed since ``current`` was read but the insert of ``mem`` (maybe_learn returns every event it
        # appended), so ``current`` is what the read would give without ``mem``. Not read again, the key costs
        # no query, and on SQLite no insert of the buffered rows in mid-batch (the read would see ``mem``).
        learned = staleness.maybe_learn(tx, c.attribute, at=c.t)
        if any(e.memory_id == mem.id for e in learned):
            # The new fact was not the newest of its key (a backdated update): the retroactive supersession
            # just retired it in favour of the newest one, which is where it ends anyway.
            return
        if learned:
            current = tx.current_for_key(c.entity, c.attribute, c.scope)
            current = [m for m in current if m.id != mem.id]
            if not current:
                return
    if not staleness.supersedes_on_key(tx, c.attribute, wording):
        return  # learned-schema mode: a pending conflict until the attribute is known single-valued
    additive = additive_wording(c.text)
    if additive:
        warn.append(
            f"{c.text!r} reads like an additional value ({additive!r}) but, as a 'state' fact with key "
            f"({c.entity}, {c.attribute}), it replaces the current value; store multi-valued facts with "
            "role='preference' or 'note'"
        )
    newer = [m for m in current if m.valid_from > c.t]
    if newer:
        # Backdated fact: it was already replaced by the newer current one when it arrived.
        repl = min(newer, key=lambda m: m.valid_from)
        tx.transition(
            mem.id,
            LifecycleEvent.INVALIDATE,
            reason=f"superseded on arrival: newer fact {repl.id} with the same entity+attribute already holds",
            at=c.t,
            evidence={"by": repl.id, "key": [c.entity, c.attribute]},
            updates={"valid_to": repl.valid_from, "superseded_by": repl.id},
        )
        return
    for old in current:
        reason = "superseded by a newer fact with the same entity+attribute"
        if wording:
            reason += f" (explicit update wording: {wording!r})"
        tx.transition(
            old.id,
            LifecycleEvent.INVALIDATE,
            reason=reason,
            at=c.t,
            evidence={"by": mem.id, "key": [c.entity, c.attribute], "wording": wording, "new_text": c.text},
            updates={"valid_to": c.t, "superseded_by": mem.id},
        )
        tx.bump_attribute(c.attribute, changes=1)


def conversation_items(
    parsed: Sequence[Turn],
    extractor: FactExtractor | None,
    *,
    task: str | Sequence[str] | None,
    keep_turns: bool,
) -> list[MemoryInput]:
    """What ``ReMem.add_conversation`` stores of a parsed conversation: each turn as a ``note`` "speaker: text"
    (with ``keep_turns``), then, with ``extractor``, the facts it finds in each session's transcript, stamped
    with the session's last turn when they carry no time of their own."""
    items: list[MemoryInput] = []
    if keep_turns:
        items += [
            MemoryInput(
                f"{t.speaker}: {t.text}", role="note", task=task, timestamp=t.at, speaker=t.speaker, session=t.session
            )
            for t in parsed
        ]
    if extractor is not None:
        sessions: dict[str | None, list[Turn]] = {}
        for t in parsed:
            sessions.setdefault(t.session, []).append(t)
        for session, group in sessions.items():
            text = check_text("\n".join(f"{t.speaker}: {t.text}" for t in group), "transcript")
            last = max((t.at for t in group if t.at is not None), default=None)
            for fact in extractor.extract(text):
                if not isinstance(fact, MemoryInput):
                    raise UserInputError(f"the extractor returned {type(fact).__name__}, not a MemoryInput")
                stamp = fact.timestamp if fact.timestamp is not None else last
                items.append(replace(fact, timestamp=stamp, task=fact.task or task, session=session))
    return items
