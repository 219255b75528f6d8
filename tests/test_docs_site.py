"""The documentation site builds with ``mkdocs build --strict`` (mkdocs.yml): every page in the nav, every link
between pages and every anchor resolves, and no page of docs/ is left out of the nav."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _nav_pages() -> set[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    return {page for item in config["nav"] for page in item.values()}


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "site" / "gateway" / "index.html").is_file()


def test_every_page_is_in_the_nav_and_the_readme_links_each_one() -> None:
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert _nav_pages() == pages
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", readme))
    assert linked == pages - {"index.md"}
    assert len(readme.splitlines()) <= 250
