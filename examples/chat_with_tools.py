"""An agent loop with a tool, with memory (pip install -e ".[openai]"): the caller keeps its own prompt and tools.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/chat_with_tools.py MODEL
"""

import asyncio
import sys

from remem_agent import MemoryAgent, OpenAIChat, ReMem

PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}


async def main(model: str) -> None:
    mem = ReMem("~/.remem/example")
    mem.add("Our server moved to west-2.", entity="server", attribute="region")
    agent = MemoryAgent(mem, OpenAIChat(model), strip_citations=True)
    msgs = [{"role": "system", "content": "You are Ops Bot."}, {"role": "user", "content": "Is our server up?"}]
    while (reply := await agent.chat(msgs, tools=[PING])).tool_calls:  # memory is recalled once for the turn
        msgs.append({"role": "assistant", "content": reply.text, "tool_calls": [c.to_dict() for c in reply.tool_calls]})
        msgs += [{"role": "tool", "tool_call_id": c.id, "content": "pong"} for c in reply.tool_calls]
    print(reply.text, "| cited:", [h.text for h in reply.served if h.id in reply.citations])
    await agent.feedback(reply.answer_id, success=True, reason="the user was happy")


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "gpt-4o-mini"))
