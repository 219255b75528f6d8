"""The shortcuts of ``ReMem.add_many``'s path give what the long way gives.

Each shortcut skips work a profile of the batched add showed (``evals.perf.core``, hash embedder, SQLite); each
test compares it with the computation it replaces, or checks the property it must keep.
"""

from __future__ import annotations

import random
import re
import sys
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remem_agent.embedders import hash_embedder
from remem_agent.embedders.hash_embedder import ConceptHashEmbedder
from remem_agent.learning.staleness import normalise
from remem_agent.validate import normalise_key


def _texts(seed: int, n: int = 200) -> list[str]:
    rng = random.Random(seed)
    words = "server host region db deploy owner cache the a of east-1 v2.3 alpha beta gamma delta".split()
    words += [f"w{i}" for i in range(300)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 30))) for _ in range(n)] + ["the of a", ""]


# -- the hash embedder's feature memo ----------------------------------------------------------------------
def test_remembered_buckets_are_the_hashed_ones_and_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hash_embedder, "_MEMO", 150)
    warm = ConceptHashEmbedder(dim=64)
    warm.embed(_texts(1))  # fills the memo (to its bound) with features that the texts below share
    texts = _texts(2)
    assert warm.embed(texts).tobytes() == ConceptHashEmbedder(dim=64).embed(texts).tobytes()
    assert len(warm._buckets) == 150
    for feature, remembered in warm._buckets.items():
        if isinstance(feature, tuple):  # a bigram: its string's sign, weighted
            i, s = warm._bucket_uncached(" ".join(feature))
            assert remembered == (i, s * 0.5)
        else:
            assert remembered == warm._bucket_uncached(feature)


def test_a_remembered_bigram_is_never_taken_for_a_term_of_the_same_string() -> None:
    # "foo" is the one term "x y" (a concept may map to a string with a space); "x y" has the bigram x+y
    texts = ["x y", "foo", "x y foo"]
    alone = [ConceptHashEmbedder(dim=64, concepts={"foo": "x y"}).embed([t]).tobytes() for t in texts]
    shared = ConceptHashEmbedder(dim=64, concepts={"foo": "x y"})
    assert [shared.embed([t]).tobytes() for t in texts] == alone
    assert shared.embed(texts[::-1]).tobytes() == b"".join(alone[::-1])


# -- whitespace folded by str.split (normalise, normalise_key) ------------------------------------------------
def test_str_split_and_the_regex_take_the_same_characters_as_whitespace() -> None:
    space = re.compile(r"\s")
    assert [c for c in range(sys.maxunicode + 1) if chr(c).isspace()] == [
        c for c in range(sys.maxunicode + 1) if space.fullmatch(chr(c))
    ]


_TRICKY = [
    " ",
    "\t",
    "\n",
    "\x0b",
    "\x0c",
    "\r",
    "\x1c",
    "\x1f",
    "\x85",
    "\xa0",
    "\u1680",
    "\u2003",
    "\u2028",
    "\u3000",
]
_TRICKY += [
    "\u200b",
    "a",
    "B",
    ".",
    "!",
    ";",
    " .",
    "\u00df",
    "\ufb01",
    "\u0345",
    "\u2163",
    "\uff21",
    "\u00c5",
    "\u212b",
]


@settings(max_examples=400, deadline=None)
@given(st.text() | st.lists(st.sampled_from(_TRICKY), max_size=12).map("".join))
def test_normalising_folds_whitespace_as_the_regex_did(text: str) -> None:
    folded = re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()
    assert normalise(text) == folded.rstrip(" .!;")
    assert normalise_key(text) == re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text)).strip().casefold()
