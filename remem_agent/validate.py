"""Boundary checks: every argument the library takes from a caller is checked here before anything is written.

A leaf module: it imports nothing of the ledger, so the agent, the gateway, MCP, the dashboard and the CLI
check their input with the same rules without pulling the store in. ``ingest.py`` writes what passes.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from remem_agent._time import Timestamp, shown, to_epoch
from remem_agent._time import now as wall_now
from remem_agent.errors import UserInputError
from remem_agent.types import DEFAULT_SCOPE, ROLES, Role

_TASK_RE = re.compile(r"^[^\s*][^\n]{0,127}$")
_FIELDS = frozenset(
    {"text", "entity", "attribute", "role", "task", "timestamp", "confidence", "scope", "speaker", "session"}
)


@dataclass(frozen=True)
class MemoryInput:
    """One fact to add (``add_many`` also accepts plain dicts with these keys, or strings)."""

    text: str
    entity: str | None = None
    attribute: str | None = None
    role: Role = "state"
    task: str | Sequence[str] | None = None
    timestamp: Timestamp | None = None
    confidence: float = 1.0
    scope: str | None = None  # None: the caller's default scope (``add_many(..., scope=)``, else "default")
    speaker: str | None = None  # who said it (a conversation turn); stored, hashed, never changed
    session: str | None = None  # the conversation session it came from (an id or a date)


# Documented maxima of the boundary checks (docs/concepts.md "Errors"). Integers are bounded by what every
# backend column holds (PostgreSQL ``integer``); texts by what a memory, a prompt and a ledger row can hold.
MAX_INT = 2**31 - 1
MAX_TEXT_CHARS = 1_000_000
MAX_KEY_CHARS = 1_000
MAX_LABEL_CHARS = 256  # speaker and session: names and ids, not text


def _check_storable(text: str, what: str) -> None:
    """Refuse strings the ledger cannot store: NUL (PostgreSQL text cannot hold it) and anything that is
    not encodable as UTF-8 (lone surrogates such as ``"\\ud800"``, e.g. from a broken JSON decoder)."""
    if "\x00" in text:
        raise UserInputError(f"{what} must not contain NUL characters")
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise UserInputError(
            f"{what} is not valid Unicode text: {bad!r} at position {exc.start} is a lone surrogate, "
            "which cannot be stored as UTF-8 (decode the input with errors='replace', or fix the source)"
        ) from None


def check_text(text: object, what: str = "text", *, max_chars: int = MAX_TEXT_CHARS) -> str:
    """A non-empty, storable string of at most ``max_chars`` characters, stripped."""
    if not isinstance(text, str):
        raise UserInputError(f"{what} must be a string, got {type(text).__name__}")
    if len(text) > max_chars:
        raise UserInputError(f"{what} is too long: {len(text)} characters (at most {max_chars})")
    _check_storable(text, what)
    if not text.strip():
        raise UserInputError(f"{what} must not be empty")
    return text.strip()


def normalise_key(value: str) -> str:
    """Entity/attribute keys compare case- and space-insensitively ("Server " == "server")."""
    return " ".join(unicodedata.normalize("NFKC", value).split()).casefold()


def check_key(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UserInputError(f"{what} must be a non-empty string or None")
    if len(value) > MAX_KEY_CHARS:
        raise UserInputError(f"{what} is too long: {len(value)} characters (at most {MAX_KEY_CHARS})")
    _check_storable(value, what)
    return normalise_key(value)


def check_label(value: object, what: str) -> str | None:
    """``speaker`` / ``session``: None, or one non-empty line of at most ``MAX_LABEL_CHARS`` characters
    (stripped). Control characters are refused because the label is rendered into prompts."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise UserInputError(f"{what} must be a string or None, got {type(value).__name__}")
    if len(value) > MAX_LABEL_CHARS:
        raise UserInputError(f"{what} is too long: {len(value)} characters (at most {MAX_LABEL_CHARS})")
    _check_storable(value, what)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value if ch not in " \t"):
        raise UserInputError(f"{what} must be a single line without control characters, got {value!r:.80}")
    value = value.strip()
    if not value:
        raise UserInputError(f"{what} must not be empty (use None for none)")
    return value


def check_task(task: object) -> str | None:
    if task is None:
        return None
    if not isinstance(task, str) or not _TASK_RE.match(task.strip()):
        raise UserInputError("task must be a non-empty single-line string (at most 128 chars, not '*')")
    _check_storable(task, "task")
    return task.strip()


def check_tasks(task: object) -> tuple[str, ...]:
    if task is None:
        return ()
    if isinstance(task, str):
        return (t,) if (t := check_task(task)) else ()
    if isinstance(task, Iterable) and not isinstance(task, bytes | bytearray | Mapping):
        out = []
        for t in task:
            ct = check_task(t)
            if ct and ct not in out:
                out.append(ct)
        return tuple(out)
    raise UserInputError("task must be a string or a list of strings")


def check_ids(ids: object, what: str) -> list[str]:
    if ids is None:
        return []
    if isinstance(ids, str | bytes | bytearray | Mapping) or not isinstance(ids, Iterable):
        raise UserInputError(f"{what} must be a list of memory ids")
    out = []
    for i in ids:
        if not isinstance(i, str):
            raise UserInputError(f"{what} must contain strings, got {type(i).__name__}")
        _check_storable(i, what)
        if i not in out:
            out.append(i)
    return out


