"""Time values at the API boundary: epoch seconds, datetimes or ISO-8601 strings.

Every time argument (``timestamp=``, ``now=``, ``as_of=``) goes through :func:`to_epoch`, the one
conversion. It refuses what the ledger could store but not render back: a time must lie within
years 1-9999 **in UTC** (``MIN_EPOCH`` .. ``MAX_EPOCH``), because records are shown as UTC dates
(``to_dict("iso")``, the prompt, the MCP server). A refused value raises ``UserInputError`` whose
message guesses the likely mistake (epoch milliseconds, a time-zone offset past the end of year 9999).
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

from remem_agent.errors import UserInputError

Timestamp = float | int | datetime | str

# The range of times every record can be rendered in: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
MIN_EPOCH = -62_135_596_800.0
MAX_EPOCH = 253_402_300_799.0
_RANGE = "0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z"
# Epoch units people pass by mistake, largest first (a value in range after dividing by the factor).
_UNITS = ((1e3, "milliseconds", "1000"), (1e6, "microseconds", "1_000_000"), (1e9, "nanoseconds", "1e9"))


def to_epoch(value: Timestamp | None, *, name: str, default: float | None = None) -> float | None:
    """Normalise a time argument to epoch seconds (naive datetimes are taken as UTC).

    Raises UserInputError for anything that is not a time within years 1-9999 in UTC.
    """
    if value is None:
        return default
    if isinstance(value, bool):
        raise UserInputError(f"{name} must be a time, not a bool")
    if isinstance(value, int | float):
        return _check_number(value, name)
    if isinstance(value, datetime):
        return _check_datetime(value, name, shown=repr(value))
    if isinstance(value, str):
        text = value.strip()
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except (ValueError, TypeError) as exc:
            hint = " (use ISO-8601, e.g. '2025-03-01T12:00:00Z')"
            try:
                float(text)
                hint = " (epoch seconds must be passed as a number, not a string)"
            except ValueError:
                pass
            raise UserInputError(f"{name}: cannot parse time {shown(value)}{hint}") from exc
        return _check_datetime(dt, name, shown=shown(value))
    raise UserInputError(f"{name} must be epoch seconds, a datetime or an ISO string, got {type(value).__name__}")


def _check_number(value: int | float, name: str) -> float:
    if isinstance(value, int) and not MIN_EPOCH <= value <= MAX_EPOCH:  # huge ints: compare before float()
        raise UserInputError(_out_of_range(name, shown(value), value))
    t = float(value)
    if not math.isfinite(t):
        raise UserInputError(f"{name} must be finite, got {value!r}")
    if not MIN_EPOCH <= t <= MAX_EPOCH:
        raise UserInputError(_out_of_range(name, shown(value), t))
    return t


def _out_of_range(name: str, shown: str, t: int | float) -> str:
    msg = f"{name} {shown} is outside years 1-9999 ({_RANGE}, i.e. epoch seconds {MIN_EPOCH:.0f} .. {MAX_EPOCH:.0f})"
    for factor, unit, divisor in _UNITS:
        if MIN_EPOCH * factor <= t <= MAX_EPOCH * factor:
            return f"{msg}; it looks like epoch {unit}: divide by {divisor}"
    return msg


def _check_datetime(dt: datetime, name: str, *, shown: str) -> float:
    try:
        aware = dt if dt.tzinfo is not None and dt.utcoffset() is not None else dt.replace(tzinfo=UTC)
        t = aware.timestamp()
    except (OverflowError, ValueError, TypeError, ArithmeticError) as exc:
        raise UserInputError(f"{name} {shown}: cannot convert to UTC ({exc})") from exc
    if not math.isfinite(t) or not MIN_EPOCH <= t <= MAX_EPOCH:
        side = "after 9999-12-31T23:59:59Z" if t > 0 else "before 0001-01-01T00:00:00Z"
        hint = "; its time-zone offset moves it out of range: give the UTC time instead" if aware.utcoffset() else ""
        raise UserInputError(f"{name} {shown} is {side} in UTC (storable times: {_RANGE}){hint}")
    return t


def shown(value: object, limit: int = 80) -> str:
    """``repr`` for an error message, cut at ``limit``; a huge int is described (its repr could be
    thousands of digits, or refused by Python's int-to-str limit)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"(an integer of {value.bit_length()} bits)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def now() -> float:
    return time.time()
