"""Property tests of the public surfaces under odd input (bad input through the API).

For ``add``/``add_many``/``search``/``feedback``/``inspect``/``get``/``list`` and the MCP tools (called in
process, directly and through the real MCP server object):

* every call either succeeds or raises a ``RememError`` subclass (never a bare UnicodeEncodeError,
  OverflowError, TypeError, ...);
* a refused call changes nothing: ``stats()`` and ``list()`` are equal before and after;
* whatever is accepted can be rendered (``to_dict("iso")``, the prompt, the MCP answer as JSON);
* ``verify()`` is ok at the end.

Each test builds one hash-embedder store in ``tmp_path`` and runs its property against it, so the store
accumulates what earlier examples added. Size: the hypothesis profile from tests/conftest.py, "ci"
(300 examples per property) by default; a bigger run::

    HYPOTHESIS_PROFILE=nightly python -m pytest tests/test_bad_input_properties.py
"""

from __future__ import annotations

import asyncio
import json
import math
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remem_agent import MemoryInput, ReMem
from remem_agent._time import MAX_EPOCH, MIN_EPOCH, to_epoch
from remem_agent.agent.prompt import render_memories
from remem_agent.embedders.hash_embedder import ConceptHashEmbedder
from remem_agent.errors import RememError, UserInputError
from remem_agent.types import iso_time
from remem_agent.validate import MAX_INT, MAX_TEXT_CHARS

mcp_server = pytest.importorskip("remem_agent.integrations.mcp_server")
mcp_tools = pytest.importorskip("remem_agent.integrations.mcp_tools")

# The store is shared by the examples of one test on purpose (it grows as they run).
PROPERTY = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _long(n: int) -> str:
    """Too long (refused), or long but fine (140,000 characters): built lazily, so reprs stay short."""
    return "x" * n if n > MAX_TEXT_CHARS else "server " * n


def pick(data: st.DataObject, values: list[str], *, max_size: int = 3) -> list[str]:
    """Some of ``values`` (the store's current ids), drawn as indexes so the choices do not depend on the
    store's state (hypothesis replays an example against a store that has grown since)."""
    idx = data.draw(st.lists(st.integers(0, 10**6), max_size=max_size))
    return [values[i % len(values)] for i in idx] if values else []


def one_of_or(data: st.DataObject, values: list[str], other: st.SearchStrategy[Any]) -> Any:
    """One of ``values`` (drawn as an index) or a value of ``other``."""
    # every draw happens whatever the store holds, so a replay against a grown store draws the same sequence
    use_known, i, alternative = data.draw(st.booleans()), data.draw(st.integers(0, 10**6)), data.draw(other)
    return values[i % len(values)] if use_known and values else alternative


# -- strategies ------------------------------------------------------------------------------------------
SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
SPECIAL = st.sampled_from(["\x00", "\ud800", "\udfff", "\n", "\r", "\t", " ", "*", "\u200b", "\ufeff", "é", "🚀"])
CHARS = st.one_of(st.characters(), SURROGATES, SPECIAL)
WORDS = st.sampled_from(["server", "region", "east-1", "west-2", "moved to", "also uses", "Our", "the", "db"])
SENTENCE = st.lists(WORDS, min_size=1, max_size=6).map(" ".join)

