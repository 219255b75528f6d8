"""The per-request shortcuts of the chat path (``remem serve``'s hot path) give what the long way gives.

Each shortcut skips work the profile of the gateway under load showed: the trace line written
without copying the record through ``redact`` when its JSON line holds nothing to redact, the memory block's
dates from a per-day cache, memoised value tokens and conversation keys, the retry loop without tenacity,
one worker-thread hop for a chat call's waiting answer and its trace line, and one hop for a new turn's
settling of the previous answer (newest waiting answer, claim, feedback, outcome line) and its recall. Each test
compares a shortcut with the computation it replaces.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remem_agent import ModelError, ReMem
from remem_agent.adapters import FunctionChatModel, RetryPolicy, call_with_retries
from remem_agent.agent import MemoryAgent, load_traces
from remem_agent.agent import trace as trace_mod
from remem_agent.agent.conversation import _conversation_key, conversation_key, parse_messages, transcript_digest
from remem_agent.agent.prompt import _iso
from remem_agent.agent.trace import _SECRET_VALUES, TraceWriter, _json_escaped, redact
from remem_agent.learning import credit
from remem_agent.outcomes.ledger import LedgerPendingOutcomes

SECRETS = ("sk-bench-0123456789abcdef", 'we"ird\\secret-value', "tab\tsecret-value")


def long_way(writer: TraceWriter, record: Any) -> str:
    """The trace line as it was always made: the record copied through ``redact``, then encoded."""
    line = json.dumps(redact(record, writer._secrets), ensure_ascii=False, default=str)
    for secret in writer._secrets:
        line = line.replace(_json_escaped(secret), "[REDACTED]")
    return line


# one sample per secret value pattern, in order: a pattern added to _SECRET_VALUES needs one here (and, for
# the trace writer's shortcut, its literal start in _SUSPECT_TOKENS), else the count check below fails
PATTERN_SAMPLES = [
    "sk-abcdefgh12345678",
    "Bearer abcdefgh.ijkl",
    "ghp_abcdefghijklmnopqrstuv",
    "xoxb-1234567890-abc",
    "AKIAABCDEFGHIJKLMNOP",
    "AIza" + "x" * 31,
]
TRICKY = [
    *PATTERN_SAMPLES,
    *SECRETS,
    *(_json_escaped(s) for s in SECRETS),
    "api_key", "API-KEY", "x-api-key", "ApiKey", "passWord", "SECRET", "Authorization", "bearer\ttoken-abcdefgh",
    "author\u0130zation", "author\u0131zation", "\u017fecret", "api\u212aey",  # re.IGNORECASE equates them with ASCII
    "\nsk-12345678abc", "task-management", "hf_" + "b" * 17, "plain text", "é", "日本", "\x00", "\u2028",
    "\\u0073k-bench-0123456789abcdef", "%73k-bench-0123456789abcdef", "\\u0073", "%7", "%2", "\\", "\\ud800",
    "\\\\u0073k-abcdefgh12345678", "50% off", "%25", "\\\"",
]  # fmt: skip
texts = st.one_of(st.sampled_from(TRICKY), st.text(max_size=12), st.lists(st.sampled_from(TRICKY)).map("".join))
values = st.recursive(
    st.one_of(texts, st.integers(), st.floats(allow_nan=True), st.none(), st.booleans()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(texts, inner, max_size=3),
        st.dictionaries(texts, inner, max_size=2).map(MappingProxyType),  # a Mapping that is no dict
        st.just({1, 2}),  # encoded through default=str either way
    ),
    max_leaves=12,
)


def test_every_secret_value_pattern_has_a_sample_it_matches() -> None:
    assert len(PATTERN_SAMPLES) == len(_SECRET_VALUES)
    for sample, pattern in zip(PATTERN_SAMPLES, _SECRET_VALUES, strict=True):
        assert pattern.search(f"x {sample} y"), (sample, pattern.pattern)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(texts, values, min_size=1, max_size=5))
def test_the_trace_line_is_the_redacted_line(tmp_path_factory: pytest.TempPathFactory, record: dict[Any, Any]) -> None:
    writer = TraceWriter(tmp_path_factory.mktemp("t") / "t.jsonl", secrets=SECRETS)
    assert writer.line(record) == long_way(writer, record)


ODD_CASE = ["author\u0130zation", "pa\u017f\u017fword", "api\u212aey", "author\u0131zation"]  # re.IGNORECASE


@pytest.mark.parametrize("sample", [*PATTERN_SAMPLES, *SECRETS, "my api_key", "the Password", "SECRET", *ODD_CASE])
def test_a_secret_anywhere_takes_the_long_way(tmp_path: Path, sample: str) -> None:
    writer = TraceWriter(tmp_path / "t.jsonl", secrets=SECRETS)
    for record in ({"text": f"one {sample} two"}, {"nested": [{"deep": (f"\n{sample}",)}]}, {sample: "v"}):
        line = json.dumps(record, ensure_ascii=False)
        assert trace_mod._may_hold_secret(line, writer._secrets), record
        assert writer.line(record) == long_way(writer, record)


def test_an_ordinary_chat_line_is_written_as_encoded(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.jsonl", secrets=SECRETS)
    record = {
        "messages": [{"role": "user", "content": "What is the region of service-12? (request 5)"}],
        "served": [{"id": "m_01", "text": "The region of service-12 is west-2; checked by the platform group."}],
        "reply": {"text": "It is in west-2 [M1].", "tool_calls": []},
        "latency_ms": {"total": 1.5},
    }
    line = json.dumps(record, ensure_ascii=False)
    assert not trace_mod._may_hold_secret(line, writer._secrets)
    writer.write_sync(record)
    writer.write_sync(record)
    assert (tmp_path / "t.jsonl").read_text(encoding="utf-8") == f"{line}\n{line}\n"


def _iso_long_way(t: float) -> str:
    try:
        return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d")
    except (OverflowError, OSError, ValueError):
        return f"epoch {t:.0f}"


def test_memory_dates_from_the_day_cache_are_strftime_dates() -> None:
    rng = random.Random(7)
    midnights = [d * 86400.0 + e for d in (-719162, -1, 0, 1, 19700, 2932896) for e in (-1e-3, -4e-7, -6e-7, 0.0, 4e-7)]
    odd = [math.nan, math.inf, -math.inf, 1e20, -1e20, 253402300799.9999996, -62135596800.0000004]
    for t in [*midnights, *odd, *(rng.uniform(-6.3e10, 2.6e11) for _ in range(20_000))]:
        assert _iso(t) == _iso_long_way(t), t


def carried_long_way(text: str) -> set[str]:
    """``credit.carried_values`` as it was written before its letters-only shortcut and its cache."""
    out: set[str] = set()
    for n, m in enumerate(credit._VALUE_TOKEN.finditer(unicodedata.normalize("NFKC", text))):
        tok = m.group(0)
        low = tok.casefold()
        if low in credit._STOP or len(tok) < 2:
            continue
        if any(ch.isdigit() for ch in tok) or any(ch in tok for ch in "-._:/@") or (n > 0 and tok[0].isupper()):
            out.add(low)
    return out


def test_memoised_value_tokens_and_conversation_keys_are_the_computed_ones() -> None:
    rng = random.Random(3)
    words = ["west-2", "Alice", "v3.2", "10.0.0.1", "the", "of", "Redis", "x", "ids:7", "naïve", "ﬁle-2", "Ⅳ", "x²"]
    chars = "aAzZ019_-.:/@ éÉßİıſK²½五٣ǅﬁⅣ\u0301\u00a0日本Ω"
    for _ in range(3000):
        if rng.random() < 0.5:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
        else:
            text = "".join(rng.choice(chars) for _ in range(rng.randint(0, 30)))
        assert credit.carried_values(text) == carried_long_way(text) == credit.carried_values(text), text
        carried = credit.carried_values(text)
        carried.add("mutated")  # a caller's copy: the cache keeps its own
        assert credit.carried_values(text) == carried_long_way(text)
        used = credit.carried_values_used({"a": text, "b": "west-2 Alice"}, f"{text[:4]} west-2", exclude="Alice")
        fresh = {t.casefold() for t in credit._VALUE_TOKEN.findall(unicodedata.normalize("NFKC", f"{text[:4]} west-2"))}
        fresh -= {"alice"}
        assert used == {m for m, t in (("a", text), ("b", "west-2 Alice")) if carried_long_way(t) & fresh}
    long_text = "Alice v2 " * 1000
    assert credit.carried_values(long_text) == carried_long_way(long_text)
    for system, user in [("", "hi"), ("be brief", "Where is our server?"), ("s" * 5000, "long opening")]:
        msgs = parse_messages([{"role": "system", "content": system}, {"role": "user", "content": user}])
        assert conversation_key(msgs) == _conversation_key.__wrapped__(system, user) == conversation_key(msgs)


async def test_the_retry_loop_keeps_its_rules() -> None:
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    errors = [ModelError("503", status=503, retryable=True), ModelError("429", retryable=True, retry_after=2.0)]
    seen: list[tuple[int, float]] = []

    async def flaky() -> str:
        if errors:
            raise errors.pop(0)
        return "ok"

    policy = RetryPolicy(max_attempts=3, initial_backoff=1.0)
    out = await call_with_retries(flaky, policy, sleep=sleep, on_retry=lambda a, e, w: seen.append((a, w)))
    assert out == "ok" and [a for a, _ in seen] == [1, 2] and [w for _, w in seen] == waits and waits[1] == 2.0
    last = ModelError("down", status=500, retryable=True)

    async def down() -> str:
        raise last

    with pytest.raises(ModelError) as exc:
        await call_with_retries(down, RetryPolicy(max_attempts=2), sleep=sleep)
    assert exc.value is last  # the last attempt's error itself
    calls = {"n": 0}

    async def broken() -> str:
        calls["n"] += 1
        raise KeyError("not a model error")

    with pytest.raises(KeyError):
        await call_with_retries(broken, RetryPolicy(max_attempts=5), sleep=sleep)
    assert calls["n"] == 1
    for attempts in (0, 1):  # at most one attempt either way
        calls["n"] = 0

        async def counted() -> str:
            calls["n"] += 1
            raise ModelError("503", retryable=True)

        with pytest.raises(ModelError):
            await call_with_retries(counted, RetryPolicy(max_attempts=attempts), sleep=sleep)
        assert calls["n"] == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_call_adds_its_waiting_answer_and_trace_line_in_one_thread_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    mem = ReMem(tmp_path / "store")
    mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=2)
    pending = LedgerPendingOutcomes(mem.store)

    async def no_own_hop(*a: Any, **k: Any) -> None:
        raise AssertionError("the waiting answer took a hop of its own")

    monkeypatch.setattr(pending, "add", no_own_hop)
    hops: list[str] = []
    real = asyncio.to_thread

    async def counting(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__qualname__", repr(fn)))
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].")
    agent = MemoryAgent(mem, model, trace=tmp_path / "t.jsonl", pending=pending)
    msgs = [{"role": "user", "content": "Where is our server?"}]
    if stream:
        async with agent.chat_stream(msgs) as s:
            text = "".join([c.text async for c in s])
        reply = s.reply
    else:
        reply = await agent.chat(msgs)
        text = reply.text
    assert reply is not None and text == "It is in west-2 [M1]."
    after_recall = hops[hops.index("Conversations.persist.<locals>.work") :]
    assert after_recall == ["Conversations.persist.<locals>.work"]  # nothing else after the search's own hop
    waiting = await LedgerPendingOutcomes(mem.store).latest(_after(msgs, reply.raw))
    assert waiting is not None and waiting.answer_id == reply.answer_id and waiting.cited_ids == reply.citations
    (line,) = load_traces(tmp_path / "t.jsonl")
    assert line["answer_id"] == reply.answer_id and line["latency_ms"]["total"] > 0 and line["stream"] is stream
    mem.close()


class _LongWayReMem(ReMem):
    """A ReMem whose ``asearch`` is overridden (here: the same call), so the agent takes its long way: the
    previous turn settled through the pending store's async calls and ``afeedback``, then ``asearch``."""

    async def asearch(self, query: str, **kw: Any) -> Any:
        return await super().asearch(query, **kw)


