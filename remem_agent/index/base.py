"""The index seam: candidate generation only.

An index is derived data: the ledger keeps every embedding, so any index can be rebuilt from it.
It never decides what is served; it only proposes an over-fetched pool of similar memories.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray


@runtime_checkable
class IndexBackend(Protocol):
    """Any object with these methods can serve as a backend."""

    def ingest(self, ids: Sequence[str], vectors: NDArray[np.float32]) -> None:
        """Add vectors (rows L2-normalised, shape (len(ids), dim)) under their memory ids."""
        ...

    def candidates(self, query: NDArray[np.float32], k: int) -> tuple[list[str], NDArray[np.float32]]:
        """Return up to ``k`` (ids, cosine similarities), most similar first."""
        ...

    def __len__(self) -> int: ...
