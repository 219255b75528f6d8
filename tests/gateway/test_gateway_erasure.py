"""Erasure through ``remem serve`` on a real server: ``DELETE /v1/memories/{id}`` and ``POST /v1/memories/erase``
in the caller's scope, ``DELETE /v1/scopes/{scope}`` with a key granted '*'; the gateway's trace lines go too."""

from __future__ import annotations

import json
from pathlib import Path

from _gateway import client_of

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel
from remem_agent.gateway import GatewayConfig, create_app
from remem_agent.types import State

MODEL = "qwen2.5:0.5b"
ALICE, BOB, ADMIN = "sk-alice-000000000000001", "sk-bob-00000000000000002", "sk-admin-0000000000000003"
KEYS = {ALICE: ("user:alice",), BOB: ("user:bob",), ADMIN: ("*",)}
PIN = "Alice's card PIN is 8842-0017, keep it safe."


def test_erasure_through_the_gateway(tmp_path: Path) -> None:
    mem = ReMem(tmp_path / "store", embedder="hash")
    pin = mem.add(PIN, scope="user:alice", role="note")
    tea = mem.add("Alice likes green tea.", scope="user:alice", role="preference")
    bobs = mem.add("Bob's locker code is 4711-9931.", scope="user:bob", role="note")
    trace = tmp_path / "traces" / "gateway.jsonl"
    config = GatewayConfig(upstream=None, models=(MODEL,), trace=str(trace))
    model = FunctionChatModel(lambda req: "Your PIN is on file [M1].", name=MODEL)
    alice, bob, admin = ({"authorization": f"Bearer {k}"} for k in (ALICE, BOB, ADMIN))
    try:
        with client_of(create_app(config, memory=mem, model=model, keys=KEYS)) as c:
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "What is my card PIN?"}]}
            assert c.post("/v1/chat/completions", json=chat, headers=alice).status_code == 200
            assert "8842-0017" in trace.read_text()
            # Bob cannot erase Alice's memory (it is unknown in his scope); an unknown id is a 404
            r = c.delete(f"/v1/memories/{pin}", headers=bob)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
            assert c.delete("/v1/memories/m_nope", headers=alice).status_code == 404
            assert mem.get(pin).state is State.ACTIVE
            # Alice erases it: gone from the ledger, the trace, and every later answer
            r = c.delete(f"/v1/memories/{pin}", params={"reason": "user request"}, headers=alice)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "erasure" and body["erased"] == [pin] and body["trace_lines_removed"] >= 1
            assert "8842-0017" not in trace.read_text()
            assert mem.get(pin).state is State.ERASED and mem.inspect(pin).history[-1].reason == "user request"
            # by filter, in the caller's scope; bad filters are 400s and change nothing
            for bad in ({"role": 3}, {"colour": "red"}, {}, {"contains": "ab"}, {"ids": "m_1"}):
                r = c.post("/v1/memories/erase", json=bad, headers=alice)
                assert r.status_code == 400, (bad, r.text)
            assert mem.get(tea).state is State.ACTIVE
            r = c.post("/v1/memories/erase", json={"contains": "green tea"}, headers=alice)
            assert r.status_code == 200 and r.json()["erased"] == [tea]
            # a whole scope needs a key granted '*'
            assert c.delete("/v1/scopes/user:bob", headers=bob).status_code == 403
            assert mem.get(bobs).state is State.ACTIVE
            assert c.delete("/v1/scopes/bad scope!", headers=admin).status_code == 400
            r = c.delete("/v1/scopes/user:bob", headers=admin)
            assert r.status_code == 200 and r.json()["erased"] == [bobs]
            assert c.get("/v1/verify", headers=admin).json()["ok"]
        lines = [json.loads(x) for x in trace.read_text().splitlines()]
        assert all(pin not in json.dumps(x) for x in lines)
        assert b"8842-0017" not in (tmp_path / "store" / "ledger.db").read_bytes()
    finally:
        mem.close()
