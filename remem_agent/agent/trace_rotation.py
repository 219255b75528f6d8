"""Trace files that rotate by size and age, with a cap on what the archives take in all.

A long-running writer (the gateway) would otherwise grow one JSONL file forever. With a
:class:`TraceRotation`, :class:`~remem_agent.agent.trace.TraceWriter` closes its file once it holds
``max_bytes`` (or is older than ``max_age_s``) and moves it aside as an archive named
``<stem>.<UTC time>.jsonl.gz`` beside it: renamed under the writer's lock (the next line starts a new file),
then compressed outside it. After each rotation the archives of that folder are trimmed, oldest first, until
they take at most ``keep_bytes`` in all and none is older than ``keep_days``. The live files are never
trimmed. Archives read like any trace (``iter_traces`` and ``trace_files`` open ``.jsonl.gz``).
"""

from __future__ import annotations

import gzip
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from remem_agent.errors import UserInputError

ARCHIVE = re.compile(r"^(?P<stem>.+)\.(?P<stamp>\d{8}T\d{12}Z)\.jsonl\.gz$")
_STAMP = "%Y%m%dT%H%M%S%fZ"


@dataclass(frozen=True, kw_only=True)
class TraceRotation:
    """When a trace file is archived, and how many archives are kept (``None``: no limit of that kind)."""

    max_bytes: int | None = 64 * 1024 * 1024  # a live file is archived once it holds this much
    max_age_s: float | None = 86_400.0  # ... or once it was started this long ago
    keep_bytes: int | None = 1024 * 1024 * 1024  # the archives of the folder take at most this much in all
    keep_days: float | None = 30.0  # archives older than this are deleted

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_age_s", "keep_bytes", "keep_days"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise UserInputError(f"trace rotation: {name} must be a positive number or None, got {value!r}")
        for name in ("max_bytes", "keep_bytes"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), int):
                raise UserInputError(f"trace rotation: {name} must be a whole number of bytes")


def archive_name(live: Path, at: float) -> Path:
    """The archive a live file becomes when it rotates at ``at`` (before compression: no ``.gz`` yet)."""
    stamp = datetime.fromtimestamp(at, UTC).strftime(_STAMP)
    return live.with_name(f"{live.name.removesuffix('.jsonl')}.{stamp}.jsonl")


def compress(path: Path) -> Path:
    """``path`` gzip-compressed beside it as ``path.gz`` (written to a temporary name, then renamed, so a
    reader never sees half an archive); the uncompressed file is removed."""
    target = Path(f"{path}.gz")
    partial = Path(f"{target}.partial")
    with path.open("rb") as src, gzip.open(partial, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(partial, target)
    path.unlink()
    return target


def archives(folder: Path) -> list[tuple[float, Path]]:
    """The rotated archives of ``folder`` with the time each was rotated, oldest first."""
    out = []
    for f in folder.glob("*.jsonl.gz"):
        m = ARCHIVE.match(f.name)
        if m:
            at = datetime.strptime(m["stamp"], _STAMP).replace(tzinfo=UTC).timestamp()
            out.append((at, f))
    return sorted(out)


def trim(folder: Path, rotation: TraceRotation, *, now: float | None = None) -> list[Path]:
    """Delete the oldest archives of ``folder`` until the rest fit ``keep_bytes`` and ``keep_days``; what
    was deleted. An archive another process deleted first is skipped."""
    now = time.time() if now is None else now
    held = []
    for at, f in archives(folder):
        try:
            held.append((at, f, f.stat().st_size))
        except FileNotFoundError:
            continue
    total = sum(size for _, _, size in held)
    deleted = []
    for at, f, size in held:
        too_old = rotation.keep_days is not None and now - at > rotation.keep_days * 86_400.0
        too_big = rotation.keep_bytes is not None and total > rotation.keep_bytes
        if not (too_old or too_big):
            break
        f.unlink(missing_ok=True)
        total -= size
        deleted.append(f)
    return deleted