FACTS = [("Our server moved to west-2.", "server", "region"), ("The database is postgres.", "database", "kind")]
TURNS = [
    ("Where is our server?", "It is in west-2 [M1]."),
    ("Thanks. And which database do we run?", "It is postgres [M1]."),  # moved on: a weak success of turn 1
    ("No, that is wrong, we moved off it.", "Sorry."),  # a correction of turn 2
    ("And where was the server again?", "west-2 [M1]."),
]


def _normal(line: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """An outcome trace line without what differs between two runs (times, ids), memory ids as their texts."""
    out = {k: v for k, v in line.items() if k not in ("ts", "answer_id", "search_id", "after_s", "run")}
    out["after_s"] = line["after_s"] is not None
    for key in ("credit", "blame"):
        out[key] = {names[m]: v for m, v in line[key].items()}
    return out


async def _converse(
    mem: ReMem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, turns: list[tuple[str, str]], stream: bool
) -> tuple[list[list[str]], list[dict[str, Any]], dict[str, str]]:
    names = {mem.add(t, entity=e, attribute=a, timestamp=i + 1): t for i, (t, e, a) in enumerate(FACTS)}
    hops: list[str] = []
    real = asyncio.to_thread

    async def counting(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(fn, "__qualname__", repr(fn)))
        return await real(fn, *args, **kwargs)

    replies = iter([r for _, r in turns])
    agent = MemoryAgent(
        mem,
        FunctionChatModel(lambda req: next(replies)),
        trace=tmp_path / f"{type(mem).__name__}.jsonl",
        pending=LedgerPendingOutcomes(mem.store),
    )
    per_turn: list[list[str]] = []
    msgs: list[dict[str, str]] = []
    with monkeypatch.context() as m:
        m.setattr(asyncio, "to_thread", counting)
        for user, _ in turns:
            msgs.append({"role": "user", "content": user})
            hops.clear()
            if stream:
                async with agent.chat_stream(msgs) as s:
                    text = "".join([c.text async for c in s])
            else:
                text = (await agent.chat(msgs)).text
            per_turn.append(list(hops))
            msgs.append({"role": "assistant", "content": text})
        # the last turn again at another agent on the store (another gateway): a retry of that turn settles nothing
        other = MemoryAgent(
            mem,
            FunctionChatModel(lambda req: "west-2 [M1]."),
            trace=tmp_path / f"{type(mem).__name__}.jsonl",
            pending=LedgerPendingOutcomes(mem.store),
        )
        hops.clear()
        await other.chat(msgs[:-1])
        per_turn.append(list(hops))
    outcomes = [ln for ln in load_traces(tmp_path / f"{type(mem).__name__}.jsonl") if ln["kind"] == "outcome"]
    return per_turn, outcomes, names


@pytest.mark.parametrize("stream", [False, True])
async def test_a_new_turn_settles_the_last_answer_and_recalls_in_one_thread_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    fast, slow = ReMem(tmp_path / "fast"), _LongWayReMem(tmp_path / "slow")
    hops, outcomes, names = await _converse(fast, tmp_path, monkeypatch, TURNS, stream)
    long_hops, long_outcomes, long_names = await _converse(slow, tmp_path, monkeypatch, TURNS, stream)
    merged, persist = "Verdicts.settle_and_search", "Conversations.persist.<locals>.work"
    assert hops[0][-1] == persist and merged not in hops[0]  # the opening turn: recall, then its answer
    for later in hops[1:]:
        assert later == [merged, persist], later  # latest, claim, feedback, outcome line and recall: one hop
    assert all(len(h) >= 5 for h in long_hops[1:-1])  # the long way: latest, take, feedback, outcome line, search
    assert [o["reason"] for o in outcomes] == [
        "the user moved on", "the next user turn reads as a correction", "the user moved on"
    ]  # fmt: skip
    assert [_normal(o, names) for o in outcomes] == [_normal(o, long_names) for o in long_outcomes]
    for m in (fast, slow):
        stats = m.stats()
        assert (stats.searches, stats.feedbacks) == (len(TURNS) + 1, len(TURNS) - 1) and m.verify().ok
    assert {names[i]: s for i, s in _states(fast).items()} == {long_names[i]: s for i, s in _states(slow).items()}
    fast.close()
    slow.close()


def _states(mem: ReMem) -> dict[str, tuple[Any, ...]]:
    """Each memory's state and outcome counts per task (no times)."""
    out: dict[str, tuple[Any, ...]] = {}
    for m in mem.list():
        info = mem.inspect(m.id)
        counts = sorted(
            (t, s.retrieved, s.shown, s.credited, s.wasted, s.blamed, round(s.credit_sum, 9), round(s.blame_sum, 9))
            for t, s in info.stats.items()
        )
        out[m.id] = (info.memory.state.value, tuple(counts))
    return out


async def test_a_refused_settlement_releases_its_claim_and_recalls_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mem = ReMem(tmp_path / "store")
    mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=1)
    agent = MemoryAgent(
        mem,
        FunctionChatModel(lambda req: "west-2 [M1]."),
        trace=tmp_path / "t.jsonl",
        pending=LedgerPendingOutcomes(mem.store),
    )
    msgs = [{"role": "user", "content": "Where is our server?"}]
    first = await agent.chat(msgs)
    from remem_agent.errors import StoreError

    def refuse(self: ReMem, *a: Any, **k: Any) -> Any:
        raise StoreError("ledger refused")

    monkeypatch.setattr(ReMem, "feedback", refuse)  # on the class: the one-hop path still applies
    searches = mem.stats().searches
    msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Thanks, and since when?"}]
    with pytest.raises(StoreError, match="ledger refused"):
        await agent.chat(msgs)
    monkeypatch.undo()
    assert mem.stats().searches == searches  # nothing recalled for the refused turn
    thread = _after(msgs[:1], first.raw)
    waiting = await LedgerPendingOutcomes(mem.store).latest(thread)
    assert waiting is not None and waiting.answer_id == first.answer_id  # the claim was released
    lines = load_traces(tmp_path / "t.jsonl")
    assert lines[-1]["error"] == "recall failed: StoreError: ledger refused"
    assert [ln["kind"] for ln in lines] == ["chat", "chat"]  # no outcome line
    second = await agent.chat(msgs)  # the turn again: now it settles
    assert await LedgerPendingOutcomes(mem.store).latest(thread) is None  # settled by the turn
    assert (await LedgerPendingOutcomes(mem.store).latest(_after(msgs, second.raw))).answer_id == second.answer_id  # type: ignore[union-attr]
    assert [ln["kind"] for ln in load_traces(tmp_path / "t.jsonl")][-2:] == ["outcome", "chat"]
    mem.close()


