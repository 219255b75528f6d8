"""Memory for LiteLLM: a ``CustomLogger`` callback that recalls, injects and learns around every chat completion
made through the LiteLLM SDK or a LiteLLM proxy (extra ``litellm``), instead of a second proxy in front.

Per ``acompletion`` call (``completion`` too, when LiteLLM runs its async hooks), with
``litellm.callbacks = [RememCallback(memory)]``:

1. before the request leaves (``async_pre_call_deployment_hook``): ``MemoryAgent.prepare_chat`` validates the
   messages, recalls once per user turn and adds the one memory block; the request goes on with those messages;
2. after the reply (``async_post_call_success_deployment_hook``; for a stream, ``async_log_success_event`` with
   the assembled reply): ``MemoryAgent.finish_chat`` maps inline ``[M1]`` citations to memory ids and leaves the
   answer waiting for its outcome; a non-streamed ``ModelResponse`` gets a ``remem`` attribute (``answer_id``,
   ``served``, ``citations``);
3. outcomes: ``await callback.feedback(answer_id, success=...)``, the next user turn of the conversation
   (a correction is a failure), or a correcting fact (``await callback.remember(...)``).

Who the memory belongs to: ``metadata={"remem_scope": ..., "remem_conversation": ...}`` on the call, else the
call's ``user`` as ``user:<user>``, else the callback's ``scope``. A call that is not a chat completion, or
whose ``metadata`` says ``"remem": False``, passes untouched. A request the memory refuses (malformed messages)
raises the library's ``UserInputError`` before anything is sent.

The proxy runs the same deployment hooks, so a LiteLLM proxy config (``config.yaml``) takes it the same way
(tested with a real proxy in ``tests/integrations/test_litellm_proxy.py``)::

    litellm_settings:
      callbacks: my_memory.remem_callback      # a module of yours: remem_callback = RememCallback("store")
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from remem_agent._extras import require

require("litellm", "litellm", feature="RememCallback")

from litellm.integrations.custom_logger import CustomLogger  # noqa: E402

from remem_agent.adapters.base import Capabilities, ChatRequest, ChatResponse, ToolCall, Usage  # noqa: E402
from remem_agent.agent import MemoryAgent  # noqa: E402
from remem_agent.agent.chat import PreparedChat  # noqa: E402
from remem_agent.errors import ModelError  # noqa: E402
from remem_agent.memory import ReMem  # noqa: E402
from remem_agent.types import FeedbackReceipt  # noqa: E402

log = logging.getLogger("remem_agent.integrations.litellm")

MAX_IN_FLIGHT = 10_000  # calls prepared and not finished yet (a call whose reply never came is dropped oldest first)
_CHAT_CALLS = frozenset({"acompletion", "completion"})
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls"}


class _CalledByLiteLLM:
    """The agent's model seat: LiteLLM calls the model, so the agent never does."""

    name = "litellm"
    adapter = "litellm"
    capabilities = Capabilities(tools=True, streaming=True, native_json_schema=True, json_mode=True)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        raise ModelError("RememCallback's agent never calls a model: LiteLLM does")


class RememCallback(CustomLogger):
    """Recall, one memory block and outcome learning around LiteLLM chat completions."""

    def __init__(
        self,
        memory: ReMem | str | Path,
        *,
        k: int = 5,
        token_budget: int | None = None,
        scope: str | None = None,
        trace: Path | str | Literal[False] | None = False,
    ) -> None:
        super().__init__()
        self.memory = memory if isinstance(memory, ReMem) else ReMem(memory)
        self.agent = MemoryAgent(self.memory, _CalledByLiteLLM(), k=k, token_budget=token_budget, trace=trace)
        self.scope = scope
        self._calls: OrderedDict[str, PreparedChat] = OrderedDict()

    # -- LiteLLM hooks ------------------------------------------------------------------------------------
    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: object) -> dict[str, Any] | None:
        if _call_name(call_type) not in _CHAT_CALLS:
            return None
        given = kwargs.get("metadata")
        meta: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        if meta.get("remem") is False:
            return None
        prepared = await self.agent.prepare_chat(
            kwargs.get("messages"),
            tools=kwargs.get("tools"),
            tool_choice=kwargs.get("tool_choice"),
            conversation_id=meta.get("remem_conversation"),
            scope=self._scope_of(meta, kwargs.get("user")),
        )
        call_id = str(kwargs.get("litellm_call_id") or prepared.answer_id)
        self._calls[call_id] = prepared
        while len(self._calls) > MAX_IN_FLIGHT:
            self._calls.popitem(last=False)
        return {**kwargs, "messages": prepared.to_dicts()}

    async def async_post_call_success_deployment_hook(
        self, request_data: dict[str, Any], response: Any, call_type: object
    ) -> Any:
        prepared = self._calls.pop(str(request_data.get("litellm_call_id")), None)
        if prepared is None or _call_name(call_type) not in _CHAT_CALLS:
            return None
        reply = await self.agent.finish_chat(prepared, chat_response(response))
        response.remem = {
            "answer_id": reply.answer_id,
            "conversation_id": reply.conversation_id,
            "served": [h.id for h in reply.served],
            "citations": list(reply.citations),
        }
        return response

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """A stream's end: LiteLLM hands the assembled reply here (the deployment hook sees no stream)."""
        prepared = self._calls.pop(str(kwargs.get("litellm_call_id")), None)
        if prepared is None:
            return
        whole = kwargs.get("complete_streaming_response") or response_obj
        await self.agent.finish_chat(prepared, chat_response(whole))

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._calls.pop(str(kwargs.get("litellm_call_id")), None)  # no reply: nothing waits for an outcome

    # -- outcomes -----------------------------------------------------------------------------------------
    async def feedback(
        self, answer_id: str, *, success: bool, reason: str | None = None, scope: str | None = None
    ) -> FeedbackReceipt:
        """An explicit verdict for an answer (``response.remem["answer_id"]``)."""
        return await self.agent.feedback(answer_id, success=success, reason=reason, scope=scope)

    async def remember(self, text: str, **fields: Any) -> str:
        """A new memory; a keyed ``state`` fact that supersedes one a waiting answer used fails that answer."""
        return await self.agent.remember(text, **fields)

    async def aclose(self) -> None:
        await self.agent.aclose()

    def _scope_of(self, meta: Mapping[str, Any], user: object) -> str | None:
        given = meta.get("remem_scope")
        if isinstance(given, str):
            return given
        if isinstance(user, str) and user:
            return f"user:{user}"
        return self.scope


def _call_name(call_type: object) -> str:
    return str(getattr(call_type, "value", call_type))


def chat_response(response: Any) -> ChatResponse:
    """A LiteLLM ``ModelResponse`` (or its dict) as the library's ``ChatResponse``."""
    data = response.model_dump() if hasattr(response, "model_dump") else dict(response)
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    calls = tuple(
        ToolCall(id=str(c.get("id") or f"call_{i}"), name=str((c.get("function") or {}).get("name") or ""),
                 arguments=_arguments((c.get("function") or {}).get("arguments")))
        for i, c in enumerate(message.get("tool_calls") or [])
    )  # fmt: skip
    usage = data.get("usage") or {}
    return ChatResponse(
        text=str(message.get("content") or ""),
        tool_calls=calls,
        finish_reason=_FINISH.get(str(choice.get("finish_reason") or "stop"), "other"),  # type: ignore[arg-type]
        usage=Usage(usage.get("prompt_tokens"), usage.get("completion_tokens")),
        model=str(data.get("model") or ""),
    )


def _arguments(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {})
