"""Bad input through the public API, one named case per class the property fuzz found.

Each case must raise a ``RememError`` subclass (never a bare UnicodeEncodeError, OverflowError or
TypeError) and change nothing; values at the documented limits must be accepted *and* renderable.
The hypothesis versions are in test_bad_input_properties.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from remem_agent import MemoryInput, ReMem
from remem_agent._time import MAX_EPOCH, MIN_EPOCH, to_epoch
from remem_agent.agent.prompt import render_memories
from remem_agent.embedders.hash_embedder import ConceptHashEmbedder
from remem_agent.errors import RememError, StoreError, UserInputError
from remem_agent.ingest import insert_fact
from remem_agent.types import iso_time
from remem_agent.validate import (
    MAX_INT,
    MAX_TEXT_CHARS,
    CleanFact,
    check_fraction,
    check_int,
    check_weight,
    validate_facts,
)

StoreLocation = Callable[[str], "str | Path"]
SURROGATE = "\ud800"


@pytest.fixture()
def mem(tmp_path: Path) -> Iterator[ReMem]:
    m = ReMem(tmp_path / "store", embedder=ConceptHashEmbedder())
    m.add("Our server is in east-1.", entity="server", attribute="region", timestamp=1000)
    yield m
    m.close()


def _state(mem: ReMem) -> tuple[Any, ...]:
    return (mem.stats(), mem.list())


def _refused(mem: ReMem, call: Callable[[], object], match: str | None = None) -> UserInputError:
    before = _state(mem)
    with pytest.raises(UserInputError, match=match) as info:
        call()
    assert _state(mem) == before
    return info.value


# -- text that cannot be stored ----------------------------------------------------------------------------
TEXT_CASES: dict[str, Callable[[ReMem, str], object]] = {
    "add-text": lambda m, s: m.add(s),
    "add-entity": lambda m, s: m.add("x", entity=s, attribute="a"),
    "add-attribute": lambda m, s: m.add("x", entity="e", attribute=s),
    "add-task": lambda m, s: m.add("x", task=s),
    "add-task-list": lambda m, s: m.add("x", task=["ok", s]),
    "add_many-dict": lambda m, s: m.add_many([{"text": "ok"}, {"text": s}]),
    "add_conversation": lambda m, s: m.add_conversation(f"hello. {s}"),
    "search-query": lambda m, s: m.search(s),
    "search-task": lambda m, s: m.search("server", task=s),
    "inspect-id": lambda m, s: m.inspect(s),
    "get-id": lambda m, s: m.get(s),
    "feedback-search_id": lambda m, s: m.feedback(s, success=True),
    "feedback-used_ids": lambda m, s: m.feedback(m.search("server").search_id, success=True, used_ids=[s]),
    "timestamp-string": lambda m, s: m.add("x", timestamp=s),
}


@pytest.mark.parametrize("case", sorted(TEXT_CASES))
@pytest.mark.parametrize("bad", [SURROGATE, "a\udfffb", "a\x00b"], ids=["surrogate", "low-surrogate", "nul"])
def test_unstorable_text_is_refused(mem: ReMem, case: str, bad: str) -> None:
    call = TEXT_CASES[case]
    if case.startswith("feedback-used"):
        sid = mem.search("server").search_id  # the search itself is allowed to be recorded
        _refused(mem, lambda: mem.feedback(sid, success=True, used_ids=[bad]))
    else:
        _refused(mem, lambda: call(mem, bad))


def test_surrogate_message_names_argument_and_position(mem: ReMem) -> None:
    err = _refused(mem, lambda: mem.add("ok " + SURROGATE))
    assert "text" in str(err) and "position 3" in str(err) and "surrogate" in str(err)


def test_text_length_limit(mem: ReMem) -> None:
    _refused(mem, lambda: mem.add("x" * (MAX_TEXT_CHARS + 1)), match="too long")
    _refused(mem, lambda: mem.search("x" * (MAX_TEXT_CHARS + 1)), match="too long")
    _refused(mem, lambda: mem.add("x", entity="e" * 1001, attribute="a"), match="too long")


@pytest.mark.parametrize("bad", ["", "   ", None, 5, b"bytes", ["x"]], ids=repr)
def test_empty_or_non_string_text(mem: ReMem, bad: object) -> None:
    _refused(mem, lambda: mem.add(bad))  # type: ignore[arg-type]
    _refused(mem, lambda: mem.search(bad))  # type: ignore[arg-type]
    _refused(mem, lambda: mem.inspect(bad))  # type: ignore[arg-type]


def test_valid_unicode_is_accepted(mem: ReMem) -> None:
    mid = mem.add("Café 🚀 naïve — 東京", entity="ünïcode", attribute="größe", task="tâche")
    assert mem.get(mid).text == "Café 🚀 naïve — 東京"
    assert mem.search("Café 🚀").items


# -- the store boundary ------------------------------------------------------------------------------------
def test_store_read_maps_driver_errors(store_location: StoreLocation) -> None:
    with ReMem(store_location("s")) as mem:
        with pytest.raises(UserInputError, match="UTF-8"), mem.store.read() as tx:
            tx.memory(SURROGATE)
        with pytest.raises(StoreError), mem.store.read() as tx:
            tx.run("SELECT * FROM no_such_table")
        assert mem.verify().ok  # the store is usable afterwards
        assert mem.add("still works") and mem.stats().memories == 1


# -- numbers -----------------------------------------------------------------------------------------------
NUMBER_CASES: dict[str, Callable[[ReMem], object]] = {
    "confidence-huge-int": lambda m: m.add("x", confidence=10**400),
    "confidence-nan": lambda m: m.add("x", confidence=math.nan),
    "confidence-inf": lambda m: m.add("x", confidence=math.inf),
    "confidence-negative": lambda m: m.add("x", confidence=-0.1),
    "confidence-bool": lambda m: m.add("x", confidence=True),
    "confidence-str": lambda m: m.add("x", confidence="1"),  # type: ignore[arg-type]
    "timestamp-huge-int": lambda m: m.add("x", timestamp=10**400),
    "timestamp-nan": lambda m: m.add("x", timestamp=math.nan),
    "timestamp-inf": lambda m: m.add("x", timestamp=-math.inf),
    "list-limit-2**63": lambda m: m.list(limit=2**63),
    "list-offset-2**63": lambda m: m.list(offset=2**63),
    "list-limit-negative": lambda m: m.list(limit=-1),
    "search-k-10**30": lambda m: m.search("x", k=10**30),
    "search-k-2**31": lambda m: m.search("x", k=MAX_INT + 1),
    "search-k-zero": lambda m: m.search("x", k=0),
    "search-k-float": lambda m: m.search("x", k=2.0),  # type: ignore[arg-type]
    "search-budget-10**30": lambda m: m.search("x", token_budget=10**30),
    "search-budget-bool": lambda m: m.search("x", token_budget=True),
}


@pytest.mark.parametrize("case", sorted(NUMBER_CASES))
def test_bad_numbers_are_refused(mem: ReMem, case: str) -> None:
    _refused(mem, lambda: NUMBER_CASES[case](mem))


def test_numbers_at_the_limits_are_accepted(mem: ReMem) -> None:
    assert mem.search("server", k=MAX_INT, token_budget=MAX_INT).items
    assert mem.list(limit=MAX_INT, offset=0) and mem.list(offset=MAX_INT) == []
    mem.add("zero confidence", confidence=0)
    mem.add("full confidence", confidence=1)


def test_weight_check_helper() -> None:
    """``feedback(weight=)`` is checked inline in memory.py today; the helper it should call."""
    for bad in (10**400, -(10**400), 0, 0.0, -1, 1.5, math.nan, math.inf, True, "1", None):
        with pytest.raises(UserInputError):
            check_weight(bad)
    assert check_weight(1) == 1.0 and check_weight(0.3) == 0.3
    assert check_fraction(0, "confidence") == 0.0
    with pytest.raises(UserInputError, match="1329 bits"):
        check_int(10**400, "k", minimum=1)


def test_feedback_weight_huge_int_is_refused(mem: ReMem) -> None:
    sid = mem.search("server").search_id
    _refused(mem, lambda: mem.feedback(sid, success=True, weight=10**400))


def test_feedback_answer_with_a_huge_int_is_not_a_bare_error(mem: ReMem) -> None:
    sid = mem.search("server").search_id
    before = _state(mem)
    with contextlib.suppress(RememError):  # accepted or refused, but typed
        mem.feedback(sid, success=True, answer={"region": 10**5000})
        return
    assert _state(mem) == before


# -- add_many's container ----------------------------------------------------------------------------------
BAD_CONTAINERS: dict[str, object] = {
    "int": 5,
    "str": "abc",
    "bytes": b"ab",
    "dict": {"text": "x"},
    "MemoryInput": MemoryInput("x"),
    "None": None,
}


@pytest.mark.parametrize("case", sorted(BAD_CONTAINERS))
def test_validate_facts_takes_only_a_list(case: str) -> None:
    with pytest.raises(UserInputError, match="add_many takes a list"):
        validate_facts(BAD_CONTAINERS[case])


def test_validate_facts_accepts_lists_tuples_and_generators() -> None:
    assert len(validate_facts(["a", {"text": "b"}, MemoryInput("c")])) == 3
    assert len(validate_facts(("a", "b"))) == 2
    assert len(validate_facts(t for t in ["a"])) == 1
    with pytest.raises(UserInputError, match=r"unknown fields \['x', 1\]"):
        validate_facts([{"text": "a", 1: 2, "x": 3}])  # mixed-type keys: no TypeError while sorting


@pytest.mark.parametrize("case", sorted(set(BAD_CONTAINERS) - {"bytes"}))  # bytes: refused per item already
def test_add_many_takes_only_a_list(mem: ReMem, case: str) -> None:
    _refused(mem, lambda: mem.add_many(BAD_CONTAINERS[case]))  # type: ignore[arg-type]


# -- timestamps that could be stored but not rendered ------------------------------------------------------
TIME_CASES: dict[str, tuple[object, str]] = {
    "epoch-ms": (1e12, "milliseconds: divide by 1000"),
    "epoch-ms-negative": (-1e12, "milliseconds"),
    "epoch-ms-now": (1_700_000_000_000, "milliseconds"),
    "epoch-us": (1.7e15, "microseconds"),
    "epoch-ns": (1.7e18, "nanoseconds"),
    "aware-iso-past-9999": ("9999-12-31T23:59:59-05:00", "offset"),
    "aware-iso-before-year-1": ("0001-01-01T00:00:00+05:00", "offset"),
    "aware-datetime-past-9999": (datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-2))), "offset"),
    "datetime-max": (datetime.max, "after 9999-12-31"),
    "epoch-string": ("1700000000", "as a number"),
    "garbage-string": ("next tuesday", "ISO-8601"),
    "bool": (True, "bool"),
}


@pytest.mark.parametrize("case", sorted(TIME_CASES))
def test_unrenderable_times_are_refused_with_a_hint(mem: ReMem, case: str) -> None:
    value, hint = TIME_CASES[case]
    err = _refused(mem, lambda: mem.add("x", timestamp=value))  # type: ignore[arg-type]
    assert hint in str(err)
    _refused(mem, lambda: mem.search("server", now=value), match="now")  # type: ignore[arg-type]
    _refused(mem, lambda: mem.search("server", as_of=value), match="as_of")  # type: ignore[arg-type]


LIMIT_TIMES: list[object] = [
    MIN_EPOCH,
    MAX_EPOCH,
    int(MAX_EPOCH),
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "9999-12-31T23:59:59+00:00",
    datetime(1, 1, 1),
    datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
    "9999-12-31T20:00:00-03:00",
]


@pytest.mark.parametrize("value", LIMIT_TIMES, ids=repr)
def test_times_at_the_limits_are_accepted_and_renderable(mem: ReMem, value: Any) -> None:
    t = to_epoch(value, name="timestamp")
    assert t is not None and MIN_EPOCH <= t <= MAX_EPOCH
    mid = mem.add(f"fact at {value!r}", timestamp=value)
    m = mem.get(mid)
    assert m.to_dict("iso")["valid_from"] == iso_time(t)
    hits = mem.search(f"fact at {value!r}", now=MAX_EPOCH, k=50).items
    assert render_memories(hits)
    assert mem.search("fact", as_of=value, now=value).search_id
    assert all(x.to_dict("iso") for x in mem.list())


# -- the MCP tools -----------------------------------------------------------------------------------------
mcp_server = pytest.importorskip("remem_agent.integrations.mcp_server")


@pytest.fixture()
def tools(mem: ReMem) -> Any:
    return mcp_server.RememTools(mem)


def _tool(tools: Any, name: str, args: dict[str, Any]) -> Any:
    """Call a tool through the real MCP server object, in process (ToolError when it fails)."""
    return asyncio.run(mcp_server.build_server(tools).call_tool(name, args))


def test_mcp_remember_bad_timestamp_fails_and_writes_nothing(tools: Any) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    before = _state(tools.memory)
    for ts in (1e12, "9999-12-31T23:59:59-05:00"):
        with pytest.raises(ToolError, match="UserInputError: timestamp"):
            _tool(
                tools,
                "remember",
                {"text": "Our server moved to west-2.", "entity": "server", "attribute": "region", "timestamp": ts},
            )
    assert _state(tools.memory) == before


def test_mcp_non_remem_errors_name_the_cause(tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    def broken(**_: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(tools.memory, "stats", broken)
    with pytest.raises(ToolError, match=r"internal error.*RuntimeError: disk on fire"):
        _tool(tools, "stats", {})


def test_mcp_remember_after_the_write_never_reports_failure(tools: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(memory_id: str, **_: object) -> None:
        raise RuntimeError("cannot read back")

    monkeypatch.setattr(tools.memory, "inspect", broken)
    out = tools.remember("A new fact.")
    assert out["id"] and "RuntimeError: cannot read back" in out["error_after_write"]
    assert tools.memory.stats().memories == 2  # written, and reported as written


def test_mcp_renders_legacy_rows_with_unrenderable_times(tools: Any) -> None:
    """A ledger written before the range check may hold year-33658 times: the tools still serve them."""
    mem = tools.memory
    c = CleanFact("A legacy fact from milliseconds.", "legacy", "when", "state", (), -1e12, 1.0)  # valid now
    vec = mem.embedder.embed([c.text])[0]
    mid = mem.store.transact(lambda tx: insert_fact(tx, c, vec, [], mem.config.staleness))
    listed = tools.list_memories()
    assert mid in [m["id"] for m in listed["memories"]]
    legacy = next(m for m in listed["memories"] if m["id"] == mid)
    assert legacy["valid_from"] == -1e12 and legacy["validity"]["from"] == -1e12
    assert tools.inspect(mid)["id"] == mid
    hits = tools.recall("legacy fact from milliseconds", k=5)
    assert mid in hits["ids"]


def test_mcp_replayed_remember_is_not_new(tools: Any) -> None:
    first = tools.remember("Our server moved to west-2.", entity="server", attribute="region", timestamp=2000)
    assert first["new"] and first["supersedes"]
    again = tools.remember("Our server is in east-1.", entity="server", attribute="region", timestamp=1000)
    assert not again["new"] and again["supersedes"] == [] and again["state"] == "INVALIDATED"
    assert tools.memory.get(first["id"]).state.value == "ACTIVE"


def test_every_error_here_is_a_remem_error() -> None:
    assert issubclass(UserInputError, RememError) and issubclass(StoreError, RememError)
