"""``remem serve``: an OpenAI- and Ollama-compatible HTTP gateway that puts the learning memory in front of a model.

Clients speak OpenAI's ``/v1/chat/completions`` or Ollama's ``/api/chat``; every call goes through
:meth:`MemoryAgent.chat <remem_agent.agent.MemoryAgent.chat>` / ``chat_stream`` (recall, memory block,
citations, outcomes), then to the upstream model through the project's adapters. Modules, one concern each:

* :mod:`.config`: :class:`GatewayConfig`, API-key files, the bind check;
* :mod:`.auth`: who is calling (bearer keys) and the request's memory scope (:func:`~.auth.request_scope`);
* :mod:`.limits`: body size, message count, stream duration, the bounded concurrency gate (429);
* :mod:`.metrics`: Prometheus text exposition, no collector;
* :mod:`.upstream`: the model router (one ``ChatModel`` for the agent, one adapter per served model name);
* :mod:`.protocol`: request parsing and error shapes shared by the two wire protocols;
* :mod:`.openai_routes`, :mod:`.ollama_routes`, :mod:`.memory_routes`: the endpoints;
* :mod:`.core`: :class:`Gateway`, one process's state and the endpoint wrapper (auth, error shapes);
* :mod:`.app`: the Starlette application, access log, ``/healthz``, ``/metrics``, :func:`~.app.serve`.

Needs the ``gateway`` extra: ``pip install 'remem-agent[gateway]'``.
"""

from __future__ import annotations

from remem_agent._extras import require

require("starlette", "gateway", feature="remem serve (the gateway)")
require("uvicorn", "gateway", feature="remem serve (the gateway)")

from remem_agent.gateway.app import create_app, serve  # noqa: E402
from remem_agent.gateway.config import GatewayConfig, check_bind, load_api_keys  # noqa: E402
from remem_agent.gateway.core import Gateway  # noqa: E402

__all__ = ["Gateway", "GatewayConfig", "check_bind", "create_app", "load_api_keys", "serve"]