def _after(msgs: list[dict[str, Any]], reply: str, scope: str = "default") -> tuple[str, str]:
    """The thread a chat answer without a conversation id waits under: its request and its reply."""
    history = parse_messages([*msgs, {"role": "assistant", "content": reply}])
    return ("after", f"{scope}|{transcript_digest(history)}")


def test_can_stream_is_the_protocol_check() -> None:
    import typing

    from remem_agent.adapters.base import (
        CHAT_MEMBERS,
        STREAMING_MEMBERS,
        ChatModel,
        StreamingChatModel,
        can_stream,
        check_chat_model,
    )
    from remem_agent.errors import UserInputError

    members = getattr(StreamingChatModel, "__protocol_attrs__", None) or typing._get_protocol_attrs(  # type: ignore[attr-defined]
        StreamingChatModel
    )
    assert set(STREAMING_MEMBERS) == set(members)  # a member added to the protocol must be added there too

    class Full:
        name, adapter, capabilities = "m", "x", None

        async def complete(self, request: Any) -> Any: ...

        def stream(self, request: Any) -> Any: ...

    class NoStream(Full):
        stream = None  # type: ignore[assignment]

    class Raising(Full):
        @property
        def name(self) -> str:  # type: ignore[override]
            raise AttributeError("no name")

    blocked = Full()
    blocked.complete = None  # type: ignore[method-assign,assignment]
    given = type("Given", (), {})()
    for attr in STREAMING_MEMBERS:
        setattr(given, attr, lambda *a: None)
    model = FunctionChatModel(lambda req: "x")
    zoo: list[object] = [Full(), NoStream(), Raising(), blocked, given, model, object(), "text", None]

    def missing(self: Any) -> Any:
        raise AttributeError("not here")

    zoo += [type(f"Missing_{m}", (Full,), {m: property(missing)})() for m in STREAMING_MEMBERS]
    for obj in zoo:
        assert can_stream(obj) is isinstance(obj, StreamingChatModel), obj
    assert can_stream(Full()) and not can_stream(NoStream()) and not can_stream(blocked) and can_stream(given)
    # the chat-model check is the same test over ChatModel's members
    chat_members = getattr(ChatModel, "__protocol_attrs__", None) or typing._get_protocol_attrs(ChatModel)  # type: ignore[attr-defined]
    assert set(CHAT_MEMBERS) == set(chat_members)
    zoo += [type(f"Missing_{m}", (Full,), {m: property(missing)})() for m in CHAT_MEMBERS]
    for obj in zoo:
        try:
            accepted = check_chat_model(obj) is obj
        except UserInputError:
            accepted = False
        assert accepted is isinstance(obj, ChatModel), obj


