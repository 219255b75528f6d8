"""Supersession at ingest: when a new fact replaces an old one.

The library rule (reference design §6, "Library supersession rule"): two role-``state`` facts with
the same (entity, attribute) key replace each other; ``preference`` and ``note`` never supersede.
Wording is still read, for two reasons: explicit update wording ("moved to", "no longer",
"migrated") is recorded as evidence of the supersession, and wording that reads like an *additional*
value ("also uses Memcached") triggers a UserWarning, because storing a multi-valued attribute as
``state`` silently retires the earlier values.
"""

from __future__ import annotations

import re
import unicodedata

_UPDATE_PATTERNS = [
    r"\bmoved (?:to|from|over)\b",
    r"\bno longer\b",
    r"\bnot any ?more\b",
    r"\bmigrat(?:ed|ing|ion)\b",
    r"\bswitched (?:to|from|over)\b",
    r"\bchanged (?:to|from)\b",
    r"\bupdated to\b",
    r"\breplaced (?:by|with)\b",
    r"\binstead of\b",
    r"\bnow (?:is|uses|lives|runs|on|in|at|owned|handled)\b",
    r"\brelocated\b",
    r"\brenamed\b",
    r"\bformerly\b",
    r"\bpreviously\b",
    r"\bas of (?:today|now)\b",
]
_ADDITIVE_PATTERNS = [
    r"\balso\b",
    r"\bas well\b",
    r"\bin addition\b",
    r"\badditionally\b",
    r"\banother\b",
    r"\btoo\s*[.!]?\s*$",
    r"\bbesides\b",
    r"\balongside\b",
]
_UPDATE_RE = re.compile("|".join(_UPDATE_PATTERNS), re.IGNORECASE)
_ADDITIVE_RE = re.compile("|".join(_ADDITIVE_PATTERNS), re.IGNORECASE)


def update_wording(text: str) -> str | None:
    """The explicit update phrase in ``text`` ("moved to", "no longer", ...), if any."""
    m = _UPDATE_RE.search(text)
    return m.group(0).lower() if m else None


def additive_wording(text: str) -> str | None:
    """A phrase suggesting an additional value rather than a replacement ("also", ...)."""
    if update_wording(text):
        return None
    m = _ADDITIVE_RE.search(text)
    return m.group(0).strip().lower() if m else None


def normalise(text: str) -> str:
    """Text compared for restatements: NFKC, case-folded, whitespace and end punctuation folded."""
    t = unicodedata.normalize("NFKC", text).casefold()
    t = re.sub(r"\s+", " ", t).strip()
    return t.rstrip(" .!;")


def normalise_key(value: str) -> str:
    """Entity/attribute keys compare case- and space-insensitively ("Server " == "server")."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", value)).strip().casefold()
