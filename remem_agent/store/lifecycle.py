"""The retention state machine: which lifecycle events are legal in which state.

Every state change in the ledger goes through :func:`next_state`, so an illegal move (archiving an
invalidated fact, reviving an active one) is a typed :class:`InvalidTransition` instead of a silent
corruption. The policy that *decides* when to demote, compress or archive lives in the retention
module; this table only says what is allowed.

::

    None ──add──► ACTIVE ──demote──► LOW_VALUE ──compress──► COMPRESSED ──archive──► ARCHIVED
                    ▲                    │                       │                      │
                    └────────revive──────┴───────────────────────┴──────────────────────┘
    ACTIVE | LOW_VALUE | COMPRESSED | ARCHIVED ──invalidate──► INVALIDATED (terminal; as_of only)
    any state but INVALIDATED ──reconfirm──► same state (a restated fact; logged, no move)
    any state but ERASED ──erase──► ERASED (terminal; the row is redacted, never served: store/erasure.py)
"""

from __future__ import annotations

import enum

from remem_agent.errors import InvalidTransition
from remem_agent.types import State


class LifecycleEvent(enum.StrEnum):
    ADD = "add"
    DEMOTE = "demote"
    REVIVE = "revive"
    COMPRESS = "compress"
    ARCHIVE = "archive"
    INVALIDATE = "invalidate"
    RECONFIRM = "reconfirm"
    ERASE = "erase"

    def __str__(self) -> str:
        return self.value


_LIVE = (State.ACTIVE, State.LOW_VALUE, State.COMPRESSED, State.ARCHIVED)

TRANSITIONS: dict[tuple[State | None, LifecycleEvent], State] = {
    (None, LifecycleEvent.ADD): State.ACTIVE,
    (State.ACTIVE, LifecycleEvent.DEMOTE): State.LOW_VALUE,
    (State.LOW_VALUE, LifecycleEvent.REVIVE): State.ACTIVE,
    (State.COMPRESSED, LifecycleEvent.REVIVE): State.ACTIVE,
    (State.ARCHIVED, LifecycleEvent.REVIVE): State.ACTIVE,
    (State.LOW_VALUE, LifecycleEvent.COMPRESS): State.COMPRESSED,
    (State.COMPRESSED, LifecycleEvent.ARCHIVE): State.ARCHIVED,
    **{(s, LifecycleEvent.INVALIDATE): State.INVALIDATED for s in _LIVE},
    **{(s, LifecycleEvent.RECONFIRM): s for s in _LIVE},
    **{(s, LifecycleEvent.ERASE): State.ERASED for s in (*_LIVE, State.INVALIDATED)},
}


def next_state(current: State | None, event: LifecycleEvent, *, memory_id: str = "?") -> State:
    """The state after ``event``; raises InvalidTransition when the table forbids it."""
    try:
        return TRANSITIONS[(current, event)]
    except KeyError:
        raise InvalidTransition(memory_id, str(current) if current else "NEW", str(event)) from None
