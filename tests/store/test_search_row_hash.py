"""A search row's JSON and hash, written in one pass (``hashing.search_row``), are what the general path gives.

Why: ``insert_search`` used to write the served list with ``json.dumps`` and hash it through ``search_hash``,
formatting every float of the feature snapshots twice. ``search_row`` writes the list once and derives the
hash's canonical text from it; ``verify()`` still recomputes hashes through ``search_hash`` from the stored
JSON, so the two must agree on every list, including shapes the fast path does not take.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from remem_agent import ReMem
from remem_agent.store import hashing

_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=64)
_TEXT = st.text(max_size=20)

# A served entry as rank_and_select records it, plus the odd shapes a caller or an old row may hold.
_ENTRY = st.fixed_dictionaries(
    {
        "id": _TEXT,
        "rank": st.integers(min_value=0, max_value=1000),
        "score": _FLOATS,
        "similarity": _FLOATS,
        "f": st.lists(_FLOATS, max_size=21),
    }
)
_ODD_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**18), max_value=10**18),
    _FLOATS,
    _TEXT,
    st.lists(st.one_of(_FLOATS, st.integers(), _TEXT), max_size=4),
    st.dictionaries(_TEXT, _FLOATS, max_size=3),
)
_ODD_ENTRY = st.dictionaries(st.one_of(_TEXT, st.just("rank")), _ODD_VALUE, max_size=5)


def _fields(served: list[Any]) -> tuple[Any, ...]:
    return ("s_1", 1.7e9, 'who "rank":3, is on call', "oncall", None, 1.7e9 + 0.5, 60, served)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_ENTRY, _ODD_ENTRY), max_size=6))
def test_search_row_hash_is_search_hash_of_what_it_stores(served: list[Any]) -> None:
    served_json, row_hash = hashing.search_row(*_fields(served))
    stored = json.loads(served_json)
    assert stored == served
    assert row_hash == hashing.search_hash(*_fields(served))
    assert row_hash == hashing.search_hash(*_fields(stored))  # what verify() recomputes


def test_ids_that_look_like_ranks_are_not_rewritten() -> None:
    served = [{"id": 'm"rank":7,', "rank": 2, "score": 0.5, "similarity": -0.0, "f": [1.0, -0.0]}]
    served_json, row_hash = hashing.search_row(*_fields(served))
    assert json.loads(served_json) == served
    assert row_hash == hashing.search_hash(*_fields(served))


def test_searches_written_this_way_verify(tmp_path: Any) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add("The billing service runs in region eu-west-1.", entity="billing", attribute="region")
        mem.add("Deploys need two approvals.")
        for query in ("where does billing run", "how many approvals", "nothing matches zzz"):
            mem.search(query, k=2, token_budget=40)
        report = mem.verify()
        assert report.ok, report.problems
