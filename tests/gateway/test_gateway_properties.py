"""Property test (hypothesis) over the gateway's inputs: any request body, header or path answers with the
protocol's own shape (a JSON error with a 4xx status for what it refuses), never a 5xx, and a refused request
writes nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette")

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel
from remem_agent.gateway import GatewayConfig, create_app
from remem_agent.gateway.config import Limits

MODEL = "qwen2.5:0.5b"
_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8), st.sampled_from(["\ud800", "\x00"])
)
_JSON = st.recursive(
    _SCALAR,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=8,
)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "wizard"]), "content": _JSON}
)
_BODY = st.one_of(
    st.binary(max_size=40),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"model": st.one_of(st.just(MODEL), _SCALAR), "messages": st.one_of(st.lists(_MESSAGE, max_size=3), _JSON)},
        optional={"stream": _JSON, "temperature": _JSON, "tools": _JSON, "user": _JSON, "response_format": _JSON,
                  "format": _JSON, "options": _JSON, "max_tokens": _JSON},
    ).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries(  # the Responses and Messages shapes (each route also gets the others' bodies)
        {"model": st.one_of(st.just(MODEL), _SCALAR),
         "input": st.one_of(st.text(max_size=8), st.lists(_MESSAGE, max_size=3), _JSON)},
        optional={"instructions": _JSON, "previous_response_id": _JSON, "text": _JSON, "tools": _JSON,
                  "store": _JSON, "max_output_tokens": _JSON, "stream": _JSON, "tool_choice": _JSON},
    ).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries(  # the one-turn text routes' shape
        {"model": st.one_of(st.just(MODEL), _SCALAR), "prompt": st.one_of(st.text(max_size=8), _JSON)},
        optional={"system": _JSON, "stream": _JSON, "raw": _JSON, "context": _JSON, "echo": _JSON,
                  "suffix": _JSON, "options": _JSON, "format": _JSON, "max_tokens": _JSON},
    ).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries(
        {"model": st.one_of(st.just(MODEL), _SCALAR), "max_tokens": st.one_of(st.just(16), _JSON),
         "messages": st.one_of(st.lists(_MESSAGE, max_size=3), _JSON)},
        optional={"system": _JSON, "tools": _JSON, "tool_choice": _JSON, "stop_sequences": _JSON,
                  "metadata": _JSON, "output_config": _JSON, "stream": _JSON, "thinking": _JSON},
    ).map(lambda d: json.dumps(d).encode()),
)  # fmt: skip
_PATH = st.sampled_from(
    ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/completions", "/api/chat", "/api/generate",
     "/v1/memories", "/v1/feedback"]
)  # fmt: skip
_HEADERS = st.dictionaries(
    st.sampled_from(["x-remem-user", "x-remem-agent", "x-remem-conversation", "authorization"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
    max_size=3,
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=_PATH, body=_BODY, headers=_HEADERS)
def test_any_request_gets_a_protocol_answer_and_refusals_write_nothing(
    tmp_path: Path, path: str, body: bytes, headers: dict[str, str]
) -> None:
    async def run() -> None:
        with ReMem(tmp_path / "s") as mem:
            if mem.stats().memories == 0:
                mem.add("Our server moved to west-2.", entity="server", attribute="region")
            model = FunctionChatModel(lambda req: "It is in west-2 [M1].", name=MODEL)
            cfg = GatewayConfig(
                store=str(tmp_path / "s"),
                models=(MODEL,),
                trace="off",
                retry_attempts=1,
                limits=Limits(max_body_bytes=4000, max_messages=5),
            )
            app = create_app(cfg, memory=mem, model=model)
            before = mem.stats()
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
                r = await client.post(path, content=body, headers={"content-type": "application/json", **headers})
            assert r.status_code < 500, (r.status_code, r.text[:300])
            if r.status_code >= 400:
                err: Any = r.json()["error"]
                assert (
                    (isinstance(err, str) and err)
                    if path.startswith("/api/")
                    else isinstance(err, dict) and err["message"]
                )
                assert mem.stats() == before
            assert mem.verify().ok

    asyncio.run(run())