def check_int(value: object, what: str, *, minimum: int, maximum: int = MAX_INT) -> int:
    """An int (not a bool) in ``[minimum, maximum]``; the default maximum is ``MAX_INT`` (2**31 - 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise UserInputError(f"{what} must be an integer in [{minimum}, {maximum}], got {shown(value)}")
    return int(value)


def check_fraction(value: object, what: str, *, low_open: bool = False) -> float:
    """A finite real number (not a bool) in [0, 1], or (0, 1] with ``low_open``. Ints are compared before
    ``float()``, so a huge one is refused instead of overflowing."""
    f = math.nan
    if isinstance(value, int) and not isinstance(value, bool):
        f = float(value) if -1 <= value <= 1 else math.nan
    elif isinstance(value, float):
        f = value
    ok = f > 0.0 if low_open else f >= 0.0  # False for NaN
    if not (ok and f <= 1.0):
        span = "(0, 1]" if low_open else "[0, 1]"
        raise UserInputError(f"{what} must be a number in {span}, got {shown(value)}")
    return float(f)


def check_weight(weight: object) -> float:
    """``feedback(weight=)``: a number in (0, 1]."""
    return check_fraction(weight, "weight", low_open=True)


def check_items(items: object) -> list[Any]:
    """``add_many``'s argument as a list: a list/tuple or other iterable of items, but not a single item
    (a string would store one memory per character, a dict one memory per key)."""
    if isinstance(items, str | bytes | bytearray | Mapping | MemoryInput):
        raise UserInputError(
            f"add_many takes a list of facts, got a single {type(items).__name__}; use add() or wrap it in a list"
        )
    if isinstance(items, AbstractSet):
        raise UserInputError("add_many takes a list of facts, got a set: facts are stored in order, a set has none")
    if not isinstance(items, Iterable):
        raise UserInputError(f"add_many takes a list of facts (MemoryInput, dict or str), got {type(items).__name__}")
    return list(items)


@dataclass(frozen=True)
class CleanFact:
    """A validated fact, ready to embed and insert."""

    text: str
    entity: str | None
    attribute: str | None
    role: Role
    tasks: tuple[str, ...]
    t: float
    confidence: float
    explicit_time: bool = False  # the caller passed ``timestamp`` (not defaulted to "now")
    scope: str = DEFAULT_SCOPE
    speaker: str | None = None
    session: str | None = None


_SCOPE = re.compile(r"[A-Za-z0-9_.:@/=+-]{1,128}")


def check_scope(value: object, what: str = "scope") -> str:
    """A scope name: 1-128 characters of letters, digits and ``_ . : @ / = + -`` (``user:alice/agent:ops``)."""
    if value is None:
        return DEFAULT_SCOPE
    if not isinstance(value, str) or not _SCOPE.fullmatch(value):
        raise UserInputError(
            f"{what} must be 1-128 characters of letters, digits and _ . : @ / = + - (like 'user:alice'), "
            f"got {value!r:.80}"
        )
    return value


def validate_fact(item: MemoryInput | Mapping[str, Any] | str, pos: int = 0, *, scope: str | None = None) -> CleanFact:
    """Check one fact of ``add``/``add_many``; raises UserInputError naming the item.

    ``scope`` is the call's scope; an item naming its own scope must name the same one (a batch is one scope's).
    """
    if isinstance(item, str):
        item = MemoryInput(item)
    elif isinstance(item, Mapping):
        unknown = set(item) - _FIELDS
        if unknown:
            raise UserInputError(f"item {pos}: unknown fields {sorted(unknown, key=repr)}")
        if "text" not in item:
            raise UserInputError(f"item {pos}: missing 'text'")
        item = MemoryInput(**item)
    elif not isinstance(item, MemoryInput):
        raise UserInputError(f"item {pos}: expected MemoryInput, dict or str, got {type(item).__name__}")
    text = check_text(item.text)
    if not isinstance(item.role, str) or item.role not in ROLES:
        raise UserInputError(f"role must be one of {ROLES}, got {item.role!r}")
    confidence = check_fraction(item.confidence, "confidence")
    t = to_epoch(item.timestamp, name="timestamp", default=wall_now())
    assert t is not None
    own = check_scope(item.scope) if item.scope is not None else None
    if own is not None and scope is not None and own != scope:
        raise UserInputError(f"item {pos}: scope {own!r} differs from the call's scope {scope!r}")
    return CleanFact(
        text=text,
        entity=check_key(item.entity, "entity"),
        attribute=check_key(item.attribute, "attribute"),
        role=item.role,
        tasks=check_tasks(item.task),
        t=t,
        confidence=confidence,
        explicit_time=item.timestamp is not None,
        scope=own or scope or DEFAULT_SCOPE,
        speaker=check_label(item.speaker, "speaker"),
        session=check_label(item.session, "session"),
    )


def validate_facts(items: object, *, scope: str | None = None) -> list[CleanFact]:
    """Check ``add_many``'s whole argument (see ``check_items``) and every fact in it."""
    return [validate_fact(it, i, scope=scope) for i, it in enumerate(check_items(items))]
