"""Time values at the API boundary: epoch seconds, datetimes or ISO-8601 strings."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

from remem_agent.errors import UserInputError

Timestamp = float | int | datetime | str


def to_epoch(value: Timestamp | None, *, name: str, default: float | None = None) -> float | None:
    """Normalise a time argument to epoch seconds (naive datetimes are taken as UTC)."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise UserInputError(f"{name} must be a time, not a bool")
    if isinstance(value, int | float):
        t = float(value)
    elif isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
        t = dt.timestamp()
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise UserInputError(f"{name}: cannot parse time {value!r} (use ISO-8601)") from exc
        dt = dt if dt.tzinfo else dt.replace(tzinfo=UTC)
        t = dt.timestamp()
    else:
        raise UserInputError(f"{name} must be epoch seconds, a datetime or an ISO string, got {type(value).__name__}")
    if not math.isfinite(t):
        raise UserInputError(f"{name} must be finite, got {value!r}")
    return t


def now() -> float:
    return time.time()
