"""What the public-data retrieval benchmarks (LongMemEval, LoCoMo) share: k values, dates, systems, output.

Both benchmarks build one fresh store per question or sample (:func:`evals.harness.replay.temp_store`),
embed with :func:`evals.harness.embedders.make_embedder`, rank with the systems of
``evals/harness/systems.yaml`` or plain BM25 (:mod:`evals.bench.bm25`), and write ``<base>.json`` + ``<base>.md``.
"""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evals.harness.jsonio import write_json
from evals.harness.systems import System, load_systems

KS = (1, 5, 10)
BM25_NAME = "BM25"
_MONTHS = {
    m: i + 1
    for i, names in enumerate(
        [
            ("jan", "january"),
            ("feb", "february"),
            ("mar", "march"),
            ("apr", "april"),
            ("may",),
            ("jun", "june"),
            ("jul", "july"),
            ("aug", "august"),
            ("sep", "sept", "september"),
            ("oct", "october"),
            ("nov", "november"),
            ("dec", "december"),
        ]
    )
    for m in names
}
_YMD_RE = re.compile(r"(\d{4})\s*[/\-.]\s*(\d{1,2})\s*[/\-.]\s*(\d{1,2})")
_DMY_RE = re.compile(r"(\d{1,2})(?:st|nd|rd|th)?\s+([A-Za-z]{3,9})\.?,?\s+(\d{4})")
_MDY_RE = re.compile(r"([A-Za-z]{3,9})\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})")
_TIME_RE = re.compile(r"(?<![\d/\-])(\d{1,2}):(\d{2})(?::(\d{2}))?\s*([ap]\.?m\.?)?", re.IGNORECASE)


# -- dates ---------------------------------------------------------------------------------------------
def parse_date(value: object) -> datetime | None:
    """Parse the benchmarks' free-text dates to an aware UTC datetime; None when no date is found.

    Handles "2023/05/20 (Sat) 02:21" (LongMemEval), "1:56 pm on 8 May, 2023" (LoCoMo), "May 8, 2023",
    ISO-8601 and epoch seconds. A missing time of day is midnight.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), tz=UTC)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value.strip():
        return None
    s = value.strip()
    with contextlib.suppress(ValueError):
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
        return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    date: tuple[int, int, int] | None = None
    rest = s
    if m := _YMD_RE.search(s):
        date = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        rest = s[: m.start()] + " " + s[m.end() :]
    elif (m := _DMY_RE.search(s)) and m.group(2).lower() in _MONTHS:
        date = (int(m.group(3)), _MONTHS[m.group(2).lower()], int(m.group(1)))
        rest = s[: m.start()] + " " + s[m.end() :]
    elif (m := _MDY_RE.search(s)) and m.group(1).lower() in _MONTHS:
        date = (int(m.group(3)), _MONTHS[m.group(1).lower()], int(m.group(2)))
        rest = s[: m.start()] + " " + s[m.end() :]
    if date is None:
        return None
    hour = minute = second = 0
    if t := _TIME_RE.search(rest):
        hour, minute, second = int(t.group(1)), int(t.group(2)), int(t.group(3) or 0)
        if ampm := t.group(4):
            pm = ampm.lower().startswith("p")
            hour = (hour % 12) + (12 if pm else 0)
        if not (0 <= hour < 24 and 0 <= minute < 60 and 0 <= second < 60):
            hour = minute = second = 0
    try:
        return datetime(date[0], date[1], date[2], hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None


def select_systems(spec: str) -> list[tuple[str, System | None]]:
    """Names from ``--systems`` -> (name, System) pairs; ``BM25`` maps to None (the lexical baseline)."""
    known = load_systems()
    out: list[tuple[str, System | None]] = []
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        if name.upper() == BM25_NAME:
            out.append((BM25_NAME, None))
        elif name in known:
            out.append((name, known[name]))
        else:
            raise SystemExit(f"unknown system {name!r}; known: {', '.join([*known, BM25_NAME])}")
    if not out:
        raise SystemExit("no systems given")
    return out


def write_outputs(result: dict[str, Any], md: str, base: Path, *, quiet: bool) -> None:
    """Write ``<base>.json`` and ``<base>.md`` (shared by the LongMemEval and LoCoMo runners)."""
    base.parent.mkdir(parents=True, exist_ok=True)
    write_json(base.with_suffix(".json"), result, indent=1)
    base.with_suffix(".md").write_text(md, encoding="utf-8")
    if not quiet:
        print(md)
        print(f"wrote {base}.json and {base}.md")
