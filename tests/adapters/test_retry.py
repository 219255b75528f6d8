"""The one retry layer and the fault paths end to end through MemoryAgent + OpenAIChat."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import pytest

from remem_agent import ModelError, ReMem
from remem_agent.adapters import RetryPolicy, call_with_retries
from remem_agent.agent import MemoryAgent, load_traces


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, s: float) -> None:
        self.waits.append(s)


def failing(errors: list[Exception], result: str = "ok"):  # type: ignore[no-untyped-def]
    calls = {"n": 0}

    async def fn() -> str:
        calls["n"] += 1
        if errors:
            raise errors.pop(0)
        return result

    return fn, calls


async def test_retryable_errors_are_retried_with_bounded_jittered_backoff() -> None:
    sleeps = Sleeps()
    fn, calls = failing([ModelError("503", status=503, retryable=True)] * 3)
    policy = RetryPolicy(max_attempts=4, initial_backoff=1.0, max_backoff=3.0)
    seen: list[tuple[int, int | None]] = []
    out = await call_with_retries(
        fn, policy, sleep=sleeps, rng=random.Random(0), on_retry=lambda a, e, w: seen.append((a, e.status))
    )
    assert out == "ok" and calls["n"] == 4
    assert [a for a, _ in seen] == [1, 2, 3]
    for attempt, w in enumerate(sleeps.waits, 1):  # full jitter under an exponential cap
        assert 0.0 <= w <= min(3.0, 1.0 * 2 ** (attempt - 1))


async def test_retry_after_is_honoured_and_capped() -> None:
    sleeps = Sleeps()
    fn, _ = failing(
        [
            ModelError("429", status=429, retryable=True, retry_after=7.0),
            ModelError("429", status=429, retryable=True, retry_after=500.0),
        ]
    )
    await call_with_retries(fn, RetryPolicy(max_retry_after=60.0), sleep=sleeps)
    assert sleeps.waits == [7.0, 60.0]


async def test_non_retryable_and_exhausted_errors_surface_unchanged() -> None:
    fn, calls = failing([ModelError("401", status=401)])
    with pytest.raises(ModelError) as e:
        await call_with_retries(fn, RetryPolicy(), sleep=Sleeps())
    assert e.value.status == 401 and calls["n"] == 1
    fn, calls = failing([ModelError("500", status=500, retryable=True)] * 5)
    with pytest.raises(ModelError):
        await call_with_retries(fn, RetryPolicy(max_attempts=3), sleep=Sleeps())
    assert calls["n"] == 3


async def test_agent_over_openai_adapter_429_500_timeout_then_success_all_traced(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    from remem_agent.adapters import OpenAIChat

    mem = ReMem(tmp_path / "s")
    mid = mem.add("Our server is in west-2.", timestamp=1)
    answer = json.dumps({"answer": "west-2", "citations": ["M1"]})  # the per-ask alias of mid
    script = ["429", "500", "timeout", "ok"]

    def handler(request: httpx.Request) -> httpx.Response:
        step = script.pop(0)
        if step == "429":
            return httpx.Response(429, headers={"Retry-After": "0"}, json={"error": {"message": "slow down"}})
        if step == "500":
            return httpx.Response(500, json={"error": {"message": "boom"}})
        if step == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(
            200,
            json={
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    model = OpenAIChat(
        "m",
        base_url="http://127.0.0.1:9/v1",
        api_key="sk-secret-abcdefghijkl",
        http_client=client,
        schema_mode="json_schema",
    )
    agent = MemoryAgent(
        mem, model, trace=tmp_path / "t.jsonl", retry=RetryPolicy(max_attempts=5, initial_backoff=0.0, max_backoff=0.0)
    )
    ans = await agent.ask("Where is our server?", truth={"answer": "west-2"}, now=2)
    assert ans.ok and ans.outcome is not None and ans.outcome.success and ans.citations == (mid,)
    (line,) = load_traces(tmp_path / "t.jsonl")
    retries = line["attempts"][0]["retries"]
    assert [r["status"] for r in retries] == [429, 500, None]
    assert "sk-secret-abcdefghijkl" not in (tmp_path / "t.jsonl").read_text()
    await client.aclose()
