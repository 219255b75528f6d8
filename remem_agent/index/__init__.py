"""Index backends (candidate generation). FAISS and Chroma load lazily (extras ``faiss``, ``chroma``)."""

from __future__ import annotations

from typing import Any

from remem_agent.index.base import IndexBackend
from remem_agent.index.flat import FlatIndex

__all__ = ["ChromaBackend", "FaissBackend", "FlatIndex", "IndexBackend"]


def __getattr__(name: str) -> Any:
    if name == "FaissBackend":
        from remem_agent.index.faiss_backend import FaissBackend

        return FaissBackend
    if name == "ChromaBackend":
        from remem_agent.index.chroma_backend import ChromaBackend

        return ChromaBackend
    raise AttributeError(name)