async def _sse_messages(app: Any, body: dict[str, Any]) -> list[bytes]:
    """The body messages of one streamed chat completion, the ASGI app called as uvicorn calls it (spec 2.3)."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
    }  # fmt: skip
    sent = asyncio.Event()
    out: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if not sent.is_set():
            sent.set()
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(3600)  # the client stays
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200
        elif message.get("body"):
            out.append(message["body"])

    await app(scope, receive, send)
    return out


@pytest.mark.parametrize("include_usage", [False, True])
async def test_ready_sse_frames_go_out_together_as_the_same_bytes(tmp_path: Path, include_usage: bool) -> None:
    from remem_agent.gateway.app import create_app
    from remem_agent.gateway.config import GatewayConfig

    mem = ReMem(tmp_path / "store")
    mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=1)
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name="m")
    app = create_app(GatewayConfig(models=("m",), trace=str(tmp_path / "t.jsonl")), memory=mem, model=model, keys={})
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Where is our server?"}]}
    body |= {"stream": True, "stream_options": {"include_usage": include_usage}}
    messages = await _sse_messages(app, body)
    events = [e for m in messages for e in m.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and b"".join(messages).endswith(b"data: [DONE]\n\n")
    data = [json.loads(e[6:]) for e in events[:-1]]
    deltas = [d["choices"][0]["delta"] for d in data if d["choices"]]
    pieces = ["It ", "is ", "in ", "west-2 ", "[M1]."]
    assert deltas == [{"role": "assistant", "content": ""}, *({"content": p} for p in pieces), {}]
    assert [d["choices"][0]["finish_reason"] for d in data if d["choices"]] == [None] * 6 + ["stop"]
    closing = [*(["usage"] if include_usage else []), "remem"]
    assert [next(k for k in ("usage", "remem") if k in d) for d in data if not d["choices"]] == closing
    # the role chunk travels with the first piece, the closing frames with [DONE]; every other frame alone
    assert [m.count(b"\n\n") for m in messages] == [2, *[1] * 5, len(closing) + 1]
    mem.close()


async def _long_way_chunks(stream: Any, deadline: float) -> Any:
    """``ChatService.chunks`` as it was: ``asyncio.timeout`` armed and cancelled around every chunk."""
    import time

    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError
        try:
            async with asyncio.timeout(left):
                chunk = await stream.__anext__()
        except StopAsyncIteration:
            return
        yield chunk


class _Upstream:
    """A stream whose chunks come as the test releases them (``None``: wait forever; a number: sleep that long)."""

    def __init__(self, plan: list[Any], *, swallow: bool = False) -> None:
        self.plan, self.swallow, self.cancelled = list(plan), swallow, 0

    async def __anext__(self) -> Any:
        if not self.plan:
            raise StopAsyncIteration
        step = self.plan.pop(0)
        try:
            if step is None:
                await asyncio.Event().wait()
            elif isinstance(step, float):
                await asyncio.sleep(step)
        except asyncio.CancelledError:
            self.cancelled += 1
            if not self.swallow:
                raise
        return "chunk"


async def _outcome(make: Callable[[Any, float], Any], plan: list[Any], left: float, **kw: Any) -> tuple[Any, ...]:
    """What consuming the stream gives: the chunks, how it ended, upstream cancellations, the task's cancel count."""
    import time

    up = _Upstream(plan, **kw.pop("upstream", {}))
    got: list[str] = []
    consumer_sleep, external = kw.get("consumer_sleep", 0.0), kw.get("external_cancel", False)

    async def consume() -> str:
        gen = make(up, time.perf_counter() + left)
        try:
            async for c in gen:
                got.append(c)
                if consumer_sleep:
                    await asyncio.sleep(consumer_sleep)  # the consumer past the deadline: never cancelled
            return "done"
        except TimeoutError:
            return "timeout"
        finally:
            await gen.aclose()

    task = asyncio.ensure_future(consume())
    if external:
        await asyncio.sleep(0.005)
        task.cancel()
    done, _ = await asyncio.wait({task}, timeout=30)  # a stream the timer never ended would hang: fail instead
    assert done, "the stream did not end"
    end = "cancelled" if task.cancelled() else task.result()
    return tuple(got), end, up.cancelled, task.cancelling()


