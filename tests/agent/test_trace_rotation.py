"""Trace files rotate by size and age, archives are compressed, trimmed by total size and age, and read back."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest

from remem_agent.agent.trace import TraceWriter, trace_files
from remem_agent.agent.trace_rotation import ARCHIVE, TraceRotation, archive_name, archives, trim
from remem_agent.errors import UserInputError


def _line(n: int) -> dict[str, object]:
    return {"kind": "capture", "v": 2, "n": n, "pad": "x" * 200}


def test_a_full_file_is_archived_compressed_and_every_line_kept(tmp_path: Path) -> None:
    rot = TraceRotation(max_bytes=2_000, max_age_s=None, keep_bytes=None, keep_days=None)
    w = TraceWriter(tmp_path / "gateway-1.jsonl", rotation=rot)
    for n in range(40):
        w.write_sync(_line(n))
    held = archives(tmp_path)
    assert len(held) >= 3 and all(ARCHIVE.match(f.name) for _, f in held)
    assert not list(tmp_path.glob("*.partial")) and not [
        f for f in tmp_path.glob("*.*.jsonl") if ARCHIVE.match(f"{f.name}.gz")
    ]
    assert (tmp_path / "gateway-1.jsonl").stat().st_size < 2_000 + 300  # the live file restarted
    lines = [json_n for f in trace_files(tmp_path) for json_n in _ns(f)]
    assert sorted(lines) == list(range(40))  # nothing lost across rotations
    for _, f in held:
        with gzip.open(f, "rt") as fh:
            assert fh.read().endswith("\n")


def _ns(path: Path) -> list[int]:
    return [int(rec["n"]) for rec in _records(path)]


def _records(path: Path) -> list[dict[str, object]]:
    import json

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:  # type: ignore[operator]
        return [json.loads(x) for x in fh if x.strip()]


def test_archives_are_trimmed_to_the_total_cap_oldest_first(tmp_path: Path) -> None:
    rot = TraceRotation(max_bytes=1_000, max_age_s=None, keep_bytes=1_500, keep_days=None)
    w = TraceWriter(tmp_path / "t.jsonl", rotation=rot)
    for n in range(200):
        w.write_sync(_line(n))
    held = archives(tmp_path)
    assert held and sum(f.stat().st_size for _, f in held) <= 1_500
    kept = sorted(n for _, f in held for n in _ns(f))
    assert kept and max(kept) > 150  # the newest archives are the ones kept
    assert min(kept) > 0  # the oldest went first


def test_archives_older_than_keep_days_are_deleted_and_others_kept(tmp_path: Path) -> None:
    now = time.time()
    old = archive_name(tmp_path / "a.jsonl", now - 10 * 86_400)
    new = archive_name(tmp_path / "b.jsonl", now - 1 * 86_400)
    for f in (old, new):
        with gzip.open(f"{f}.gz", "wt") as fh:
            fh.write("{}\n")
    (tmp_path / "c.jsonl").write_text("{}\n")  # a live file: never trimmed
    (tmp_path / "notes.jsonl.gz").write_bytes(b"")  # not an archive of ours: never trimmed
    deleted = trim(tmp_path, TraceRotation(keep_days=5, keep_bytes=None), now=now)
    assert [p.name for p in deleted] == [f"{old.name}.gz"]
    assert {p.name for p in tmp_path.iterdir()} == {f"{new.name}.gz", "c.jsonl", "notes.jsonl.gz"}


def test_an_old_live_file_rotates_by_age(tmp_path: Path) -> None:
    live = tmp_path / "t.jsonl"
    live.write_text('{"kind": "capture", "v": 2, "n": -1}\n')
    two_days_ago = time.time() - 2 * 86_400
    os.utime(live, (two_days_ago, two_days_ago))
    w = TraceWriter(live, rotation=TraceRotation(max_bytes=None, max_age_s=86_400))
    w.write_sync(_line(0))  # the file was started two days ago: this line closes it
    assert len(archives(tmp_path)) == 1 and not live.exists()
    w.write_sync(_line(1))
    assert _ns(live) == [1]


def test_without_rotation_the_file_only_grows(tmp_path: Path) -> None:
    w = TraceWriter(tmp_path / "t.jsonl")
    for n in range(50):
        w.write_sync(_line(n))
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]
    assert _ns(tmp_path / "t.jsonl") == list(range(50))


@pytest.mark.parametrize(
    "kwargs",
    [{"max_bytes": 0}, {"max_bytes": -5}, {"keep_days": float("nan")}, {"max_age_s": True}, {"keep_bytes": 10.5}],
)
def test_bad_rotation_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(UserInputError):
        TraceRotation(**kwargs)  # type: ignore[arg-type]
