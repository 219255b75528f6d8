"""remem-agent: a memory layer for LLM agents that learns from outcomes.

Public API::

    from remem_agent import ReMem
    mem = ReMem("my_memory")
    mem.add("Our server is in east-1.", entity="server", attribute="region")
    hits = mem.search("Where is our server?")
    mem.feedback(hits.search_id, success=True, used_ids=[hits.items[0].id])
"""

from __future__ import annotations

import logging

from remem_agent.errors import (
    EmbeddingError,
    FeedbackConflictError,
    InvalidTransition,
    LedgerIntegrityError,
    MissingExtensionError,
    ModelError,
    OutputValidationError,
    RememError,
    SchemaVersionError,
    StoreBusyError,
    StoreConnectionError,
    StoreError,
    UnknownMemoryError,
    UnknownSearchError,
    UserInputError,
)
from remem_agent.ingest import MemoryInput
from remem_agent.memory import ReMem, RememConfig
from remem_agent.types import (
    Event,
    FeedbackReceipt,
    Hit,
    Memory,
    MemoryInfo,
    Role,
    SearchResult,
    State,
    StoreStats,
    TaskStats,
    VerifyReport,
)

__version__ = "0.1.0"

logging.getLogger("remem_agent").addHandler(logging.NullHandler())

__all__ = [
    "EmbeddingError",
    "Event",
    "FeedbackConflictError",
    "FeedbackReceipt",
    "Hit",
    "InvalidTransition",
    "LedgerIntegrityError",
    "Memory",
    "MemoryInfo",
    "MemoryInput",
    "MissingExtensionError",
    "ModelError",
    "OutputValidationError",
    "ReMem",
    "RememConfig",
    "RememError",
    "Role",
    "SchemaVersionError",
    "SearchResult",
    "State",
    "StoreBusyError",
    "StoreConnectionError",
    "StoreError",
    "StoreStats",
    "TaskStats",
    "UnknownMemoryError",
    "UnknownSearchError",
    "UserInputError",
    "VerifyReport",
    "__version__",
]
