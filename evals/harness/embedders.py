"""The embedders of the evaluations: the world's concept-hash embedder, all-MiniLM-L6-v2, and a text cache."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np

from evals.harness.world import World
from remem_agent.embedders.base import Embedder, Vectors, check_vectors
from remem_agent.embedders.hash_embedder import DEFAULT_CONCEPT_GROUPS, ConceptHashEmbedder

EMBEDDER_ENV = "REMEM_EVAL_EMBEDDER"
"""Read by :func:`embedder_for`: ``hash`` (default), ``minilm``, ``onnx`` or ``sentence-transformers``."""


class CachedEmbedder:
    """Wraps an embedder with a text -> vector cache (same name and dim, so stores accept it).

    Every question rebuilds its store, and a benchmark's haystacks share many turns: each distinct text
    is embedded once per run. ``seconds`` is the time spent in the wrapped embedder.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self._cache: dict[str, Vectors] = {}
        self.seconds = 0.0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: Sequence[str]) -> Vectors:
        texts = list(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            t0 = time.perf_counter()
            vecs = check_vectors(self.inner.embed(missing), len(missing), self.inner.dim, source=self.inner.name)
            self.seconds += time.perf_counter() - t0
            for t, v in zip(missing, vecs, strict=True):
                self._cache[t] = v
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._cache[t] for t in texts]).astype(np.float32)


def make_embedder(name: str) -> CachedEmbedder:
    """A cached embedder by name: ``hash`` (the default concept-hash embedder), ``minilm`` (all-MiniLM-L6-v2:
    on onnxruntime when the ``onnx`` extra is installed, else sentence-transformers), or one engine explicitly,
    ``onnx`` or ``sentence-transformers`` (see remem_agent.embedders.registry)."""
    from remem_agent.embedders.registry import make_embedder as by_name
    from remem_agent.errors import UserInputError

    try:
        return CachedEmbedder(by_name(name))
    except UserInputError as exc:
        raise SystemExit(str(exc)) from exc


_MINILM: CachedEmbedder | None = None


def embedder_for(world: World) -> Embedder:
    """The embedder a store replaying ``world`` uses.

    The concept-hash embedder with the world's synonym lexicon, or, when ``REMEM_EVAL_EMBEDDER`` names a real
    embedder (``run_benchmark --embedder minilm``), one all-MiniLM-L6-v2 shared by the whole process and cached.
    """
    global _MINILM
    name = os.environ.get(EMBEDDER_ENV, "hash")
    if name != "hash":
        if _MINILM is None:
            _MINILM = make_embedder(name)
        return _MINILM
    return ConceptHashEmbedder(concepts=[*DEFAULT_CONCEPT_GROUPS, *world.lexicon])
