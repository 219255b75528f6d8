"""What every performance benchmark records beside its timings: latency summaries, commit and machine."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]


def latency_ms(samples_ns: Sequence[int] | Sequence[float]) -> dict[str, float]:
    """Summary of latency samples given in nanoseconds, in milliseconds (rounded to 4 decimals):
    ``n``, ``mean_ms``, ``p50_ms``, ``p95_ms``, ``p99_ms``, ``max_ms`` (only ``n`` when there are none)."""
    a = np.asarray(samples_ns, dtype=np.float64) / 1e6
    if a.size == 0:
        return {"n": 0}
    return {
        "n": int(a.size),
        "mean_ms": round(float(a.mean()), 4),
        "p50_ms": round(float(np.percentile(a, 50)), 4),
        "p95_ms": round(float(np.percentile(a, 95)), 4),
        "p99_ms": round(float(np.percentile(a, 99)), 4),
        "max_ms": round(float(a.max()), 4),
    }


def median_of_repeats(runs: Sequence[Any]) -> Any:
    """One report from several runs of the same measurement: every number is its median over the runs.

    Why: this virtual machine's speed moves by up to 1.5x within minutes, so one run of a benchmark is a draw
    from that drift; the median of an odd number of runs is a value one run measured, and a slow (or fast)
    moment during one run does not decide it. Mappings are merged key by key (keys of the first run), numbers
    (not bools) replaced by their median, and any other value kept when every run has the same, else listed
    per run. Each run's own report should be kept beside the summary.
    """
    first = runs[0]
    if all(isinstance(r, dict) for r in runs):
        return {k: median_of_repeats([r.get(k) for r in runs]) for k in first}
    if all(isinstance(r, int | float) and not isinstance(r, bool) for r in runs):
        mid = statistics.median(runs)
        return round(mid, 4) if isinstance(mid, float) else mid
    if all(r == first for r in runs):
        return first
    return list(runs)


def _git(*args: str) -> str | None:
    """stdout of ``git ARGS`` in the repository, or None when git is missing or fails."""
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=REPO_ROOT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit() -> str | None:
    """The commit the numbers were measured at (HEAD), or None outside a git checkout."""
    return (_git("rev-parse", "HEAD") or "").strip() or None


def git_dirty() -> list[str] | None:
    """Tracked files with uncommitted changes (the numbers describe the working tree, not HEAD)."""
    out = _git("status", "--porcelain", "--untracked-files=no")
    if out is None:
        return None
    return [line[3:] for line in out.splitlines() if line.strip()]


def loadavg() -> list[float] | None:
    """1/5/15-minute load averages: other processes on a 2-core box distort latencies."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def blas_info() -> list[dict[str, Any]] | None:
    """BLAS libraries and their thread counts (needs the optional ``threadpoolctl``)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    return [
        {k: d.get(k) for k in ("internal_api", "version", "num_threads", "threading_layer")}
        for d in threadpool_info()
        if d.get("user_api") == "blas"
    ]


def machine_facts() -> dict[str, Any]:
    """CPU count and affinity, Python, numpy, SQLite, platform, thread environment and BLAS of this machine."""
    import sqlite3

    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "numpy": np.__version__,
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "thread_env": {
            v: os.environ[v] for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS") if v in os.environ
        },
        "blas": blas_info(),
    }


def provenance(load_start: list[float] | None, started: float) -> dict[str, Any]:
    """What a benchmark's report records about the run beside its numbers: the commit and any uncommitted
    files, the machine, the load average at the start (``load_start``) and now, and the wall time since
    ``started`` (a ``time.perf_counter()`` reading)."""
    import time

    return {
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "machine": machine_facts(),
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
