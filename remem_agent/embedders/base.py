"""The embedder seam: text in, L2-normalised float32 vectors out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from remem_agent.errors import EmbeddingError, UserInputError

Vectors = NDArray[np.float32]


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into vectors of a fixed dimension.

    ``name`` identifies the vector space: a store remembers it and refuses to mix spaces.
    """

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Return an array of shape (len(texts), dim), float32, rows L2-normalised."""
        ...


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts an embedder was given, as a list; a bare string or a non-string item is a UserInputError."""
    if isinstance(texts, str):
        raise UserInputError("embed() takes a sequence of texts, not a single string")
    items = list(texts)
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise UserInputError(f"texts[{i}] is {type(text).__name__}, expected str")
    return items


def check_vectors(vectors: object, n: int, dim: int, *, source: str = "embedder") -> Vectors:
    """Validate an embedder's output: shape (n, dim), finite; returns float32 unit rows.

    Raises EmbeddingError (a UserInputError) instead of letting NaN or a wrong width reach the
    ledger, where it would poison every later search.
    """
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or arr.shape != (n, dim):
        raise EmbeddingError(f"{source} returned shape {arr.shape}, expected ({n}, {dim})")
    if not np.isfinite(arr).all():
        raise EmbeddingError(f"{source} returned NaN or infinite values")
    norms = np.linalg.norm(arr, axis=1)
    if n and (norms == 0).any():
        raise EmbeddingError(f"{source} returned an all-zero vector")
    return np.ascontiguousarray(arr / norms[:, None], dtype=np.float32)
