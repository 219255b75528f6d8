"""Wrap any OpenAI-compatible chat model with remem-agent (pip install -e ".[openai]").

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=sk-... python examples/wrap_openai.py MODEL
"""

import asyncio
import sys

from remem_agent import ReMem
from remem_agent.adapters import OpenAIChat
from remem_agent.agent import MemoryAgent


async def main(model: str) -> None:
    mem = ReMem("~/.remem/example")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    agent = MemoryAgent(mem, OpenAIChat(model))  # base_url/api key from OPENAI_BASE_URL / OPENAI_API_KEY
    ans = await agent.ask("Where is our server?", task="ops", truth={"answer": "west-2"})
    print(ans.value, ans.citations, ans.outcome)


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "gpt-4o-mini"))
