"""Every ``python -m evals.X`` command in README.md and docs/ names a module that exists and whose ``--help`` works."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMAND = re.compile(r"python -m (evals(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def readme_modules() -> list[str]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return sorted({m for doc in docs for m in COMMAND.findall(doc.read_text(encoding="utf-8"))})


def _source(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__main__.py"):
        if path.is_file():
            return path
    return None


def test_readme_has_evals_commands() -> None:
    assert len(readme_modules()) >= 5


@pytest.mark.parametrize("module", readme_modules())
def test_readme_module_exists(module: str) -> None:
    assert _source(module) is not None, f"README runs `python -m {module}`, but there is no such module"


def test_readme_modules_answer_help() -> None:
    """``--help`` of each distinct module exits 0 (two at a time: a help run is mostly import time)."""

    def help_of(module: str) -> tuple[str, int, str]:
        proc = subprocess.run(
            [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        return module, proc.returncode, proc.stderr[-2000:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(help_of, readme_modules()))
    failed = [(m, rc, err) for m, rc, err in results if rc != 0]
    assert failed == [], failed
