"""Token counting: the word+punctuation proxy and the tiktoken switch."""

from __future__ import annotations

import sys
import types

import pytest

from remem_agent import UserInputError, tokens


@pytest.fixture(autouse=True)
def _reset() -> object:
    yield
    tokens.set_tokenizer("proxy")


def test_proxy_counts_words_and_punctuation() -> None:
    assert tokens.proxy_count("Our server moved to west-2.") == 8
    assert tokens.proxy_count("") == 0
    tokens.set_tokenizer("proxy")
    assert tokens.count_tokens("a, b!") == 4


def test_unknown_tokenizer_is_rejected() -> None:
    with pytest.raises(UserInputError):
        tokens.set_tokenizer("wordpiece")


def test_env_selects_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("tiktoken")

    class Enc:
        def encode(self, text: str) -> list[int]:
            return list(text.encode())  # one token per byte: easy to tell apart from the proxy

    fake.get_encoding = lambda name: Enc()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    monkeypatch.setenv("REMEM_TOKENIZER", "tiktoken")
    monkeypatch.setattr(tokens, "_counter", None)
    assert tokens.count_tokens("abc de") == 6
    assert tokens.tokenizer_name() == "tiktoken"


def test_tiktoken_without_encoding_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("tiktoken")

    def get_encoding(name: str) -> object:
        raise ConnectionError("no network")

    fake.get_encoding = get_encoding  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    with pytest.raises(UserInputError, match="TIKTOKEN_CACHE_DIR"):
        tokens.set_tokenizer("tiktoken")


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # makes `import tiktoken` fail
    with pytest.raises(ImportError, match=r"remem-agent\[tiktoken\]"):
        tokens.set_tokenizer("tiktoken")
