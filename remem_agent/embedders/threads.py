"""How many threads an embedder computes with, when the caller does not say.

Why the defaults differ by engine (results/perf/embedders.json, ``python -m evals.perf.embedders``, one query
embedding on this 2-core machine, idle and with one competing CPU-bound process): torch's OpenMP pool waits
at every barrier for a descheduled thread, so two torch threads were an order of magnitude slower than one
(216-316 ms instead of ~18 ms was measured); onnxruntime's pool with spinning off degrades gracefully,
and for one query two ONNX threads were no slower than one, idle or loaded (batched throughput was within
20%). So torch gets 1 thread and onnxruntime
``min(cores, 2)``. ``REMEM_EMBED_THREADS`` overrides both.

onnxruntime's spinning stays off (:class:`remem_agent.embedders.onnx.OnnxEmbedder`): with other jobs keeping
this machine at load ~2.5, two spinning threads took 10.2 ms per query instead of 7.8 ms and, with
queries 20 ms apart, 29.9 ms of CPU per query instead of 8.1 ms (the pool spins on after each run).
"""

from __future__ import annotations

import os

from remem_agent.errors import UserInputError

THREADS_ENV = "REMEM_EMBED_THREADS"


def default_threads(engine_default: int = 1) -> int:
    """Threads an embedder uses unless told: ``REMEM_EMBED_THREADS`` when set, else ``engine_default``."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return engine_default
    try:
        n = int(raw)
    except ValueError as exc:
        raise UserInputError(f"{THREADS_ENV} must be a positive integer, got {raw!r}") from exc
    if n <= 0:
        raise UserInputError(f"{THREADS_ENV} must be a positive integer, got {raw!r}")
    return n


def onnx_default_threads() -> int:
    """onnxruntime's default without ``REMEM_EMBED_THREADS``: two threads, or one on a one-core machine."""
    return min(os.cpu_count() or 1, 2)


def check_threads(threads: int | None, *, engine_default: int = 1) -> int:
    """``threads`` as a positive int (None: :func:`default_threads`); anything else is a UserInputError."""
    if threads is None:
        return default_threads(engine_default)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0:
        raise UserInputError(f"threads must be a positive integer, got {threads!r}")
    return threads


__all__ = ["THREADS_ENV", "check_threads", "default_threads", "onnx_default_threads"]
