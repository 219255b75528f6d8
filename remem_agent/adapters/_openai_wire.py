"""What the OpenAI-protocol adapters share on the wire: how much of an error body is kept, which statuses are
worth a retry, the finish reasons and the usage counts. Private: :mod:`.openai_chat` (the SDK's client) and
:mod:`.openai_aiohttp` (the gateway's pooled aiohttp session) both read replies by these rules.
"""

from __future__ import annotations

from typing import Any

from remem_agent.adapters.base import FinishReason

BODY_LIMIT = 2000  # characters of an error body kept on the error
MESSAGE_BODY_LIMIT = 300  # ... and shown in its message
TRANSIENT_STATUS = frozenset({408, 425, 429})  # retryable, as is every 5xx
FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def count(value: Any) -> int | None:
    """A token count from the usage block, or None when missing or not a non-negative integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