ODD_TEXT = st.one_of(
    SENTENCE,  # plenty of valid facts, so the store and the searches have content
    st.text(CHARS, max_size=30),
    st.sampled_from(["", " ", "\n\t ", "*"]),
    st.sampled_from([MAX_TEXT_CHARS + 1, 20_000]).map(_long),
    st.none(),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.binary(max_size=4),
    st.lists(st.text(max_size=3), max_size=2),
)
HUGE_INTS = st.sampled_from([10**400, -(10**400), 2**63, 2**63 - 1, -(2**63), MAX_INT, MAX_INT + 1, 2**1024])
ODD_NUMBER = st.one_of(
    st.integers(-3, 1200),
    st.integers(),
    HUGE_INTS,
    st.floats(),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 0.5, 1.0, 1e308, 5e-324]),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.builds(np.float64, st.floats()),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(Fraction, st.integers(0, 3), st.integers(1, 3)),
    st.builds(Decimal, st.integers(0, 1)),
)
OFFSETS = st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)).map(
    timezone
)
TZ = st.one_of(st.none(), OFFSETS, st.timezones())
DATETIMES = st.one_of(
    st.datetimes(timezones=TZ),
    st.datetimes(min_value=datetime(9999, 12, 30), timezones=TZ),
    st.datetimes(max_value=datetime(1, 1, 2), timezones=TZ),
)
ODD_TIME = st.one_of(
    st.none(),
    st.floats(),
    st.integers(),
    HUGE_INTS,
    st.floats(min_value=MIN_EPOCH, max_value=MAX_EPOCH),
    st.floats(min_value=MIN_EPOCH * 1001, max_value=MAX_EPOCH * 1001),  # mostly epoch milliseconds
    st.sampled_from([1e12, -1e12, 1.7e15, MIN_EPOCH, MAX_EPOCH, MIN_EPOCH - 1, MAX_EPOCH + 0.5, MAX_EPOCH + 1]),
    DATETIMES,
    DATETIMES.map(lambda d: d.isoformat()),
    DATETIMES.map(lambda d: d.isoformat().replace("+00:00", "Z")),
    st.sampled_from(["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00", "1700000000", "now", "Z", ""]),
    st.text(CHARS, max_size=25),
    st.booleans(),
    st.dates(),
    st.timedeltas(),
)
ODD_KEY = st.one_of(st.none(), st.sampled_from(["server", "Server ", "region", "db"]), ODD_TEXT)
ODD_ROLE = st.one_of(st.sampled_from(["state", "preference", "note"]), ODD_TEXT)
ODD_TASK = st.one_of(
    st.none(),
    st.sampled_from(["ops", "support", "*", " ops ", "a\nb", "x" * 129]),
    ODD_TEXT,
    st.lists(st.one_of(st.sampled_from(["ops", "support"]), ODD_TEXT), max_size=3),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
    st.binary(max_size=3),
)
FACT_FIELDS = {
    "text": ODD_TEXT,
    "entity": ODD_KEY,
    "attribute": ODD_KEY,
    "role": ODD_ROLE,
    "task": ODD_TASK,
    "timestamp": ODD_TIME,
    "confidence": ODD_NUMBER,
}
ODD_ITEM = st.one_of(
    ODD_TEXT,
    st.fixed_dictionaries({"text": ODD_TEXT}, optional={k: v for k, v in FACT_FIELDS.items() if k != "text"}),
    st.dictionaries(st.one_of(st.sampled_from([*sorted(FACT_FIELDS), "bogus"]), st.integers()), ODD_TEXT, max_size=3),
    st.builds(MemoryInput, **FACT_FIELDS),
    st.integers(),
    st.none(),
)
ODD_CONTAINER = st.one_of(
    st.integers(),
    st.floats(),
    st.none(),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.dictionaries(st.text(max_size=4), ODD_TEXT, max_size=2),
    st.builds(MemoryInput, SENTENCE),
    st.sets(st.text(max_size=4), max_size=3),
)
JSON_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    HUGE_INTS,
    st.floats(allow_nan=False),
    st.text(CHARS, max_size=20),
    SENTENCE,
)
JSON_VALUE = st.recursive(JSON_SCALAR, lambda inner: st.lists(inner, max_size=3), max_leaves=5)


# -- the property ----------------------------------------------------------------------------------------
def _state(mem: ReMem) -> tuple[Any, ...]:
    return (mem.stats(), mem.list())


def refused_or_done(mem: ReMem, call: Callable[[], Any]) -> tuple[bool, Any]:
    """Run ``call``: it succeeds, or raises a RememError and leaves the store exactly as it was."""
    before = _state(mem)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # additive wording, replays: not what is tested here
            out = call()
    except RememError:
        assert _state(mem) == before, "a refused call changed the store"
        return False, None
    return True, out


def rendered(mem: ReMem, memory_ids: list[str]) -> None:
    """Whatever was accepted can be shown: ISO records, the prompt block, the MCP JSON answer."""
    for m in (mem.get(i) for i in memory_ids):
        json.dumps(m.to_dict("iso"))
        json.dumps(mcp_tools._memory_dict(m))


@pytest.fixture()
def mem(tmp_path: Path) -> Iterator[ReMem]:
    m = ReMem(tmp_path / "store", embedder=ConceptHashEmbedder())
    m.add_many(
        [
            MemoryInput("Our server is in east-1.", "server", "region", timestamp=1000),
            MemoryInput("Our server moved to west-2.", "server", "region", timestamp=2000),
            MemoryInput("The db is Postgres 16.", "db", "version", role="note"),
        ]
    )
    yield m
    assert m.verify().ok, m.verify().problems
    m.close()


