"""Ingest: validating facts at the API boundary and writing them with supersession applied.

Validation happens before anything is written; ``insert_fact`` runs inside the caller's write
transaction so a batch is all or nothing and supersession sees the batch's earlier facts.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from remem_agent._time import Timestamp, to_epoch
from remem_agent._time import now as wall_now
from remem_agent.errors import UserInputError
from remem_agent.learning.lifecycle import LifecycleEvent
from remem_agent.learning.staleness import StalenessPolicy, additive_wording, normalise, normalise_key, update_wording
from remem_agent.store.sql import LedgerTx
from remem_agent.tokens import count_tokens
from remem_agent.types import ROLES, Memory, Role, State

_TASK_RE = re.compile(r"^[^\s*][^\n]{0,127}$")
_FIELDS = frozenset({"text", "entity", "attribute", "role", "task", "timestamp", "confidence"})


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


class FactExtractor(Protocol):
    """Turns a conversation transcript into facts (see ``add_conversation``)."""

    def extract(self, transcript: str) -> Sequence[MemoryInput]: ...


def new_id(prefix: str) -> str:
    """Time-ordered ids (48-bit ms clock + 48 random bits): B-tree inserts append instead of landing
    on a random leaf page, so the id and event indexes stay cache-friendly as the store grows."""
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{uuid.uuid4().hex[:12]}"


def check_text(text: object, what: str = "text") -> str:
    if not isinstance(text, str):
        raise UserInputError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise UserInputError(f"{what} must not be empty")
    if "\x00" in text:
        raise UserInputError(f"{what} must not contain NUL characters")
    return text.strip()


def check_key(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UserInputError(f"{what} must be a non-empty string or None")
    return normalise_key(value)


def check_task(task: object) -> str | None:
    if task is None:
        return None
    if not isinstance(task, str) or not _TASK_RE.match(task.strip()):
        raise UserInputError("task must be a non-empty single-line string (at most 128 chars, not '*')")
    return task.strip()


def check_tasks(task: object) -> tuple[str, ...]:
    if task is None:
        return ()
    if isinstance(task, str):
        return (t,) if (t := check_task(task)) else ()
    if isinstance(task, Iterable):
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
    if isinstance(ids, str) or not isinstance(ids, Iterable):
        raise UserInputError(f"{what} must be a list of memory ids")
    out = []
    for i in ids:
        if not isinstance(i, str):
            raise UserInputError(f"{what} must contain strings, got {type(i).__name__}")
        if i not in out:
            out.append(i)
    return out


def check_int(value: object, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserInputError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


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


def validate_fact(item: MemoryInput | Mapping[str, Any] | str, pos: int = 0) -> CleanFact:
    """Check one fact of ``add``/``add_many``; raises UserInputError naming the item."""
    if isinstance(item, str):
        item = MemoryInput(item)
    elif isinstance(item, Mapping):
        unknown = set(item) - _FIELDS
        if unknown:
            raise UserInputError(f"item {pos}: unknown fields {sorted(unknown)}")
        if "text" not in item:
            raise UserInputError(f"item {pos}: missing 'text'")
        item = MemoryInput(**item)
    elif not isinstance(item, MemoryInput):
        raise UserInputError(f"item {pos}: expected MemoryInput, dict or str, got {type(item).__name__}")
    text = check_text(item.text)
    if item.role not in ROLES:
        raise UserInputError(f"role must be one of {ROLES}, got {item.role!r}")
    conf = item.confidence
    if isinstance(conf, bool) or not isinstance(conf, int | float) or not 0.0 <= float(conf) <= 1.0:
        raise UserInputError(f"confidence must be a number in [0, 1], got {conf!r}")
    t = to_epoch(item.timestamp, name="timestamp", default=wall_now())
    assert t is not None
    return CleanFact(
        text=text,
        entity=check_key(item.entity, "entity"),
        attribute=check_key(item.attribute, "attribute"),
        role=item.role,
        tasks=check_tasks(item.task),
        t=t,
        confidence=float(conf),
    )


def insert_fact(tx: LedgerTx, c: CleanFact, vec: np.ndarray, warn: list[str], staleness: StalenessPolicy) -> str:
    """Write one fact; apply supersession, restatement and backdating rules. Returns the memory id."""
    current: list[Memory] = []
    if c.role == "state" and c.entity is not None and c.attribute is not None:
        current = tx.current_for_key(c.entity, c.attribute)
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
    mem = Memory(
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
    )
    tx.insert_memory(mem, vec, reason="added", at=c.t)
    if not current:
        return mem.id
    assert c.entity is not None and c.attribute is not None
    wording = update_wording(c.text)
    if wording:
        tx.bump_attribute(c.attribute, confirmations=1)
        staleness.maybe_learn(tx, c.attribute, at=c.t)
        current = tx.current_for_key(c.entity, c.attribute)
        current = [m for m in current if m.id != mem.id]
        if not current:
            return mem.id
    if not staleness.supersedes_on_key(tx, c.attribute, wording):
        return mem.id  # learned-schema mode: a pending conflict until the attribute is known single-valued
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
        return mem.id
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
    return mem.id
