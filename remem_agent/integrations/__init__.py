"""Framework integrations. Each one needs its extra and loads lazily, so importing this package is free.

* :class:`ReMemRetriever` (``pip install 'remem-agent[langchain]'``): ReMem as a LangChain retriever.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReMemRetriever"]

_LAZY = {"ReMemRetriever": "remem_agent.integrations.langchain"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
