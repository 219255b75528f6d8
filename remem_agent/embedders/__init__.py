"""Embedders: text -> unit vectors. Optional ones load lazily so a missing extra only matters when used."""

from __future__ import annotations

from typing import Any

from remem_agent.embedders.base import Embedder, check_vectors
from remem_agent.embedders.hash_embedder import ConceptHashEmbedder

__all__ = [
    "ConceptHashEmbedder",
    "Embedder",
    "OnnxEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "check_vectors",
    "make_embedder",
]


def __getattr__(name: str) -> Any:
    if name == "SentenceTransformerEmbedder":
        from remem_agent.embedders.sentence_transformers import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder
    if name == "OnnxEmbedder":
        from remem_agent.embedders.onnx import OnnxEmbedder

        return OnnxEmbedder
    if name == "make_embedder":
        from remem_agent.embedders.registry import make_embedder

        return make_embedder
    if name == "OpenAIEmbedder":
        from remem_agent.embedders.openai_compat import OpenAIEmbedder

        return OpenAIEmbedder
    raise AttributeError(name)
