"""How many threads an embedder computes with, when the caller does not say.

Why a default of 1: a single query is a small model on a few tokens, so a second thread saves little on an
idle machine, while on a shared one (two cores, another process busy on one) a thread pool waits at every
barrier for the busy core: issue 18 measured 216-316 ms instead of ~18 ms for one torch query embedding.
``REMEM_EMBED_THREADS`` raises it for a machine the embedder has to itself (batched adds gain most).
"""

from __future__ import annotations

import os

from remem_agent.errors import UserInputError

THREADS_ENV = "REMEM_EMBED_THREADS"


def default_threads() -> int:
    """Threads an embedder uses unless told: ``REMEM_EMBED_THREADS`` when set, else 1."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return 1
    try:
        n = int(raw)
    except ValueError as exc:
        raise UserInputError(f"{THREADS_ENV} must be a positive integer, got {raw!r}") from exc
    if n <= 0:
        raise UserInputError(f"{THREADS_ENV} must be a positive integer, got {raw!r}")
    return n


def check_threads(threads: int | None) -> int:
    """``threads`` as a positive int (None: :func:`default_threads`); anything else is a UserInputError."""
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0:
        raise UserInputError(f"threads must be a positive integer, got {threads!r}")
    return threads


__all__ = ["THREADS_ENV", "check_threads", "default_threads"]
