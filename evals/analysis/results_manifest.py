"""The manifest of ``results/README.md``: every committed result file, by folder, with what wrote it.

The manifest sits between two marker lines of ``results/README.md``; this module renders it from the files
``git`` tracks under ``results/`` (and, for a JSON file, its own ``command`` or ``benchmark`` field), and a test
checks that the committed README holds exactly that, so the manifest cannot go stale.

    python -m evals.analysis.results_manifest            # rewrite the manifest in results/README.md
    python -m evals.analysis.results_manifest --check    # exit 1 when it is out of date
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "results" / "README.md"
BEGIN = "<!-- manifest: python -m evals.analysis.results_manifest -->"
END = "<!-- end of manifest -->"


def committed_results(root: Path = ROOT) -> list[str]:
    """Every file git tracks under ``results/`` (its README excluded), repository-relative, sorted."""
    out = subprocess.run(["git", "ls-files", "results"], cwd=root, capture_output=True, text=True, check=True)
    return sorted(p for p in out.stdout.splitlines() if p and p != "results/README.md")


def _origin(path: Path) -> str:
    """What a JSON result says produced it (its ``command`` or ``meta.command``, else its ``benchmark`` name), or
    ""."""
    if path.suffix != ".json" or path.stat().st_size > 5_000_000:
        return ""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return ""
    if not isinstance(data, dict):
        return ""
    meta = data.get("meta")
    command = data.get("command") or (meta.get("command") if isinstance(meta, dict) else None)
    if isinstance(command, str) and command:
        return f"`{command}`" if len(command) <= 160 else f"`{command[:157]}...`"
    bench = data.get("benchmark")
    return f"benchmark `{bench}`" if isinstance(bench, str) else ""


def render(root: Path = ROOT) -> str:
    """The manifest block (markers included)."""
    by_folder: dict[str, list[str]] = defaultdict(list)
    for rel in committed_results(root):
        parts = rel.split("/")
        by_folder["/".join(parts[:2]) if len(parts) > 2 else "results"].append(rel)
    lines = [BEGIN, ""]
    for folder in sorted(by_folder):
        files = by_folder[folder]
        lines.append(f"### `{folder}/` ({len(files)} files)" if folder != "results" else "### `results/`")
        lines.append("")
        for rel in files:
            origin = _origin(root / rel)
            lines.append(f"- `{rel}`" + (f": {origin}" if origin else ""))
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def updated(text: str, block: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    if not sep:
        raise SystemExit(f"{README} has no manifest marker {BEGIN!r}")
    _, sep2, tail = rest.partition(END)
    if not sep2:
        raise SystemExit(f"{README} has no end marker {END!r}")
    return head + block + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check; exit 1 when the manifest is out of date")
    args = ap.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    new = updated(text, render())
    if args.check:
        if new != text:
            print(f"{README} is out of date: python -m evals.analysis.results_manifest")
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
