"""Stream an Ollama model's reply with memory (pip install -e ".[ollama]"; OLLAMA_HOST selects the server).

    python examples/stream_ollama.py qwen2.5:3b
"""

import asyncio
import sys

from remem_agent import MemoryAgent, OllamaChat, ReMem


async def main(model: str) -> None:
    mem = ReMem("~/.remem/example")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    agent = MemoryAgent(mem, OllamaChat(model), strip_citations=True)
    stream = agent.chat_stream([{"role": "user", "content": "Where is our server?"}])
    async for chunk in stream:  # memory work happened before the first piece; learning waits for the last
        print(chunk.text, end="", flush=True)
    print("\ncited:", [h.text for h in stream.served if stream.reply and h.id in stream.reply.citations])


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5:3b"))
