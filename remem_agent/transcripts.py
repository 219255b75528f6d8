"""Conversations as input: speaker-attributed, timestamped turns from the common transcript shapes.

``ReMem.add_conversation`` accepts, and this module normalises to a list of :class:`Turn`:

* OpenAI messages: ``[{"role": "user", "content": "...", "name"?: ..., "timestamp"?: ...}, ...]``, the content
  a string or a list of parts (the text parts are joined; images, audio and files are not text). Messages that
  say nothing are skipped: an assistant message that only calls tools (``tool_calls`` / ``function_call``,
  no text) and one whose parts hold no text. Tool results (role ``tool`` / ``function``) are the tool's
  data, not something said in the conversation, and are skipped too: store what matters of them with
  ``ReMem.add``. An assistant ``refusal`` counts as its text;
* LoCoMo: one sample's ``conversation`` mapping (``speaker_a``, ``speaker_b``, ``session_<n>`` lists of
  ``{speaker, dia_id, text}`` and ``session_<n>_date_time`` like "1:56 pm on 8 May, 2023"), or the whole
  sample (a mapping with a ``conversation`` key);
* LongMemEval: one entry's ``haystack_sessions`` (lists of ``{role, content}``) with ``haystack_dates``
  ("2023/05/20 (Sat) 02:21") and ``haystack_session_ids``;
* a list of turns ``{speaker | role | name, text | content, timestamp | time | date?, session?, dia_id?}``;
* a plain string: one turn per non-empty line, "speaker: text" when the line has such a prefix.

Everything is validated before anything is stored: a bad turn raises :class:`BadTurnError` naming the turn,
and the call stores nothing. Turns without a time of their own take their session's time (plus their index in
seconds, so a session's turns keep their order), else the call's ``timestamp``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from remem_agent._time import Timestamp, to_epoch
from remem_agent.errors import UserInputError


class BadTurnError(UserInputError):
    """A conversation turn (or the conversation's shape) that cannot be stored; nothing was written."""


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One utterance: who said it, what, when (epoch seconds or None), in which session."""

    speaker: str
    text: str
    at: float | None = None
    session: str | None = None
    dia_id: str | None = None


_MONTHS = {
    name: i + 1
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
    for name in names
}
# Numbers are whole: "99999-01-01" is no date (not 9999-01-01), "123 May, 2023" none either.
_YMD_RE = re.compile(r"(?<!\d)(\d{4})\s*[/\-.]\s*(\d{1,2})\s*[/\-.]\s*(\d{1,2})(?!\d)")
_DMY_RE = re.compile(r"(?<!\d)(\d{1,2})(?:st|nd|rd|th)?\s+([A-Za-z]{3,9})\.?,?\s+(\d{4})(?!\d)")
_MDY_RE = re.compile(r"([A-Za-z]{3,9})\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})(?!\d)")
_TIME_RE = re.compile(r"(?<![\d/\-])(\d{1,2}):(\d{2})(?::(\d{2}))?\s*([ap]\.?m\.?)?", re.IGNORECASE)
_SESSION_RE = re.compile(r"^session_(\d+)$")
_PREFIX_RE = re.compile(r"^([^:\n]{1,40}):\s+(.*)$")


def parse_when(value: object) -> datetime | None:
    """The transcripts' free-text dates as an aware UTC datetime; None when no date is found.

    Handles "2023/05/20 (Sat) 02:21" (LongMemEval), "1:56 pm on 8 May, 2023" (LoCoMo), "May 8, 2023",
    ISO-8601, datetimes and epoch seconds. A missing time of day is midnight; a time of day that cannot be
    (25:61) or a date that does not exist (31 February, 99999-01-01) makes the whole value unreadable (None).
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(float(value), tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
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
            hour = (hour % 12) + (12 if ampm.lower().startswith("p") else 0)
        if not (0 <= hour < 24 and 0 <= minute < 60 and 0 <= second < 60):
            return None  # "25:61": an unreadable time, not midnight
    try:
        return datetime(date[0], date[1], date[2], hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None


def _when(value: object, where: str) -> float | None:
    """A turn's or session's time in epoch seconds; a value that is present but unreadable is an error."""
    if value is None:
        return None
    dt = parse_when(value)
    if dt is None:
        raise BadTurnError(f"{where}: cannot read the time {str(value)[:80]!r}")
    try:
        return to_epoch(dt, name=where)
    except UserInputError as exc:
        raise BadTurnError(str(exc)) from exc


_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})  # content part types that carry text
_TOOL_RESULT_ROLES = frozenset({"tool", "function"})


def _message_text(raw: Mapping[str, Any], where: str) -> str | None:
    """What a turn says, or ``None`` for a message that says nothing (module docstring); raises on bad input."""
    if "speaker" not in raw and raw.get("role") in _TOOL_RESULT_ROLES:
        return None
    value = raw.get("content", raw.get("text"))
    if value is None and isinstance(raw.get("refusal"), str):
        value = raw["refusal"]
    if value is None and (raw.get("tool_calls") or raw.get("function_call")):
        return None
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, Mapping):
                raise BadTurnError(f"{where}: content part {j} must be a mapping, got {type(part).__name__}")
            if part.get("type") in _TEXT_PARTS:
                if not isinstance(part.get("text"), str):
                    raise BadTurnError(f"{where}: content part {j} of type {part['type']!r} has no text string")
                if part["text"].strip():
                    texts.append(_text(part["text"], f"{where} content part {j}"))
        return "\n".join(texts) if texts else None
    return _text(value, where)


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadTurnError(f"{where}: the text must be a non-empty string")
    if "\x00" in value:
        raise BadTurnError(f"{where}: the text contains a NUL character")
    return value.strip()


