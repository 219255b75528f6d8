"""A user's correction of a wrong answer, kept as the fact that replaces what the answer relied on.

"No, it's Lisbon" after an answer that cited "The office is in Paris." (entity ``office``, attribute
``city``) fails that answer (:mod:`.verdicts`); with ``MemoryAgent(capture_corrections=True)`` (``remem serve
--capture-corrections``) it also stores ``office city: Lisbon (the user's correction of: The office is in
Paris.)`` as a ``state`` fact of the same entity and attribute, which supersedes the old one.

What it trusts, and what it does not:

* Only a turn that opens like a correction (``conversation.looks_like_correction``) and says a value after
  its opening ("No." or "That's wrong" alone corrects nothing) is kept.
* Only a fact the corrected answer cited (else, one whose value it used) can be replaced, and only when those
  are keyed ``state`` facts of exactly one entity and attribute: the user's words never choose the key.
* The new fact is written in the answer's own scope, the scope of the caller who judged it: a turn can only
  replace what was served to its own scope. A fact of a shared scope is not changed; the correction is the
  caller's own newer fact beside it.
* Its provenance is kept in the ledger: speaker ``user`` (asserted by the user, not by a model) and session
  ``correction:<answer id>`` (the answer it corrects), immutable like every memory's.

Decisions only; :class:`~remem_agent.agent.verdicts.Verdicts` reads the cited memories and writes the fact.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from remem_agent.agent.conversation import correction_rest
from remem_agent.types import Memory, State
from remem_agent.validate import MemoryInput

SPEAKER = "user"
SESSION_PREFIX = "correction:"
MAX_VALUE_CHARS = 300
# what often stands between the opening and the value: "No, it's Lisbon", "Actually the answer is 42"
_FILLER = re.compile(
    r"^(?:(?:it|that|this)(?:'s| is| was)|the (?:right |correct )?answer is|i (?:said|meant)|rather|but)\b[\s,:-]*",
    re.IGNORECASE,
)
_EDGES = re.compile(r"^[\s,.;:!?\-–—]+|[\s.!;,\"'“”«»)\]]+$")


def correction_value(turn: str) -> str | None:
    """The value a correcting turn states after its opening, or None when it states none."""
    rest = correction_rest(turn)
    if rest is None:
        return None
    for _ in range(3):  # "No, that's wrong, it's Lisbon": one opening after another
        rest = _EDGES.sub("", rest)
        again = correction_rest(rest)
        if again is None:
            break
        rest = again
    value = _EDGES.sub("", _FILLER.sub("", rest))
    if not value or len(value) > MAX_VALUE_CHARS or not any(ch.isalnum() for ch in value):
        return None
    return value


def target(memories: Sequence[Memory], scope: str) -> Memory | None:
    """The one fact a correction may replace: the keyed, active ``state`` memories of ``scope`` among those the
    answer relied on, if they name exactly one entity and attribute (the newest of them)."""
    keyed = [
        m
        for m in memories
        if m.role == "state" and m.entity and m.attribute and m.scope == scope and m.state is State.ACTIVE
    ]
    if len({(m.entity, m.attribute) for m in keyed}) != 1:
        return None
    return max(keyed, key=lambda m: m.valid_from)


def correction_fact(old: Memory, turn: str, answer_id: str) -> MemoryInput | None:
    """The fact that replaces ``old`` after the correcting ``turn`` of the answer ``answer_id`` (None: none)."""
    value = correction_value(turn)
    if value is None or old.entity is None or old.attribute is None:
        return None
    return MemoryInput(
        f"{old.entity} {old.attribute}: {value} (the user's correction of: {old.text})",
        entity=old.entity,
        attribute=old.attribute,
        role="state",
        scope=old.scope,
        speaker=SPEAKER,
        session=f"{SESSION_PREFIX}{answer_id}",
    )
