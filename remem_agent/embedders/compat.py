"""Which embedders may open a store built by another: declared vector families.

A store records the name and dimension of the embedder that built it, and by default only that
embedder may open it again: vectors from two models are not comparable, and mixing them silently ruins
every later search. Two embedders of one *family* are the exception: the same model with the same
pooling and normalisation, run by different engines, whose vectors a parity test in CI shows to agree
(cosine >= 0.999 per sentence on tests/fixtures/minilm_parity.json). A store built by one member opens with
any other member of the same dimension; the name it recorded stays as it was.

The rule: ``stored == current`` by name and dimension, or both names are listed in :data:`VECTOR_FAMILIES`
under the same family and the dimensions agree. Nothing else is compatible (a hash store never opens
with a real model, nor the reverse). A family is only added here together with its parity test.
"""

from __future__ import annotations

from types import MappingProxyType

from remem_agent.embedders.base import Embedder
from remem_agent.embedders.onnx import ONNX_MINILM_NAME

MINILM_FAMILY = "all-MiniLM-L6-v2/mean-pool/l2"

VECTOR_FAMILIES: MappingProxyType[str, str] = MappingProxyType(
    {
        "st:all-MiniLM-L6-v2": MINILM_FAMILY,  # sentence-transformers (torch), fp32
        ONNX_MINILM_NAME: MINILM_FAMILY,  # onnxruntime, int8 (tests/embedders/test_embedder_onnx.py: parity)
    }
)
"""Embedder name -> vector family, for the embedders whose vectors are parity-tested to agree."""


def vector_family(name: str) -> str | None:
    """The declared family of the embedder called ``name``, or None when it has none."""
    return VECTOR_FAMILIES.get(name)


def vectors_compatible(stored_name: str, stored_dim: int, embedder: Embedder) -> bool:
    """True when ``embedder`` may open a store whose vectors came from ``stored_name`` (``stored_dim`` wide)."""
    if stored_dim != embedder.dim:
        return False
    if stored_name == embedder.name:
        return True
    family = vector_family(stored_name)
    return family is not None and family == vector_family(embedder.name)


__all__ = ["MINILM_FAMILY", "VECTOR_FAMILIES", "vector_family", "vectors_compatible"]
