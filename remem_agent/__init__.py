"""remem-agent: a memory layer for LLM agents that learns from outcomes.

Public API::

    from remem_agent import ReMem
    mem = ReMem("my_memory")
    mem.add("Our server is in east-1.", entity="server", attribute="region")
    hits = mem.search("Where is our server?")
    mem.feedback(hits.search_id, success=True, used_ids=[hits.items[0].id])

The middleware (``MemoryAgent``), the chat-model seam (``ChatModel`` and its request/response types) and
the adapters are importable from here too; they load on first use, so ``import remem_agent`` pulls in no
model SDK.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from typing import Any

from remem_agent.errors import (
    AnswerExpiredError,
    EmbeddingError,
    FeedbackConflictError,
    InvalidTransition,
    LedgerCorruptError,
    LedgerIntegrityError,
    MissingExtensionError,
    ModelError,
    NoPropensitiesError,
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
from remem_agent.validate import MemoryInput

try:
    __version__ = _dist_version("remem-agent")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

# Loaded on first attribute access (PEP 562): the middleware and the adapters, whose SDKs are extras.
_LAZY = {
    "MemoryAgent": "remem_agent.agent",
    "Answer": "remem_agent.agent",
    "Outcome": "remem_agent.agent",
    "ChatModel": "remem_agent.adapters",
    "ChatRequest": "remem_agent.adapters",
    "ChatResponse": "remem_agent.adapters",
    "Capabilities": "remem_agent.adapters",
    "Message": "remem_agent.adapters",
    "RetryPolicy": "remem_agent.adapters",
    "ScriptedChatModel": "remem_agent.adapters",
    "FunctionChatModel": "remem_agent.adapters",
    "OpenAIChat": "remem_agent.adapters",
    "OllamaChat": "remem_agent.adapters",
    "LlamaCppChat": "remem_agent.adapters",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'remem_agent' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


logging.getLogger("remem_agent").addHandler(logging.NullHandler())

__all__ = [
    "Answer",
    "AnswerExpiredError",
    "Capabilities",
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "EmbeddingError",
    "Event",
    "FeedbackConflictError",
    "FeedbackReceipt",
    "FunctionChatModel",
    "Hit",
    "InvalidTransition",
    "LedgerCorruptError",
    "LedgerIntegrityError",
    "LlamaCppChat",
    "Memory",
    "MemoryAgent",
    "MemoryInfo",
    "MemoryInput",
    "Message",
    "MissingExtensionError",
    "ModelError",
    "NoPropensitiesError",
    "OllamaChat",
    "OpenAIChat",
    "Outcome",
    "OutputValidationError",
    "ReMem",
    "RememConfig",
    "RememError",
    "RetryPolicy",
    "Role",
    "SchemaVersionError",
    "ScriptedChatModel",
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
