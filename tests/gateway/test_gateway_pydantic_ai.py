"""pydantic-ai against ``remem serve`` (a real uvicorn server on loopback, a local fake model): its chat and
Responses models both work through the gateway, and the answer id is reachable from what pydantic-ai keeps,
the response's ``provider_response_id`` (the completion's or response's own id), which feedback takes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _gateway import running

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel
from remem_agent.gateway import GatewayConfig, create_app

pytest.importorskip("pydantic_ai")
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

QUESTION = "Where is our server hosted these days?"


@pytest.fixture()
def base(tmp_path: Path) -> Iterator[str]:
    mem = ReMem(tmp_path / "store")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name="qwen")
    app = create_app(GatewayConfig(models=("qwen",), trace="off"), memory=mem, model=model)
    try:
        with running(app) as url:
            yield url
    finally:
        mem.close()


@pytest.mark.parametrize("kind", ["chat", "responses"])
async def test_pydantic_ai_through_the_gateway_and_its_answer_id(base: str, kind: str) -> None:
    async with httpx.AsyncClient(trust_env=False) as http:
        provider = OpenAIProvider(base_url=base + "/v1", api_key="unused", http_client=http)
        model = (OpenAIChatModel if kind == "chat" else OpenAIResponsesModel)("qwen", provider=provider)
        result = await Agent(model).run(QUESTION)
        assert result.output == "It is in west-2 [M1]."
        reply = result.all_messages()[-1]
        given = reply.provider_response_id  # type: ignore[union-attr]
        assert given is not None and given.startswith("chatcmpl-a_" if kind == "chat" else "resp_a_")
        r = await http.post(f"{base}/v1/feedback", json={"answer_id": given, "success": True})
        assert r.status_code == 200 and r.json()["source"] == "user", r.text
