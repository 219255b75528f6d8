"""Run a script of examples/ the way a user would (fresh process, own HOME, no network)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, env_extra: dict[str, str], tmp_path: Path, *args: str) -> str:
    """Run ``examples/<name>``; asserts exit 0 (showing stderr otherwise) and returns stdout."""
    env = {**os.environ, "HOME": str(tmp_path), **env_extra}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
