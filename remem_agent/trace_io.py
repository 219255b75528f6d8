"""Trace files on disk: one line appended under an advisory lock, and a file rewritten without some lines.

Several processes may append to one trace folder (gateway workers each write their own file; a scrub rewrites
any of them), so both take an exclusive ``flock`` on the file they touch (POSIX; elsewhere only the writer's
own thread lock applies). A rewrite writes the kept lines to a temporary file beside it and renames it over
the original, so a crash leaves the old file or the new one, never half of one. A writer that opened the file
before the rename finds, once it holds the lock, that its file is no longer the one at the path, and reopens
it: no line is written into a replaced file.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks between processes
    fcntl = None  # type: ignore[assignment]


@contextmanager
def _locked(fd: int) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


def append_line(path: Path, data: bytes) -> None:
    """Append ``data`` (one whole line) to ``path`` in one write, under the file's lock; a file renamed or
    replaced meanwhile is reopened, so the line lands in the file now at ``path``."""
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            with _locked(fd):
                if not _same_file(fd, path):
                    continue  # replaced or renamed between open and lock: open the new one
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                return
        finally:
            os.close(fd)


def files_of(paths: Iterable[Path]) -> list[Path]:
    """The trace files (``*.jsonl`` and ``*.jsonl.gz``) of ``paths``: files as given, folders' direct
    children."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith((".jsonl", ".jsonl.gz")))
        elif p.is_file():
            out.append(p)
    return out


def remove_lines(path: Path, drop: Callable[[str], bool]) -> int:
    """Rewrite ``path`` (gzip-compressed when its name ends in ``.gz``) without the lines ``drop`` accepts;
    returns how many were removed (0: the file is left as it was)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        with _locked(fd):
            if not _same_file(fd, path):
                return 0  # rotated away meanwhile: the caller's list of files is out of date
            with opener(path, "rt", encoding="utf-8", errors="surrogateescape") as fh:
                lines = fh.readlines()
            kept = [line for line in lines if not drop(line)]
            removed = len(lines) - len(kept)
            if removed:
                tmp = path.with_name(f".{path.name}.{os.getpid()}.scrub")
                try:
                    with opener(tmp, "wt", encoding="utf-8", errors="surrogateescape") as out:
                        out.writelines(kept)
                        out.flush()
                    with open(tmp, "rb") as synced:
                        os.fsync(synced.fileno())
                    os.replace(tmp, path)
                finally:
                    tmp.unlink(missing_ok=True)
            return removed
    finally:
        os.close(fd)