def test_add(mem: ReMem) -> None:
    @PROPERTY
    @given(**FACT_FIELDS)
    def prop(**fact: Any) -> None:
        ok, mid = refused_or_done(mem, lambda: mem.add(**fact))
        if ok:
            rendered(mem, [mid])

    prop()


def test_add_many_items(mem: ReMem) -> None:
    @PROPERTY
    @given(st.one_of(st.lists(ODD_ITEM, max_size=4), st.tuples(ODD_ITEM, ODD_ITEM)))
    def prop(items: Any) -> None:
        ok, ids = refused_or_done(mem, lambda: mem.add_many(items))
        if ok:
            assert len(ids) == len(items)
            rendered(mem, ids)

    prop()


def test_add_many_containers(mem: ReMem) -> None:
    @PROPERTY
    @given(ODD_CONTAINER)
    def prop(items: Any) -> None:
        ok, _ = refused_or_done(mem, lambda: mem.add_many(items))
        assert not ok, f"add_many({items!r}) should be refused: not a list of facts"

    prop()


def test_search(mem: ReMem) -> None:
    @PROPERTY
    @given(
        query=ODD_TEXT,
        k=st.one_of(st.none(), ODD_NUMBER),
        task=st.one_of(st.none(), ODD_TEXT),
        as_of=ODD_TIME,
        now=ODD_TIME,
        token_budget=st.one_of(st.none(), ODD_NUMBER),
        explain=st.booleans(),
    )
    def prop(**args: Any) -> None:
        ok, res = refused_or_done(mem, lambda: mem.search(**args))
        if ok:
            render_memories(res.items)
            json.dumps([mcp_tools._memory_dict(h) for h in res.items])

    prop()


def test_feedback(mem: ReMem) -> None:
    @PROPERTY
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        res = mem.search("Where is our server?", task=data.draw(st.sampled_from([None, "ops"])))
        odd_ids = st.one_of(st.none(), st.lists(ODD_TEXT, max_size=2), ODD_TEXT, st.dictionaries(WORDS, WORDS))

        def ids() -> Any:
            return pick(data, list(res.ids)) if data.draw(st.booleans()) else data.draw(odd_ids)

        search_id = one_of_or(data, [res.search_id], ODD_TEXT)
        success = data.draw(st.one_of(st.booleans(), st.builds(np.bool_, st.booleans()), ODD_NUMBER, ODD_TEXT))
        kwargs = {
            "used_ids": ids(),
            "cited_ids": ids(),
            "weight": data.draw(st.one_of(st.just(1.0), ODD_NUMBER)),
            "source": data.draw(st.one_of(st.just("api"), st.sampled_from(["truth", "user", "inferred"]), ODD_TEXT)),
            "answer": data.draw(st.one_of(st.none(), JSON_VALUE)),
        }
        refused_or_done(mem, lambda: mem.feedback(search_id, success=success, **kwargs))
        # the same again: identical = repeated receipt, different = FeedbackConflictError, never anything else
        refused_or_done(mem, lambda: mem.feedback(search_id, success=success, **kwargs))

    prop()


def test_lookups(mem: ReMem) -> None:
    known = [m.id for m in mem.list()]

    @PROPERTY
    @given(
        memory_id=st.one_of(st.sampled_from(known), ODD_TEXT, st.sampled_from(known).map(lambda i: i + "\ud800")),
        state=st.one_of(st.none(), st.sampled_from(["active", "INVALIDATED", "archived"]), ODD_TEXT),
        role=st.one_of(st.none(), ODD_ROLE),
        limit=st.one_of(st.none(), ODD_NUMBER),
        offset=st.one_of(st.just(0), ODD_NUMBER),
    )
    def prop(memory_id: Any, state: Any, role: Any, limit: Any, offset: Any) -> None:
        ok, info = refused_or_done(mem, lambda: mem.inspect(memory_id))
        if ok:
            json.dumps(mcp_tools._info_dict(info))
        refused_or_done(mem, lambda: mem.get(memory_id))
        ok, rows = refused_or_done(mem, lambda: mem.list(state, role=role, limit=limit, offset=offset))
        if ok:
            json.dumps([m.to_dict("iso") for m in rows])

    prop()


