"""The one-turn text routes: OpenAI's legacy ``POST /v1/completions`` through the official ``openai`` client and
Ollama's ``POST /api/generate`` through the official ``ollama`` client, against the gateway app in process
with a local fake model: memory served, replies and streams in each protocol's shape, feedback by the reply's
own id, and what each route refuses (before anything is recalled or sent)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel
from remem_agent.gateway import GatewayConfig, create_app

ollama = pytest.importorskip("ollama")

MODEL = "qwen2.5:0.5b"
QUESTION = "Where is our server hosted these days?"


@pytest.fixture()
def mem(tmp_path: Path) -> Iterator[ReMem]:
    m = ReMem(tmp_path / "store")
    m.add("Our server moved to west-2.", entity="server", attribute="region")
    yield m
    m.close()


@pytest.fixture()
def model() -> FunctionChatModel:
    return FunctionChatModel(lambda req: "It is in west-2 [M1].", name=MODEL)


@pytest.fixture()
def app(mem: ReMem, tmp_path: Path, model: FunctionChatModel) -> Any:
    return create_app(GatewayConfig(models=(MODEL,), trace=str(tmp_path / "trace.jsonl")), memory=mem, model=model)


def _openai(app: Any) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    return openai.AsyncOpenAI(base_url="http://gw/v1", api_key="x", http_client=http, max_retries=0)


async def test_a_text_completion_with_memory_streamed_or_not(app: Any, model: FunctionChatModel) -> None:
    client = _openai(app)
    try:
        done = await client.completions.create(model=MODEL, prompt=QUESTION, max_tokens=20)
        assert done.object == "text_completion" and done.choices[0].text == "It is in west-2 [M1]."
        assert done.choices[0].finish_reason == "stop" and done.id.startswith("cmpl-a_")
        sent = model.requests[-1]
        assert [m.role for m in sent.messages] == ["system", "user"] and sent.messages[-1].content == QUESTION
        assert "west-2" in sent.messages[0].content and sent.max_tokens == 20
        assert done.model_extra is not None and done.model_extra["remem"]["citations"]
        ok = await client.post("/feedback", cast_to=httpx.Response, body={"answer_id": done.id, "success": True})
        assert ok.status_code == 200  # the completion's id names its answer

        stream = await client.completions.create(model=MODEL, prompt=[QUESTION], stream=True)
        pieces, remem, finish = [], None, None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
            if chunk.model_extra and "remem" in chunk.model_extra:
                remem = chunk.model_extra["remem"]
        assert "".join(pieces) == "It is in west-2 [M1]." and finish == "stop"
        assert remem is not None and remem["citations"]
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"prompt": [QUESTION, "and?"]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": QUESTION, "echo": True}, "echo"),
        ({"prompt": QUESTION, "suffix": "end"}, "suffix"),
        ({"prompt": QUESTION, "best_of": 3}, "best_of"),
        ({"prompt": QUESTION, "n": 2}, "n > 1"),
        ({"prompt": QUESTION, "logprobs": 2}, "logprobs"),
    ],
)
async def test_what_a_text_completion_refuses(
    app: Any, mem: ReMem, model: FunctionChatModel, body: dict[str, Any], where: str
) -> None:
    searches = mem.stats().searches
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        r = await http.post("/v1/completions", json={"model": MODEL, **body})
    assert r.status_code == 400 and where in r.json()["error"]["message"], r.text
    assert mem.stats().searches == searches and not model.requests


async def test_generate_with_the_ollama_client(app: Any, mem: ReMem, model: FunctionChatModel) -> None:
    client = ollama.AsyncClient(host="http://gw", transport=httpx.ASGITransport(app=app))
    one = await client.generate(model=MODEL, prompt=QUESTION, system="Be brief.", stream=False)
    assert one.response == "It is in west-2 [M1]." and one.done
    sent = model.requests[-1].messages
    assert [m.role for m in sent] == ["system", "system", "user"] and sent[0].content == "Be brief."
    assert sent[-1].content == QUESTION and "west-2" in sent[1].content
    parts = [p async for p in await client.generate(model=MODEL, prompt=QUESTION, stream=True)]
    assert "".join(p.response for p in parts) == "It is in west-2 [M1]." and parts[-1].done
    # an empty prompt loads the model, as Ollama's does: nothing recalled, nothing sent
    searches, calls = mem.stats().searches, len(model.requests)
    loaded = await client.generate(model=MODEL, prompt="", stream=False)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert mem.stats().searches == searches and len(model.requests) == calls
    with pytest.raises(ollama.ResponseError) as missing:
        await client.generate(model="nope", prompt="hi", stream=False)
    assert missing.value.status_code == 404


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"prompt": QUESTION, "raw": True}, "raw"),
        ({"prompt": QUESTION, "images": ["aGk="]}, "images"),
        ({"prompt": QUESTION, "context": [1, 2, 3]}, "context"),
        ({"prompt": QUESTION, "suffix": "x"}, "suffix"),
        ({"prompt": QUESTION, "template": "{{ .Prompt }}"}, "template"),
        ({"prompt": 42}, "prompt"),
        ({"prompt": QUESTION, "system": ["x"]}, "system"),
    ],
)
async def test_what_generate_refuses(
    app: Any, mem: ReMem, model: FunctionChatModel, body: dict[str, Any], where: str
) -> None:
    searches = mem.stats().searches
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        r = await http.post("/api/generate", json={"model": MODEL, "stream": False, **body})
    assert r.status_code == 400 and where in r.json()["error"], r.text
    assert mem.stats().searches == searches and not model.requests
