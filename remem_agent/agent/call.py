"""Call + enforce: ask the model, check the reply, re-ask with the errors, a bounded number of times.

Transient model failures are retried inside one attempt by the single retry layer
(:func:`~remem_agent.adapters.retry.call_with_retries`); a reply that parses but is invalid gets a
re-ask (a new attempt that shows the model its reply and the errors). Every attempt is recorded in the
caller's ``attempts`` list as it happens, so a call that raises still leaves its record for the trace.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from remem_agent.adapters.base import ChatModel, ChatRequest, ChatResponse, Message
from remem_agent.adapters.retry import RetryPolicy, call_with_retries
from remem_agent.agent.enforce import Checked, check_reply
from remem_agent.agent.prompt import reask_message
from remem_agent.agent.trace import AttemptRecord
from remem_agent.errors import ModelError


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """The generation parameters every attempt uses; None leaves one to the model (it is not sent)."""

    temperature: float | None = 0.0
    max_tokens: int | None = 512
    seed: int | None = 0

    def to_dict(self) -> dict[str, float | int | None]:
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, "seed": self.seed}


@dataclass(frozen=True, kw_only=True)
class Enforced:
    """The result of the call stage: the accepted reply (``checked.ok``) or the last rejected one."""

    checked: Checked | None
    last_raw: str | None
    errors: tuple[str, ...]  # every enforcement error of the rejected attempts, in order
    model_ms: float

    @property
    def ok(self) -> bool:
        return self.checked is not None and self.checked.ok


async def call_and_enforce(
    model: ChatModel,
    messages: Sequence[Message],
    schema: Mapping[str, object],
    labels: Sequence[str],
    *,
    attempts: list[AttemptRecord],
    retry: RetryPolicy,
    max_reasks: int,
    sampling: Sampling,
) -> Enforced:
    """Up to ``max_reasks + 1`` attempts; raises ModelError (after its retries) with ``attempts`` filled in."""
    convo = list(messages)
    checked: Checked | None = None
    last_raw: str | None = None
    errors: list[str] = []
    model_ms = 0.0
    for _ in range(max_reasks + 1):
        rec = AttemptRecord()
        attempts.append(rec)
        request = ChatRequest(
            messages=tuple(convo),
            json_schema=dict(schema),
            schema_name="answer",
            temperature=sampling.temperature,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
        )
        t_call = time.perf_counter()
        try:
            resp = await _call(model, request, retry, rec)
        finally:
            rec.latency_ms = round((time.perf_counter() - t_call) * 1000, 3)
            model_ms += rec.latency_ms
        last_raw = resp.text
        checked = check_reply(resp.text, schema, labels, truncated=resp.finish_reason == "length")
        rec.raw, rec.finish_reason = resp.text, resp.finish_reason
        rec.errors, rec.kind, rec.usage = list(checked.errors), checked.kind, resp.usage.to_dict()
        if checked.ok:
            break
        errors += checked.errors
        convo += [Message("assistant", resp.text), reask_message(checked.errors)]
    return Enforced(checked=checked, last_raw=last_raw, errors=tuple(errors), model_ms=model_ms)


async def _call(model: ChatModel, request: ChatRequest, retry: RetryPolicy, rec: AttemptRecord) -> ChatResponse:
    def on_retry(attempt: int, exc: ModelError, wait: float) -> None:
        rec.retries.append({"attempt": attempt, "status": exc.status, "error": str(exc)[:500], "wait_s": wait})

    return await call_with_retries(lambda: model.complete(request), retry, on_retry=on_retry)