def test_erase(mem: ReMem) -> None:
    known = [m.id for m in mem.list()]
    filters = st.one_of(st.none(), ODD_TEXT, st.sampled_from(["server", "region", "note", "state"]))

    @PROPERTY
    @given(
        ids=st.one_of(
            st.none(), st.sampled_from(known), st.lists(st.one_of(st.sampled_from(known), ODD_TEXT)), ODD_CONTAINER
        ),
        scope=st.one_of(st.none(), st.just("default"), ODD_TEXT),
        whole_scope=st.one_of(st.just(False), st.booleans(), ODD_NUMBER),
        entity=filters,
        role=st.one_of(st.none(), ODD_ROLE),
        contains=st.one_of(st.none(), ODD_TEXT, st.just("Postgres")),
        reason=st.one_of(st.just("test"), ODD_TEXT),
        scrub=st.one_of(st.just(False), st.booleans(), ODD_NUMBER),
    )
    def prop(**args: Any) -> None:
        ok, report = refused_or_done(mem, lambda: mem.erase(**args))
        if ok:
            json.dumps(report.to_dict())
            assert all(mem.get(i).state.value == "ERASED" for i in report.erased)

    prop()


def test_time_conversion() -> None:
    @PROPERTY
    @given(ODD_TIME)
    def prop(value: Any) -> None:
        try:
            t = to_epoch(value, name="timestamp")
        except UserInputError as exc:
            assert str(exc).startswith("timestamp")
            return
        if t is not None:
            assert MIN_EPOCH <= t <= MAX_EPOCH
            assert iso_time(t)

    prop()


# -- the MCP tools ---------------------------------------------------------------------------------------
def test_mcp_tools_in_process(mem: ReMem) -> None:
    tools = mcp_server.RememTools(mem)

    @PROPERTY
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        tool = data.draw(st.sampled_from(["remember", "recall", "feedback", "inspect", "list_memories"]))
        if tool == "remember":
            args = {k: data.draw(FACT_FIELDS[k]) for k in ("text", "entity", "attribute", "role", "task", "timestamp")}
        elif tool == "recall":
            args = {
                "query": data.draw(ODD_TEXT),
                "k": data.draw(st.one_of(st.none(), ODD_NUMBER)),
                "task": data.draw(st.one_of(st.none(), st.just("ops"), ODD_TEXT)),
                "as_of": data.draw(ODD_TIME),
                "token_budget": data.draw(st.one_of(st.none(), ODD_NUMBER)),
            }
        elif tool == "feedback":
            args = {
                "search_id": one_of_or(data, tools.pending_recalls(), ODD_TEXT),
                "success": data.draw(st.one_of(st.booleans(), ODD_NUMBER)),
                "used_ids": data.draw(st.one_of(st.none(), st.lists(ODD_TEXT, max_size=2), ODD_TEXT)),
                "cited_ids": data.draw(st.one_of(st.none(), st.lists(ODD_TEXT, max_size=2))),
            }
        elif tool == "inspect":
            args = {"memory_id": one_of_or(data, [m.id for m in mem.list()], ODD_TEXT)}
        else:
            args = {
                "state": data.draw(st.one_of(st.none(), st.sampled_from(["ACTIVE", "INVALIDATED"]), ODD_TEXT)),
                "role": data.draw(st.one_of(st.none(), ODD_ROLE)),
                "limit": data.draw(st.one_of(st.just(50), ODD_NUMBER)),
                "offset": data.draw(st.one_of(st.just(0), ODD_NUMBER)),
            }
        ok, out = refused_or_done(mem, lambda: getattr(tools, tool)(**args))
        if ok:
            json.dumps(out)
            assert "error_after_write" not in out

    prop()


def test_mcp_server_tool_errors_name_the_cause(mem: ReMem) -> None:
    from mcp.server.mcpserver.exceptions import ToolError

    tools = mcp_server.RememTools(mem)
    server = mcp_server.build_server(tools)
    schema_args = {
        "remember": ["text", "entity", "attribute", "role", "task", "timestamp"],
        "recall": ["query", "k", "task", "as_of", "token_budget"],
        "inspect": ["memory_id"],
        "list_memories": ["state", "role", "limit", "offset"],
        "feedback": ["search_id", "success", "used_ids", "cited_ids"],
    }

    @PROPERTY
    @given(st.data())
    def prop(data: st.DataObject) -> None:
        tool = data.draw(st.sampled_from(sorted(schema_args)))
        names = schema_args[tool]
        args = data.draw(st.fixed_dictionaries({}, optional={n: JSON_VALUE for n in names}))
        before = _state(mem)
        try:
            out = asyncio.run(server.call_tool(tool, args))
        except ToolError as exc:
            message = str(exc)
            assert _state(mem) == before, f"{tool} reported failure but changed the store: {message}"
            assert "internal error" not in message, message
            assert len(message) > len(f"Error executing tool {tool}: "), message
            return
        assert not getattr(out, "is_error", False)

    prop()