def _one_timer_chunks(up: Any, deadline: float) -> Any:
    from types import SimpleNamespace

    from remem_agent.gateway.config import Limits
    from remem_agent.gateway.service import ChatService
    from remem_agent.gateway.upstream import Timing

    timing = Timing(started=deadline - 1.0)
    service = SimpleNamespace(limits=Limits(max_stream_seconds=1.0))
    return ChatService.chunks(service, up, None, SimpleNamespace(timing=timing))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "plan, left, kw",
    [
        (["now", "now", "now"], 5.0, {}),  # a stream that ends in time
        (["now", None], 0.2, {}),  # the next chunk never comes: TimeoutError, the upstream's wait cancelled
        (["now", "now", "now"], 0.2, {"consumer_sleep": 0.3}),  # the consumer, not the upstream, runs late
        (["now", None], 5.0, {"external_cancel": True}),  # someone else cancels: CancelledError, not a timeout
        (["now", None, "now"], 0.2, {"upstream": {"swallow": True}}),  # the upstream ignores the cancellation
    ],
)
async def test_one_stream_timer_is_a_timeout_around_every_chunk(plan: list[Any], left: float, kw: Any) -> None:
    one = await _outcome(_one_timer_chunks, plan, left, **dict(kw))
    long = await _outcome(_long_way_chunks, plan, left, **dict(kw))
    assert one == long, (one, long)


