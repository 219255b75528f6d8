"""What a store and the ``ReMem`` opening it agree on, from the store's meta keys.

A store records, when it is first opened, the properties its rows depend on: the embedder and dimension its
vectors come from, the supersession mode its lifecycle was written under, the weight its conversation turns'
vectors lean on the turn before (``embedders/context.py``) and the feature names its learned statistics use.
Reopened, it keeps them: an explicit embedder, mode or weight that disagrees is refused with how to move the
store instead (``remem reembed``). Left out, each comes from the store, or for a new store from the defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from remem_agent.config import RememConfig
from remem_agent.embedders import context
from remem_agent.embedders.base import Embedder
from remem_agent.embedders.compat import vectors_compatible
from remem_agent.embedders.registry import embedder_for_store, make_embedder
from remem_agent.errors import UserInputError
from remem_agent.ranking.features import FEATURE_NAMES
from remem_agent.store.base import Store


@dataclass(frozen=True, kw_only=True)
class StoreTerms:
    embedder: Embedder
    dim: int
    turn_context: float


def agree(
    store: Store, embedder: Embedder | None, config: RememConfig, *, path: Path | str, new_store_embedder: str
) -> StoreTerms:
    """The terms ``store`` is opened on (recording them in a new store); raises ``UserInputError`` on a
    disagreement. The caller closes the store when this raises."""
    if embedder is None:  # an existing store reopens with its own embedder; a new one gets new_store_embedder
        recorded = store.get_meta("embedder")
        embedder = embedder_for_store(recorded) if recorded else make_embedder(new_store_embedder)
    stored_name = store.set_meta_default("embedder", embedder.name)
    stored_dim = int(store.set_meta_default("dim", str(embedder.dim)))
    if not vectors_compatible(stored_name, stored_dim, embedder):  # same embedder, or one vector family
        raise UserInputError(
            f"store {path} was built with embedder {stored_name!r} (dim {stored_dim}); "
            f"got {embedder.name!r} (dim {embedder.dim}). Open it with the same embedder, or move it to another "
            "with `remem reembed`."
        )
    store.set_meta_default("feature_names", json.dumps(FEATURE_NAMES))
    mode = store.set_meta_default("supersession", config.staleness.mode)
    if mode != config.staleness.mode:
        raise UserInputError(f"store {path} uses supersession mode {mode!r}; got {config.staleness.mode!r}")
    wanted = config.turn_context
    weight = store.set_meta_default(context.META_KEY, str(context.DEFAULT_WEIGHT if wanted is None else wanted))
    return StoreTerms(
        embedder=embedder, dim=stored_dim, turn_context=context.store_weight(weight, wanted, where=str(path))
    )