def _turn(raw: object, where: str, *, session: str | None, base: float | None, index: int) -> Turn | None:
    """One turn, or ``None`` for a message that says nothing (a tool call, a tool result, an image)."""
    if not isinstance(raw, Mapping):
        raise BadTurnError(f"{where}: a turn must be a mapping, got {type(raw).__name__}")
    text = _message_text(raw, where)
    if text is None:
        return None
    who = raw.get("speaker") or raw.get("name") or raw.get("role")
    if who is None:
        raise BadTurnError(f"{where}: a turn needs a speaker (speaker, name or role)")
    speaker = _text(who, f"{where} speaker")
    own = _when(next((raw[key] for key in ("timestamp", "time", "date") if raw.get(key) is not None), None), where)
    at = own if own is not None else (base + index if base is not None else None)
    sess = raw.get("session", raw.get("session_id", session))
    dia = raw.get("dia_id")
    return Turn(
        speaker=speaker,
        text=text,
        at=at,
        session=None if sess is None else _text(str(sess), f"{where} session"),
        dia_id=None if dia is None else str(dia),
    )


def _said(turns: Iterable[Turn | None]) -> list[Turn]:
    """The turns that say something (a bad turn has raised while the turns were made, before any is kept)."""
    return [t for t in turns if t is not None]


def _locomo(conv: Mapping[str, Any]) -> list[Turn]:
    sessions = sorted((int(m.group(1)), key) for key in conv if isinstance(key, str) and (m := _SESSION_RE.match(key)))
    if not sessions:
        raise BadTurnError("a LoCoMo conversation needs session_<n> lists of turns")
    turns: list[Turn] = []
    for _, key in sessions:
        items = conv[key]
        if not isinstance(items, list):
            raise BadTurnError(f"{key}: expected a list of turns")
        base = _when(conv.get(f"{key}_date_time"), f"{key}_date_time")
        turns += _said(_turn(t, f"{key}[{i}]", session=key, base=base, index=i) for i, t in enumerate(items))
    return turns


def _longmemeval(entry: Mapping[str, Any]) -> list[Turn]:
    sessions = entry["haystack_sessions"]
    if not isinstance(sessions, list):
        raise BadTurnError("haystack_sessions must be a list of sessions")
    dates = entry.get("haystack_dates", [None] * len(sessions))
    names = entry.get("haystack_session_ids", [f"session_{i + 1}" for i in range(len(sessions))])
    if not isinstance(dates, list) or not isinstance(names, list) or not len(dates) == len(names) == len(sessions):
        raise BadTurnError("haystack_dates and haystack_session_ids must be lists as long as haystack_sessions")
    turns: list[Turn] = []
    for si, (items, date, name) in enumerate(zip(sessions, dates, names, strict=True)):
        if not isinstance(items, list):
            raise BadTurnError(f"haystack_sessions[{si}]: expected a list of turns")
        base = _when(date, f"haystack_dates[{si}]")
        where = f"haystack_sessions[{si}]"
        turns += _said(_turn(t, f"{where}[{i}]", session=str(name), base=base, index=i) for i, t in enumerate(items))
    return turns


def parse_conversation(transcript: object, *, timestamp: Timestamp | None = None) -> list[Turn]:
    """Normalise any supported shape to turns (module docstring); raises :class:`BadTurnError`, reads only."""
    default = to_epoch(timestamp, name="timestamp")
    if isinstance(transcript, str):
        _text(transcript, "transcript")
        turns = []
        for i, line in enumerate(ln.strip() for ln in transcript.splitlines()):
            if not line:
                continue
            m = _PREFIX_RE.match(line)
            who, text = (m.group(1).strip(), m.group(2)) if m else ("user", line)
            turns += _said([_turn({"speaker": who, "text": text}, f"line {i + 1}", session=None, base=None, index=0)])
    elif isinstance(transcript, Mapping):
        if "haystack_sessions" in transcript:
            turns = _longmemeval(transcript)
        else:
            conv = transcript.get("conversation", transcript)
            if not isinstance(conv, Mapping):
                raise BadTurnError("a LoCoMo sample's 'conversation' must be a mapping")
            turns = _locomo(conv)
    elif isinstance(transcript, Sequence):
        turns = _said(_turn(t, f"turn {i}", session=None, base=None, index=i) for i, t in enumerate(transcript))
    else:
        raise BadTurnError(
            "transcript must be a string, a list of turns, a LoCoMo conversation or a LongMemEval entry, "
            f"got {type(transcript).__name__}"
        )
    if not turns:
        raise BadTurnError("the conversation has no turns with text")
    if default is not None:
        # turns without a time of their own: the call's time, one second apart so they keep their order
        turns = [t if t.at is not None else replace(t, at=default + i) for i, t in enumerate(turns)]
    return turns
