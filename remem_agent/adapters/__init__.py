"""Chat-model adapters behind one async ``ChatModel`` protocol. Provider adapters load lazily."""

from __future__ import annotations

from typing import Any

from remem_agent.adapters.base import Capabilities, ChatModel, ChatRequest, ChatResponse, Message, Usage
from remem_agent.adapters.fakes import FunctionChatModel, ScriptedChatModel
from remem_agent.adapters.retry import RetryPolicy, call_with_retries

__all__ = [
    "Capabilities",
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "FunctionChatModel",
    "LlamaCppChat",
    "Message",
    "OllamaChat",
    "OpenAIChat",
    "RetryPolicy",
    "ScriptedChatModel",
    "Usage",
    "call_with_retries",
]

_LAZY = {
    "OpenAIChat": "remem_agent.adapters.openai_chat",
    "OllamaChat": "remem_agent.adapters.ollama_chat",
    "LlamaCppChat": "remem_agent.adapters.llamacpp_chat",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
