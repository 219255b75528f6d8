"""Wrap an Ollama model with remem-agent (pip install -e ".[ollama]"; OLLAMA_HOST selects the server).

    python examples/wrap_ollama.py qwen2.5:3b
"""

import asyncio
import sys

from remem_agent import ReMem
from remem_agent.adapters import OllamaChat
from remem_agent.agent import MemoryAgent


async def main(model: str) -> None:
    mem = ReMem("~/.remem/example")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    agent = MemoryAgent(mem, OllamaChat(model))  # native JSON-schema output via Ollama's format=
    ans = await agent.ask("Where is our server?", task="ops", truth={"answer": "west-2"})
    print(ans.value, ans.citations, ans.outcome)


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5:3b"))
