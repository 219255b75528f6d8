"""Ingest: writing validated facts (``validate.py``) with supersession applied.

Validation happens before anything is written; ``insert_fact`` runs inside the caller's write
transaction so a batch is all or nothing and supersession sees the batch's earlier facts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from remem_agent._time import now as wall_now
from remem_agent.errors import UserInputError
from remem_agent.learning.staleness import StalenessPolicy, additive_wording, normalise, update_wording
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.store.sql import LedgerTx
from remem_agent.tokens import count_tokens
from remem_agent.transcripts import Turn
from remem_agent.types import Memory, State
from remem_agent.validate import CleanFact, MemoryInput, check_text


class FactExtractor(Protocol):
    """Turns a conversation transcript into facts (see ``add_conversation``)."""

    def extract(self, transcript: str) -> Sequence[MemoryInput]: ...


def new_id(prefix: str) -> str:
    """Time-ordered ids (48-bit ms clock + 48 random bits): B-tree inserts append instead of landing
    on a random leaf page, so the id and event indexes stay cache-friendly as the store grows.

    Interned, as the ids read back from the ledger are (``store.sql.row_to_memory``): the flat index takes an
    ``add_many``'s new ids from here, not from a read, and a later read of the row gives the same object."""
    return sys.intern(f"{prefix}_{time.time_ns() // 1_000_000:012x}{os.urandom(6).hex()}")  # uuid4().hex[:12], cheaper


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
