"""The public surface is an explicit, tested list (as httpx does): adding or dropping a name is a decision."""

from __future__ import annotations

import inspect
import subprocess
import sys

import remem_agent
from remem_agent import errors

EXPECTED_ROOT = {
    # the memory
    "ReMem",
    "RememConfig",
    "MemoryInput",
    # records at the API boundary
    "Event",
    "FeedbackReceipt",
    "Hit",
    "Memory",
    "MemoryInfo",
    "Role",
    "SearchResult",
    "State",
    "StoreStats",
    "TaskStats",
    "VerifyReport",
    # the middleware and the chat-model seam (lazy)
    "MemoryAgent",
    "Answer",
    "Outcome",
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "Capabilities",
    "Message",
    "RetryPolicy",
    "ScriptedChatModel",
    "FunctionChatModel",
    "OpenAIChat",
    "OllamaChat",
    "LlamaCppChat",
    # errors
    "RememError",
    "UserInputError",
    "UnknownMemoryError",
    "UnknownSearchError",
    "AnswerExpiredError",
    "FeedbackConflictError",
    "EmbeddingError",
    "NoPropensitiesError",
    "InvalidTransition",
    "StoreError",
    "SchemaVersionError",
    "LedgerIntegrityError",
    "LedgerCorruptError",
    "StoreBusyError",
    "StoreConnectionError",
    "MissingExtensionError",
    "ModelError",
    "OutputValidationError",
    "__version__",
}


def test_root_exports_exactly_the_intended_names() -> None:
    assert set(remem_agent.__all__) == EXPECTED_ROOT
    assert len(remem_agent.__all__) == len(set(remem_agent.__all__))


def test_every_exported_name_resolves() -> None:
    for name in remem_agent.__all__:
        assert getattr(remem_agent, name) is not None, name


def test_errors_all_lists_every_error_class_of_the_tree() -> None:
    defined = {
        n
        for n, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, errors.RememError) and obj.__module__ == errors.__name__
    }
    assert set(errors.__all__) == defined
    root_errors = {n for n in remem_agent.__all__ if n.endswith("Error") or n == "InvalidTransition"}
    assert root_errors <= set(errors.__all__)


def test_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    assert remem_agent.__version__ == version("remem-agent")


def test_importing_the_package_loads_no_model_sdk() -> None:
    sdks = "('openai', 'ollama', 'llama_cpp', 'torch')"
    code = f"import sys, remem_agent; print(sorted(m for m in {sdks} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
