"""Re-adding a fact that is already in the ledger: a replay is not a new claim.

The rule (docs/concepts.md "Supersession", docs/ARCHITECTURE.md "Decisions"): a fact with entity+attribute and an
*explicit* timestamp whose role, key, normalised text and timestamp equal a stored memory's is that
memory, in any state: its id is returned, nothing is written, nothing is superseded. Restating the
*current* fact (any timestamp) still logs a ``reconfirm``. Without a timestamp a fact is stated "now",
so a second run is a new claim. Every test runs on both backends (the lookup is SQL).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from remem_agent import MemoryInput, ReMem, State

StoreLocation = Callable[[str], "str | Path"]

EAST = "Our server is in east-1."
WEST = "Our server moved to west-2."
T_EAST = "2025-01-01T00:00:00Z"
T_WEST = "2025-03-01T00:00:00Z"
KEY = {"entity": "server", "attribute": "region"}


@pytest.fixture()
def mem(store_location: StoreLocation) -> Iterator[ReMem]:
    m = ReMem(store_location("store"))
    yield m
    m.close()


def _quickstart(mem: ReMem) -> tuple[str, str]:
    east = mem.add(EAST, timestamp=T_EAST, **KEY)
    west = mem.add(WEST, timestamp=T_WEST, **KEY)
    return east, west


def _snapshot(mem: ReMem) -> tuple[object, ...]:
    rows = mem.list()
    return (len(rows), [(m.id, m.state, m.valid_to, m.superseded_by) for m in rows])


def test_quickstart_run_twice_with_timestamps_keeps_history(store_location: StoreLocation) -> None:
    with ReMem(store_location("qs")) as mem:
        east, west = _quickstart(mem)
        first = _snapshot(mem)
        east_history = [e.kind for e in mem.inspect(east).history]
    with ReMem(store_location("qs")) as mem:  # the script again, e.g. the next day
        assert _quickstart(mem) == (east, west)
        assert _snapshot(mem) == first  # no new memory, nobody superseded, west-2 still current
        assert mem.stats().memories == 2
        assert [e.kind for e in mem.inspect(east).history] == east_history == ["add", "invalidate"]
        assert [e.kind for e in mem.inspect(west).history] == ["add", "reconfirm"]  # the current fact restated
        assert mem.get(east).superseded_by == west and mem.get(west).state is State.ACTIVE
        assert mem.search("Where is our server?").items[0].id == west
        assert mem.search("Where is our server?", as_of="2025-02-01T00:00:00Z").items[0].id == east
        assert mem.verify().ok


def test_without_timestamps_a_second_run_is_a_new_claim(mem: ReMem) -> None:
    """No timestamp = stated now: the library cannot tell a replay from a real move back."""
    east = mem.add(EAST, **KEY)
    west = mem.add(WEST, **KEY)
    east2 = mem.add(EAST, **KEY)
    assert east2 not in (east, west)
    assert mem.get(west).superseded_by == east2  # documented: pass timestamps to make a script rerunnable


def test_superseded_fact_at_a_new_time_is_a_move_back(mem: ReMem) -> None:
    east, west = _quickstart(mem)
    back = mem.add(EAST, timestamp="2025-06-01T00:00:00Z", **KEY)
    assert back != east
    assert mem.get(west).state is State.INVALIDATED and mem.get(west).superseded_by == back


def test_replay_matches_any_time_form_and_normalised_text(mem: ReMem) -> None:
    east, _ = _quickstart(mem)
    t = datetime(2025, 1, 1, tzinfo=UTC)
    before = _snapshot(mem)
    assert mem.add("our server is in EAST-1", timestamp=t, **KEY) == east
    assert mem.add(EAST, timestamp=t.timestamp(), entity="Server ", attribute="REGION") == east
    assert mem.add(EAST, timestamp=datetime(2025, 1, 1), **KEY) == east  # naive = UTC
    assert _snapshot(mem) == before
    assert mem.stats().events == 3  # add, add, invalidate: the replays wrote nothing


def test_replay_inside_one_batch(mem: ReMem) -> None:
    ids = mem.add_many([MemoryInput(EAST, timestamp=T_EAST, **KEY), MemoryInput(WEST, timestamp=T_WEST, **KEY)] * 2)
    assert ids[:2] == ids[2:]
    assert mem.stats().memories == 2


def test_replay_with_other_tags_keeps_the_stored_ones_and_warns(mem: ReMem) -> None:
    east, _ = _quickstart(mem)
    with pytest.warns(UserWarning, match="already stored"):
        assert mem.add(EAST, timestamp=T_EAST, task="ops", confidence=0.5, **KEY) == east
    assert mem.get(east).tasks == () and mem.get(east).confidence == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mem.add(EAST, timestamp=T_EAST, **KEY) == east  # an exact replay does not warn


def test_other_roles_with_a_key_replay_too(mem: ReMem) -> None:
    a = mem.add("Alice likes tea.", entity="alice", attribute="likes", role="preference", timestamp=1)
    assert mem.add("Alice likes tea.", entity="alice", attribute="likes", role="preference", timestamp=1) == a
    # same text and time but another role is another claim
    b = mem.add("Alice likes tea.", entity="alice", attribute="likes", role="note", timestamp=1)
    assert b != a and mem.stats().memories == 2


def test_facts_without_a_key_are_not_matched(mem: ReMem) -> None:
    """The rule needs entity+attribute (an indexed lookup); keyless notes are stored again."""
    a = mem.add("Standup is at 10.", role="note", timestamp=1)
    assert mem.add("Standup is at 10.", role="note", timestamp=1) != a


def test_different_timestamp_or_text_is_a_new_claim(mem: ReMem) -> None:
    east, west = _quickstart(mem)
    other = mem.add("Our server is in east-2.", timestamp=T_EAST, **KEY)  # backdated: stored already superseded
    assert other not in (east, west) and mem.get(other).superseded_by == west
    assert mem.get(west).state is State.ACTIVE