async def test_open_stream_is_stream_reply_without_its_relay() -> None:
    from remem_agent.adapters.base import ChatRequest, StreamChunk, open_stream, stream_reply
    from remem_agent.adapters.fakes import FAKE_CAPABILITIES

    class Iterating(FunctionChatModel):
        def stream(self, request: Any) -> Any:  # an async iterator, not an async generator function
            return _Iter([StreamChunk(text="a"), StreamChunk(text="b", finish_reason="stop")])

    class Whole(FunctionChatModel):  # no streaming: one chunk holding the reply
        pass

    class _Iter:
        def __init__(self, items: list[StreamChunk]) -> None:
            self.items = items

        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> StreamChunk:
            if not self.items:
                raise StopAsyncIteration
            return self.items.pop(0)

    from dataclasses import replace as dc_replace

    req = ChatRequest(messages=(), max_tokens=None)
    models = [
        FunctionChatModel(lambda r: "It is in west-2 [M1]."),
        Iterating(lambda r: "unused"),
        Whole(lambda r: "one piece", capabilities=dc_replace(FAKE_CAPABILITIES, streaming=False)),
    ]
    for model in models:
        direct = open_stream(model, req)
        assert [c async for c in direct] == [c async for c in stream_reply(model, req)]
    gen = open_stream(models[0], req)
    assert gen.ag_code is FunctionChatModel.stream.__code__  # the model's own generator: no relay
    for model in models[1:]:
        assert open_stream(model, req).ag_code is stream_reply.__code__  # type: ignore[attr-defined]
    await gen.aclose()
