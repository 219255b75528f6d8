"""Chroma index backend (cosine space, embeddings always passed explicitly).

Chroma never embeds anything here: the collection is opened with ``embedding_function=None``, so
chroma does not load (or try to download) its default ONNX model. Similarity is
``1 - cosine distance``. Install with ``pip install 'remem-agent[chroma]'``.

Note on the in-memory mode: every ``chromadb.EphemeralClient`` in one process shares a single
in-memory system, so an ephemeral backend appends a random suffix to its collection name to stay
isolated from other backends (see ``collection_name``); ``close()`` drops that collection.
With ``path`` the collection name is used as given and persists across processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from remem_agent._extras import require
from remem_agent.embedders.base import check_vectors
from remem_agent.errors import EmbeddingError, UserInputError
from remem_agent.index.faiss_backend import _check_ids, _empty, _query_row

# Chroma's own rule for collection names.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,510}[A-Za-z0-9]$")


def _chromadb() -> Any:
    return require("chromadb", "chroma", feature="ChromaBackend")


class ChromaBackend:
    """Candidate generation with a chromadb collection.

    Args:
        collection_name: name of the collection (3-512 chars of ``[A-Za-z0-9._-]``).
        path: folder for a persistent client; None keeps everything in memory.
        client: an existing chromadb client to use instead (``path`` must then be None).
        search_ef, construction_ef: HNSW breadth settings for a newly created collection.
    """

    def __init__(
        self,
        collection_name: str = "remem",
        path: str | os.PathLike[str] | None = None,
        *,
        client: Any = None,
        search_ef: int = 200,
        construction_ef: int = 200,
    ) -> None:
        if not isinstance(collection_name, str) or not _NAME_RE.match(collection_name):
            raise UserInputError(
                f"collection_name must be 3-512 characters of [A-Za-z0-9._-], starting and ending "
                f"with a letter or digit; got {collection_name!r}"
            )
        if client is not None and path is not None:
            raise UserInputError("pass either client or path, not both")
        if search_ef <= 0 or construction_ef <= 0:
            raise UserInputError("search_ef and construction_ef must be positive")
        chromadb = _chromadb()
        self._ephemeral = client is None and path is None
        if client is not None:
            self._client = client
        elif path is not None:
            self._client = chromadb.PersistentClient(path=os.fspath(path))
        else:
            self._client = chromadb.EphemeralClient()
        name = collection_name
        if self._ephemeral:
            suffix = "-" + uuid.uuid4().hex[:12]
            name = collection_name[: 512 - len(suffix)] + suffix
        self._name = name
        self._collection = self._client.get_or_create_collection(
            name=name,
            metadata={
                "hnsw:space": "cosine",
                "hnsw:search_ef": search_ef,
                "hnsw:construction_ef": construction_ef,
            },
            embedding_function=None,
        )
        space = self._space()
        if space != "cosine":
            raise UserInputError(
                f"chroma collection {name!r} already exists with distance {space!r}; remem needs 'cosine'"
            )
        self._batch = max(1, int(self._client.get_max_batch_size()))
        self._dim: int | None = self._stored_dim()
        self._lock = threading.RLock()

    def _space(self) -> str:
        config = getattr(self._collection, "configuration", None)
        if isinstance(config, dict):
            hnsw = config.get("hnsw")
            if isinstance(hnsw, dict) and hnsw.get("space"):
                return str(hnsw["space"])
        metadata = self._collection.metadata or {}
        return str(metadata.get("hnsw:space", "l2"))

    def _stored_dim(self) -> int | None:
        if self._collection.count() == 0:
            return None
        got = self._collection.get(limit=1, include=["embeddings"])
        embeddings = got.get("embeddings")
        if embeddings is None or len(embeddings) == 0:
            return None
        return len(embeddings[0])

    @property
    def collection_name(self) -> str:
        """The actual chroma collection name (with the random suffix in ephemeral mode)."""
        return self._name

    @property
    def dim(self) -> int | None:
        """The vector width, once known (first ingest, or read from a persisted collection)."""
        return self._dim

    def __len__(self) -> int:
        return int(self._collection.count())

    def __repr__(self) -> str:
        return f"ChromaBackend(collection={self._name!r}, ephemeral={self._ephemeral}, size={len(self)})"

    def close(self) -> None:
        """Drop the in-memory collection (ephemeral mode only; persisted data is left alone)."""
        if self._ephemeral:
            with contextlib.suppress(Exception):  # already gone: nothing to release
                self._client.delete_collection(self._name)

    def ingest(self, ids: Sequence[str], vectors: NDArray[np.float32]) -> None:
        arr = np.asarray(vectors, dtype=np.float32)
        n = arr.shape[0] if arr.ndim >= 1 else -1
        id_list = _check_ids(ids, n)
        if not id_list:
            return
        with self._lock:
            dim = self._dim
            if dim is None:
                if arr.ndim != 2 or arr.shape[1] == 0:
                    raise EmbeddingError(f"ChromaBackend.ingest: expected a 2-D array, got shape {arr.shape}")
                dim = int(arr.shape[1])
            rows = check_vectors(arr, len(id_list), dim, source="ChromaBackend.ingest")
            for start in range(0, len(id_list), self._batch):
                stop = start + self._batch
                # upsert: re-ingesting an id replaces its vector instead of failing on a duplicate
                self._collection.upsert(ids=id_list[start:stop], embeddings=rows[start:stop])
            self._dim = dim

    def candidates(self, query: NDArray[np.float32], k: int) -> tuple[list[str], NDArray[np.float32]]:
        if not isinstance(k, int | np.integer) or isinstance(k, bool):
            raise UserInputError(f"k must be an integer, got {k!r}")
        with self._lock:
            if self._dim is None:
                return _empty()
            q = _query_row(query, self._dim, "ChromaBackend")
            size = len(self)
            if k <= 0 or size == 0:
                return _empty()
            result = self._collection.query(query_embeddings=q, n_results=min(int(k), size), include=["distances"])
        ids = [str(i) for i in result["ids"][0]]
        distances = np.asarray(result["distances"][0], dtype=np.float32)
        return ids, (1.0 - distances).astype(np.float32)


__all__ = ["ChromaBackend"]
