"""A conversation turn's vector carries the turn before it.

"Yes, the one I painted last week" means little alone; after "What did you paint for the show?" it is the
answer to a question about painting. So the vector stored for a turn leans toward the turn before it:

    v_i = (e_i + w * v_prev) * |e_i| / |e_i + w * v_prev|

``e_i`` is the embedder's vector of the turn's own text, ``v_prev`` the *stored* vector of the previous turn of
the same scope and session (itself leaning on its predecessor, so the context fades geometrically), and ``w``
the store's ``turn_context`` weight. The result keeps ``e_i``'s norm. A turn is a ``note`` with a speaker and a
session (what ``ReMem.add_conversation`` stores); every other memory keeps its own vector. The text, the
lexical index and what a reader is shown stay the turn's own: only dense recall sees the context.

The weight is a property of the store's vectors, recorded in its meta key ``turn_context`` when the store is
created, like its embedder: ``remem reembed`` recomputes every vector (in ledger order) and can change it.
Only decisions here; the store reads and writes the vectors (``memory.ReMem.add_many``, ``store.copy``).
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping, Sequence

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import UserInputError

META_KEY = "turn_context"
DEFAULT_WEIGHT = 0.7  # chosen on LoCoMo dev conversations (RememConfig.turn_context says how)
MAX_WEIGHT = 10.0

TurnKey = tuple[str, str]  # (scope, session)


def check_weight(value: object, what: str = "turn_context") -> float:
    """A finite weight in [0, MAX_WEIGHT]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserInputError(f"{what} must be a finite number, got {value!r}")
    if not 0 <= value <= MAX_WEIGHT:
        raise UserInputError(f"{what} must be between 0 and {MAX_WEIGHT}, got {value}")
    return float(value)


def parse_weight(text: str | None) -> float:
    """The weight a store records (``None``: a store that never recorded one, built without context)."""
    if text is None:
        return 0.0
    try:
        return check_weight(float(text), f"the store's {META_KEY}")
    except ValueError:
        raise UserInputError(f"the store's {META_KEY} is not a number: {text!r}") from None


def store_weight(recorded: str | None, wanted: float | None, *, where: str) -> float:
    """The weight a store's turn vectors are built with; ``wanted`` (a configured weight) must agree with it."""
    weight = parse_weight(recorded)
    if wanted is not None and wanted != weight:
        raise UserInputError(
            f"store {where} builds turn vectors with turn_context {weight}; got {wanted}. Leave turn_context "
            "unset to use the store's, or move the store with `remem reembed --turn-context`."
        )
    return weight


def turn_key(scope: str, role: str, speaker: str | None, session: str | None) -> TurnKey | None:
    """The chain a memory belongs to: a note with a speaker and a session is a conversation turn."""
    if role != "note" or speaker is None or session is None:
        return None
    return (scope, session)


def chain_vectors(
    keys: Sequence[TurnKey | None],
    vectors: NDArray[np.floating],
    weight: float,
    last: MutableMapping[TurnKey, NDArray[np.floating]],
) -> NDArray[np.float32]:
    """The stored vectors of memories inserted in this order (see the module docstring).

    ``keys[i]`` is memory i's chain (None: not a turn), ``vectors[i]`` its own embedding, ``last`` the stored
    vector of each chain's latest turn already in the store (the batch's own turns follow each other). ``last``
    is updated with the batch's turns, so that a caller going through the ledger in batches passes it on.
    """
    if weight == 0 or not any(k is not None for k in keys):
        return np.asarray(vectors, dtype=np.float32)
    out = np.array(vectors, dtype=np.float32, copy=True)
    for i, key in enumerate(keys):
        if key is None:
            continue
        prev = last.get(key)
        if prev is not None and prev.shape == out[i].shape:
            own = float(np.linalg.norm(out[i]))
            mixed = out[i].astype(np.float64) + weight * prev.astype(np.float64)
            size = float(np.linalg.norm(mixed))
            if size > 0 and own > 0 and math.isfinite(size):
                out[i] = (mixed * (own / size)).astype(np.float32)
        last[key] = out[i]
    return out
