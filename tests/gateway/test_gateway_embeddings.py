"""Embeddings through the gateway: Ollama's ``POST /api/embed`` with the ``ollama`` client and OpenAI's
``POST /v1/embeddings`` with the ``openai`` client, each in front of both upstream kinds (fake servers on
loopback): the upstream's vectors come back in the client's protocol, nothing of the memory is touched, and
bad input, an unknown model or a gateway without an upstream are clean errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _ollama_server import FakeOllama, Reply

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel
from remem_agent.gateway import GatewayConfig, create_app

ollama = pytest.importorskip("ollama")

MODEL = "nomic-embed-text"
VECTORS = [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]


@pytest.fixture()
def mem(tmp_path: Path) -> Iterator[ReMem]:
    m = ReMem(tmp_path / "store")
    m.add("Our server moved to west-2.", entity="server", attribute="region")
    yield m
    m.close()


def _upstream(kind: str) -> FakeOllama:
    if kind == "ollama":
        fake = FakeOllama(paths=("/api/embed",))
        fake.default = Reply(body={"model": MODEL, "embeddings": VECTORS, "prompt_eval_count": 7})
    else:
        fake = FakeOllama(paths=("/v1/embeddings",))
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(VECTORS)]
        fake.default = Reply(body={"object": "list", "data": data, "model": MODEL,
                                   "usage": {"prompt_tokens": 7, "total_tokens": 7}})  # fmt: skip
    return fake


@pytest.mark.parametrize("upstream", ["ollama", "openai"])
async def test_both_embedding_routes_in_front_of_both_upstreams(mem: ReMem, tmp_path: Path, upstream: str) -> None:
    with _upstream(upstream) as fake:
        config = GatewayConfig(upstream=fake.url + ("/v1" if upstream == "openai" else ""), upstream_kind=upstream,
                               models=(MODEL,), trace="off")  # type: ignore[arg-type]  # fmt: skip
        app = create_app(config, memory=mem)
        before = mem.stats()
        client = ollama.AsyncClient(host="http://gw", transport=httpx.ASGITransport(app=app))
        out = await client.embed(model=MODEL, input=["Our server", "west-2"])
        assert [list(v) for v in out.embeddings] == VECTORS and out.prompt_eval_count == 7
        sent = fake.requests[-1].body
        assert sent["model"] == MODEL and sent["input"] == ["Our server", "west-2"]
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
        sdk = openai.AsyncOpenAI(base_url="http://gw/v1", api_key="x", http_client=http, max_retries=0)
        try:
            got = await sdk.embeddings.create(model=MODEL, input="Our server")  # base64 on the wire, by default
            assert [d.embedding == pytest.approx(v, rel=1e-6) for d, v in zip(got.data, VECTORS, strict=True)] == [
                True, True
            ] and got.usage.prompt_tokens == 7  # float32 on the wire  # fmt: skip
            floats = await sdk.embeddings.create(model=MODEL, input="Our server", encoding_format="float")
            assert [d.embedding for d in floats.data] == VECTORS
            with pytest.raises(openai.NotFoundError):
                await sdk.embeddings.create(model="nope", input="x")
            with pytest.raises(openai.BadRequestError):
                await sdk.embeddings.create(model=MODEL, input=[])
        finally:
            await sdk.close()
            await app.state.gateway.aclose()  # no lifespan in process: close the upstream's HTTP pool here
        assert mem.stats() == before  # nothing of the memory was read or written


@pytest.mark.parametrize(
    ("path", "body", "status", "where"),
    [
        ("/api/embed", {"model": "qwen", "input": "hi"}, 501, "upstream"),
        ("/v1/embeddings", {"model": "qwen", "input": "hi"}, 501, "upstream"),
        ("/api/embed", {"model": "qwen", "input": [1, 2]}, 400, "input"),
        ("/v1/embeddings", {"model": "qwen", "input": "hi", "encoding_format": "utf8"}, 400, "encoding_format"),
        ("/api/embed", {"model": "qwen", "input": ["x"] * 3000}, 400, "2048"),
    ],
)
async def test_embedding_errors(
    mem: ReMem, tmp_path: Path, path: str, body: dict[str, Any], status: int, where: str
) -> None:
    model = FunctionChatModel(lambda req: "unused", name="qwen")
    app = create_app(GatewayConfig(models=("qwen",), trace="off"), memory=mem, model=model)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        r = await http.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert where in (err if isinstance(err, str) else err["message"])
    assert not model.requests
