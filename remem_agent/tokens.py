"""Token counting for budgets.

The default is a word+punctuation proxy (fast, dependency-free, close enough to BPE counts for
English prose to rank budget fits). ``REMEM_TOKENIZER=tiktoken`` or ``set_tokenizer("tiktoken")``
switches to real BPE counts (extra ``tiktoken``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from remem_agent._extras import require
from remem_agent.errors import UserInputError

_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)

Counter = Callable[[str], int]


def proxy_count(text: str) -> int:
    """Count words and punctuation marks: 'Our server moved to west-2.' -> 8 (west, -, 2 count apart)."""
    return len(_TOKEN_RE.findall(text))


def _tiktoken_counter(encoding: str | None = None) -> Counter:
    tiktoken = require("tiktoken", "tiktoken", feature="tiktoken token counting")
    name = encoding or os.environ.get("REMEM_TIKTOKEN_ENCODING", "cl100k_base")
    try:
        enc = tiktoken.get_encoding(name)
    except Exception as exc:  # tiktoken raises plain errors (ValueError, requests errors) on a cold cache
        raise UserInputError(
            f"tiktoken could not load encoding {name!r}: {exc}. tiktoken downloads encodings on first use; "
            "offline, copy the encoding file into TIKTOKEN_CACHE_DIR or use the default proxy tokenizer"
        ) from exc

    def count(text: str) -> int:
        return len(enc.encode(text))

    return count


_counter: Counter | None = None
_counter_name = "proxy"


def set_tokenizer(name: str) -> None:
    """Select the token counter: ``"proxy"`` (default) or ``"tiktoken"``."""
    global _counter, _counter_name
    if name == "proxy":
        _counter = proxy_count
    elif name == "tiktoken":
        _counter = _tiktoken_counter()
    else:
        raise UserInputError(f"unknown tokenizer {name!r}; use 'proxy' or 'tiktoken'")
    _counter_name = name


def tokenizer_name() -> str:
    count_tokens("")  # resolve the env default
    return _counter_name


def count_tokens(text: str) -> int:
    """Token cost of ``text`` under the selected counter."""
    global _counter
    if _counter is None:
        set_tokenizer(os.environ.get("REMEM_TOKENIZER", "proxy") or "proxy")
    assert _counter is not None
    return _counter(text)
