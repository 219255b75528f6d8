"""Fact notes of a benchmark conversation's sessions: a chat model's, extracted once and kept on disk, or LoCoMo's own.

``CachedExtractor`` wraps any :class:`~remem_agent.ingest.FactExtractor` (``LLMFactExtractor`` in the runs) for
``ReMem.add_conversation(..., extractor=, turns=True)``: the facts of each session transcript are appended to a
JSONL file keyed by the transcript's hash, so a resumed run extracts nothing twice and every arm reads the same
facts. A session whose reply stays invalid after the extractor's re-asks is recorded with no facts and its error,
and counted (a benchmark run goes on; the library raises ``OutputValidationError`` to its caller). The file holds
text derived from the conversations: it stays in the work folder and is never committed.

``observation_facts`` gives the facts LoCoMo ships with each conversation (written by a large model, each citing its
turns): fact notes from a capable extractor, the upper bound of what capture at ingest can add.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from evals.bench.run_locomo import normalise_dia_ids
from remem_agent.errors import OutputValidationError
from remem_agent.ingest import FactExtractor
from remem_agent.memory import ReMem
from remem_agent.validate import MemoryInput

_FIELDS = ("text", "role", "entity", "attribute")


def transcript_key(transcript: str) -> str:
    return hashlib.sha256(transcript.encode()).hexdigest()[:20]


@dataclass(frozen=True, kw_only=True)
class ExtractionStats:
    sessions: int
    failed: int
    facts: int
    seconds_p50: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"sessions": self.sessions, "failed": self.failed, "facts": self.facts, "seconds_p50": self.seconds_p50}


class CachedExtractor:
    """A ``FactExtractor`` that asks ``inner`` once per distinct transcript and remembers the answer in ``path``."""

    def __init__(self, inner: FactExtractor, path: Path) -> None:
        self.inner = inner
        self.path = path
        self._rows: dict[str, dict[str, Any]] = {}
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    row = json.loads(line)
                    self._rows[row["key"]] = row

    def extract(self, transcript: str) -> list[MemoryInput]:
        key = transcript_key(transcript)
        row = self._rows.get(key)
        if row is None:
            row = self._ask(key, transcript)
        return [
            MemoryInput(f["text"], role=f["role"], entity=f.get("entity"), attribute=f.get("attribute"))
            for f in row["facts"]
        ]

    def _ask(self, key: str, transcript: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        error = None
        facts: Sequence[MemoryInput] = []
        try:
            facts = self.inner.extract(transcript)
        except OutputValidationError as exc:
            error = str(exc)[:300]
        row = {
            "key": key,
            "facts": [{name: getattr(f, name) for name in _FIELDS} for f in facts],
            "error": error,
            "seconds": round(time.perf_counter() - t0, 2),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._rows[key] = row
        return row

    def stats(self) -> ExtractionStats:
        """Counts over every session in the file (one file per data set, model and extraction fingerprint)."""
        rows = list(self._rows.values())
        secs = sorted(float(r["seconds"]) for r in rows)
        return ExtractionStats(
            sessions=len(rows),
            failed=sum(1 for r in rows if r.get("error")),
            facts=sum(len(r["facts"]) for r in rows),
            seconds_p50=round(secs[len(secs) // 2], 2) if secs else None,
        )


def observation_facts(
    sample: Mapping[str, Any], turns: Sequence[Mapping[str, Any]]
) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
    """LoCoMo's own facts of a conversation (``observation``: per session and speaker, short sentences a large model
    wrote, each citing the turns it comes from): each as an ``add_many`` item (a ``note`` with its speaker and
    session, stamped with the session's last turn, as ``add_conversation`` stamps extracted facts) and the dia ids
    it cites among ``turns``. Sessions without turns are left out."""
    last: dict[str, datetime] = {}
    for t in turns:
        last[t["session"]] = max(last.get(t["session"], t["t"]), t["t"])
    known = {t["dia"] for t in turns}
    out: list[tuple[dict[str, Any], tuple[str, ...]]] = []
    observations = sample.get("observation") or {}
    for key in sorted(observations, key=lambda k: int(re.sub(r"\D", "", k) or 0)):
        session = key.removesuffix("_observation")
        if session not in last:
            continue
        for speaker, items in (observations[key] or {}).items():
            for item in items or []:
                text = str(item[0]).strip() if item else ""
                if not text:
                    continue
                cited = tuple(d for d in normalise_dia_ids(item[1] if len(item) > 1 else None) if d in known)
                fact = {
                    "text": text,
                    "role": "note",
                    "timestamp": last[session],
                    "speaker": speaker,
                    "session": session,
                }
                out.append((fact, cited))
    return out


def store_facts(
    mem: ReMem, facts: Sequence[tuple[dict[str, Any], tuple[str, ...]]], dias: dict[str, set[str]]
) -> set[str]:
    """Add ``facts`` (``observation_facts``) in one write; each new id stands in ``dias`` for the turns its fact
    cites. Returns the facts' ids."""
    ids = mem.add_many([fact for fact, _ in facts]) if facts else []
    for mid, (_, cited) in zip(ids, facts, strict=True):
        dias.setdefault(mid, set()).update(cited)
    return set(ids)
