"""``RememCallback`` in a real LiteLLM proxy, configured the documented way (``litellm_settings: callbacks:``).

The proxy (``python -m litellm.proxy.proxy_cli``, the installed litellm) runs as a subprocess in front of a
loopback OpenAI-compatible upstream that records what it receives; the official ``openai`` client calls the
proxy. Checked: the memory is recalled in the caller's scope (the call's ``user``) and injected upstream, the
reply carries ``remem`` through the proxy, and the next turn's correction is learned as a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _llama_server import free_port, serve_process
from _ollama_server import FakeOllama, Reply

from remem_agent import ReMem
from remem_agent.integrations import litellm as remem_litellm

openai = pytest.importorskip("openai")

MASTER_KEY = "sk-remem-proxy-test-0123456789"


def _proxy_importable() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import litellm.proxy.proxy_server"],
        capture_output=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        timeout=300,
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _proxy_importable(), reason="the LiteLLM proxy's dependencies are not installed")


def _reply(content: str) -> Reply:
    return Reply(
        body={
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "fake",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        }
    )


@pytest.fixture()
def proxy(tmp_path: Path) -> Iterator[tuple[str, FakeOllama, Path, str]]:
    store = tmp_path / "store"
    with ReMem(store) as mem:
        mid = mem.add("Our server moved to west-2.", entity="server", attribute="region", scope="user:alice")
    fake = FakeOllama(paths=("/v1/chat/completions",)).start()
    fake.push(*[_reply("It is in west-2 [M1].") for _ in range(4)])
    (tmp_path / "proxy_memory.py").write_text(
        "import os\nfrom remem_agent.integrations.litellm import RememCallback\n"
        'remem_callback = RememCallback(os.environ["REMEM_STORE"])\n',
        encoding="utf-8",
    )
    (tmp_path / "config.yaml").write_text(
        "model_list:\n"
        "  - model_name: fake\n"
        "    litellm_params:\n"
        "      model: openai/fake\n"
        f"      api_base: {fake.url}/v1\n"
        "      api_key: unused\n"
        "litellm_settings:\n"
        "  callbacks: proxy_memory.remem_callback\n",
        encoding="utf-8",
    )
    port = free_port()
    env = {
        "REMEM_STORE": str(store),
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", "config.yaml", "--host", "127.0.0.1"]
    base = f"http://127.0.0.1:{port}"
    try:
        with serve_process(
            [*cmd, "--port", str(port)],
            f"{base}/health/liveliness",
            "the LiteLLM proxy",
            180,
            extra_env=env,
            cwd=tmp_path,
        ):
            yield base, fake, store, mid
    finally:
        fake.stop()


def test_the_proxy_recalls_injects_reports_and_learns_through_the_callback(
    proxy: tuple[str, FakeOllama, Path, str],
) -> None:
    base, fake, store, mid = proxy
    assert remem_litellm.RememCallback.__module__ == "remem_agent.integrations.litellm"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=MASTER_KEY)
    messages = [{"role": "user", "content": "Which region hosts our server?"}]
    reply = client.chat.completions.create(model="fake", messages=messages, user="alice")
    assert reply.choices[0].message.content == "It is in west-2 [M1]."
    remem = (reply.model_extra or {})["remem"]
    assert remem["served"] == [mid] and remem["citations"] == [mid] and remem["answer_id"].startswith("a_")
    upstream = fake.requests[-1].body["messages"]
    assert upstream[0]["role"] == "system" and "Our server moved to west-2." in upstream[0]["content"]
    assert upstream[-1] == messages[0]

    # another user's call recalls nothing of alice's
    other = client.chat.completions.create(model="fake", messages=messages, user="bob")
    assert (other.model_extra or {})["remem"]["served"] == []
    assert "west-2" not in str(fake.requests[-1].body["messages"])

    # the next turn corrects the answer: the served memory is judged, as a failure
    messages += [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "No, that's wrong."},
    ]
    client.chat.completions.create(model="fake", messages=messages, user="alice")
    with ReMem(store) as mem:
        info = mem.inspect(mid, scope="user:alice")
        judged = [c for c in info.credits if not c.success]
        assert judged and judged[0].cited  # the first answer, cited and corrected
        assert info.overall.shown >= 1 and mem.verify().ok
