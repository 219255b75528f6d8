"""The end-to-end LoCoMo runner (evals/bench/locomo_qa.py) and its answer scores, on the tiny fixture."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from evals.bench import locomo_qa
from evals.bench.qa_scoring import containment, locomo_f1, normalize_answer, token_f1
from evals.bench.run_locomo import sample_turns
from evals.bench.session_facts import CachedExtractor, observation_facts
from evals.harness.embedders import make_embedder
from remem_agent.adapters.base import ChatRequest
from remem_agent.adapters.fakes import FunctionChatModel
from remem_agent.extract import LLMFactExtractor
from remem_agent.tokens import count_tokens

LOCOMO = Path(__file__).resolve().parents[1] / "fixtures" / "locomo_tiny.json"


# -- scores, by hand ------------------------------------------------------------------------------------
def test_normalisation_follows_locomo():
    assert normalize_answer("The Cat, and a dog!") == "cat dog"
    assert normalize_answer("  7 May,   2023. ") == "7 may 2023"


@pytest.mark.parametrize(
    ("prediction", "gold", "category", "f1"),
    [
        ("7 May 2023", "7 May, 2023", 2, 1.0),
        ("in May 2023", "7 May 2023", 2, 2 / 3),  # 2 shared stems of 3 each
        ("running dogs", "dog ran", 4, 0.5),  # Porter: running -> run, dogs -> dog; ran stays ran
        ("", "Lisbon", 4, 0.0),
        ("Rex, Pepper", "Rex and Pepper", 1, 2 / 3),  # one gold item "rex pepper"; best prediction item "Rex"
        ("Pepper, Rex", "Rex, Pepper", 1, 1.0),  # each gold item finds its match
        ("Rex", "Rex, Pepper", 1, 0.5),  # mean over the gold items: 1 and 0
        ("yes", "yes; he likes music", 3, 1.0),  # open-domain: the part before ";"
    ],
)
def test_locomo_f1_by_hand(prediction, gold, category, f1):
    assert locomo_f1(prediction, gold, category) == pytest.approx(f1)


def test_token_f1_counts_repeated_words_once_each():
    assert token_f1("dog dog dog", "dog") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))


@pytest.mark.parametrize(
    ("prediction", "gold", "category", "expected"),
    [
        ("She moved in July 2023", "July 2023", 2, 1.0),
        ("2023 July", "July 2023", 2, 0.0),  # a run of consecutive stems, in order
        ("Rex and Pepper", "Pepper, Rex", 1, 1.0),
        ("Rex", "Pepper, Rex", 1, 0.0),
        ("anything", "the", 4, 0.0),  # nothing scorable in the gold answer
    ],
)
def test_containment_by_hand(prediction, gold, category, expected):
    assert containment(prediction, gold, category) == expected


def test_reply_parsing_and_judge_verdicts():
    assert locomo_qa.prediction_of("\n  Answer: Lisbon\nbecause she said so") == "Lisbon"
    assert locomo_qa.prediction_of("Short answer: 7 May 2023") == "7 May 2023"
    assert locomo_qa.prediction_of("  \n") == ""
    assert locomo_qa.judge_verdict("**CORRECT**") == 1.0
    assert locomo_qa.judge_verdict("wrong.") == 0.0
    assert locomo_qa.judge_verdict("maybe") is None


# -- the runner ------------------------------------------------------------------------------------------
def _reader() -> FunctionChatModel:
    """Says "xylophone" when the prompt shows the turn that names it, else "I do not know"."""

    def fn(request: ChatRequest) -> str:
        return "xylophone" if "xylophone" in request.messages[-1].content else "I do not know"

    return FunctionChatModel(fn, name="fixture-reader")


FACT = "Alice plays an instrument called the xylophone."


def _fact_extractor(*, broken: bool = False) -> FunctionChatModel:
    """Replies as ``LLMFactExtractor`` asks: one fact for a session that names the xylophone, none otherwise
    (``broken``: a reply that never matches the schema, so every session's extraction fails)."""

    def fn(request: ChatRequest) -> str:
        assert request.json_schema is not None
        return '{"facts": "none"}' if broken else _facts_reply(request)

    return FunctionChatModel(fn, name="fixture-extractor")


def _facts_reply(request: ChatRequest) -> str:
    named = "xylophone" in request.messages[1].content
    return json.dumps({"facts": [{"text": FACT, "role": "note"}] if named else []})


def _run(
    tmp_path: Path,
    model: FunctionChatModel,
    *,
    budget: int,
    fresh: bool = False,
    arms: tuple[str, ...] = locomo_qa.DEFAULT_ARMS,
    extractor: CachedExtractor | None = None,
) -> dict[str, locomo_qa.RunLog]:
    samples = json.loads(LOCOMO.read_text())
    config = {"budget": budget}
    work = tmp_path / "work"
    logs = {arm: locomo_qa.RunLog(work, arm, {**config, "arm": arm}, fresh=fresh) for arm in arms}
    asyncio.run(
        locomo_qa.run(
            samples,
            arms=arms,
            extractor=extractor,
            model=model,
            embedder=make_embedder("hash"),
            logs=logs,
            budget=budget,
            k=5,
            limit=None,
            full_limit=None,
            max_tokens=16,
        )
    )
    return logs


def test_runner_answers_every_scored_question_in_every_arm(tmp_path):
    model = _reader()
    logs = _run(tmp_path, model, budget=40)
    # the fixture scores four questions (category 5 and unresolvable evidence are left out, as run_locomo does)
    assert {arm: len(log.rows) for arm, log in logs.items()} == {arm: 4 for arm in locomo_qa.DEFAULT_ARMS}
    first = {arm: log.rows[("tiny-1", 0)] for arm, log in logs.items()}
    assert first["none"]["f1"] == 0.0 and first["none"]["served"] == [] and first["none"]["memory_tokens"] == 0
    assert first["full"]["f1"] == 1.0 and first["full"]["context_recall"] == 1.0
    assert first["bm25"]["served"][0] == "D1:3" and first["bm25"]["f1"] == 1.0
    assert "D1:3" in first["remem"]["served"] and first["remem"]["f1"] == 1.0
    for arm in ("remem", "bm25"):
        assert all(r["memory_tokens"] <= 40 for r in logs[arm].rows.values())
    # the full arm puts the conversation first: one question's prompt is the next one's prefix up to the question
    full = [r for r in model.requests if r.messages[-1].content.startswith("Conversation:")]
    heads = {r.messages[-1].content.split("Question:")[0] for r in full}
    assert len(full) == 4 and len(heads) == 1
    assert "[session 1, Monday 8 May 2023, 13:56 UTC]" in next(iter(heads))


def test_budget_is_the_same_for_both_retrieval_arms(tmp_path):
    logs = _run(tmp_path, _reader(), budget=12)
    for arm in ("remem", "bm25"):
        for row in logs[arm].rows.values():
            assert row["memory_tokens"] <= 12
    turn = "Alice: I started learning to play the xylophone last week."
    assert count_tokens(turn) <= 12  # the answer turn fits: both arms can serve it
    assert logs["bm25"].rows[("tiny-1", 0)]["served"] == ["D1:3"]
    assert logs["bm25"].rows[("tiny-1", 0)]["f1"] == 1.0


def test_a_rerun_resumes_and_another_configuration_is_refused(tmp_path):
    _run(tmp_path, _reader(), budget=40)
    again = _reader()
    logs = _run(tmp_path, again, budget=40)
    assert again.requests == [] and all(len(log.rows) == 4 for log in logs.values())
    with pytest.raises(SystemExit, match="another configuration"):
        locomo_qa.RunLog(tmp_path / "work", "bm25", {"budget": 99, "arm": "bm25"}, fresh=False)
    fresh = locomo_qa.RunLog(tmp_path / "work", "bm25", {"budget": 99, "arm": "bm25"}, fresh=True)
    assert fresh.rows == {}


def test_the_remem_log_is_not_resumed_under_other_search_defaults(tmp_path, monkeypatch):
    from remem_agent import RememConfig

    base = {"budget": 40}
    assert locomo_qa.arm_config(base, "bm25") == {"budget": 40, "arm": "bm25"}  # the baselines do not depend on it
    remem = locomo_qa.arm_config(base, "remem")
    assert remem["search"] == locomo_qa.search_fingerprint() != locomo_qa.search_fingerprint(RememConfig(k=6))
    locomo_qa.RunLog(tmp_path, "remem", remem, fresh=False)
    monkeypatch.setattr(locomo_qa.context, "DEFAULT_WEIGHT", 0.5)  # a new store's turn context changed
    changed = locomo_qa.arm_config(base, "remem")
    assert changed["search"] != remem["search"]
    with pytest.raises(SystemExit, match="another configuration"):
        locomo_qa.RunLog(tmp_path, "remem", changed, fresh=False)


def test_summary_pairs_the_arms_and_holds_no_conversation_text(tmp_path, monkeypatch):
    monkeypatch.setattr(locomo_qa, "make_reader", lambda name, threads, n_ctx: _reader())
    out = tmp_path / "out"
    argv = ["--data", str(LOCOMO), "--embedder", "hash", "--budget", "40", "--work", str(tmp_path / "w")]
    assert locomo_qa.main([*argv, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["arms"]) == set(locomo_qa.DEFAULT_ARMS)  # remem_facts only when asked for
    assert summary["arms"]["full"]["f1"] == pytest.approx(0.25)  # one of four answered right
    assert summary["arms"]["none"]["f1"] == 0.0
    assert summary["pairs"]["remem-none"]["n"] == 4
    assert summary["pairs"]["remem-none"]["f1_diff"]["mean"] == pytest.approx(0.25)
    assert summary["meta"]["command"].startswith("python -m evals.bench.locomo_qa --data locomo_tiny.json")
    text = (out / "summary.json").read_text() + (out / "summary.md").read_text()
    for word in ("xylophone", "Lisbon", "hiking", "Rex"):
        assert word not in text
    assert "| remem |" in (out / "summary.md").read_text()


def test_carried_arms_stand_beside_a_later_run_and_pair_with_it(tmp_path, monkeypatch):
    monkeypatch.setattr(locomo_qa, "make_reader", lambda name, threads, n_ctx: _reader())
    argv = ["--data", str(LOCOMO), "--embedder", "hash", "--budget", "40"]
    first = tmp_path / "first"
    assert locomo_qa.main([*argv, "--arms", "none,bm25,full", "--work", str(tmp_path / "w1"), "--out", str(first)]) == 0
    later = tmp_path / "later"
    carry = ["--carry", str(first / "summary.json")]
    assert locomo_qa.main([*argv, "--arms", "remem", "--work", str(tmp_path / "w2"), "--out", str(later), *carry]) == 0
    both = json.loads((later / "summary.json").read_text())
    alone = json.loads((first / "summary.json").read_text())
    assert list(both["arms"]) == ["none", "bm25", "full", "remem"]
    assert both["arms"]["full"] == alone["arms"]["full"]  # carried as it was measured
    assert both["meta"]["carried"]["arms"] == ["bm25", "full", "none"]
    # the paired differences use the carried per-question F1: the same as one run of every arm gives
    together = tmp_path / "together"
    assert locomo_qa.main([*argv, "--work", str(tmp_path / "w3"), "--out", str(together)]) == 0
    one_run = json.loads((together / "summary.json").read_text())
    for pair in ("remem-bm25", "remem-none", "full-remem"):
        assert both["pairs"][pair] == one_run["pairs"][pair], pair
    # an earlier run with another budget is not carried
    with pytest.raises(SystemExit, match="differs"):
        locomo_qa.main(
            [*argv[:-1], "41", "--arms", "remem", "--work", str(tmp_path / "w4"), "--out", str(later), *carry]
        )


def test_unknown_arm_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        locomo_qa.main(["--data", str(LOCOMO), "--arms", "remem,oracle", "--work", str(tmp_path)])


# -- the fact-notes arm -------------------------------------------------------------------------------------
def test_the_facts_arm_serves_extracted_facts_beside_the_turns(tmp_path):
    model = _fact_extractor()
    cache = tmp_path / "facts.jsonl"
    extractor = CachedExtractor(LLMFactExtractor(model), cache)
    reader = _reader()
    logs = _run(tmp_path, reader, budget=40, arms=("remem", "remem_facts"), extractor=extractor)
    assert len(model.requests) == 3  # one extraction per session of the fixture
    stats = extractor.stats()
    assert (stats.sessions, stats.failed, stats.facts) == (3, 0, 2)  # sessions 1 and 2 name the xylophone
    row = logs["remem_facts"].rows[("tiny-1", 0)]
    assert row["f1"] == 1.0 and row["memory_tokens"] <= 40
    facts_prompts = [r for r in reader.requests if "notes taken from it" in r.messages[0].content]
    assert len(facts_prompts) == 4 and any(FACT in r.messages[-1].content for r in facts_prompts)
    assert not any(FACT in r.messages[-1].content for r in reader.requests if r not in facts_prompts)
    # a fact stands for no turn: the served ids are the turns' only
    assert all(d.startswith("D") for r in logs["remem_facts"].rows.values() for d in r["served"])
    # a later run reads the facts from the file and asks the model nothing
    again = _fact_extractor()
    reread = CachedExtractor(LLMFactExtractor(again), cache)
    _run(tmp_path / "second", _reader(), budget=40, arms=("remem_facts",), extractor=reread)
    assert again.requests == [] and reread.stats() == stats


def test_a_session_whose_extraction_fails_is_counted_and_the_run_goes_on(tmp_path):
    extractor = CachedExtractor(LLMFactExtractor(_fact_extractor(broken=True), max_reasks=1), tmp_path / "f.jsonl")
    logs = _run(tmp_path, _reader(), budget=40, arms=("remem_facts",), extractor=extractor)
    assert len(logs["remem_facts"].rows) == 4
    stats = extractor.stats()
    assert (stats.sessions, stats.failed, stats.facts) == (3, 3, 0)
    rows = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert all("no valid fact list after 2 attempt(s)" in r["error"] for r in rows)


def test_the_facts_arm_needs_an_extractor_and_its_log_names_the_extraction(tmp_path):
    with pytest.raises(ValueError, match="needs an extractor"):
        _run(tmp_path, _reader(), budget=40, arms=("remem_facts",))
    config = locomo_qa.arm_config({"budget": 40}, "remem_facts")
    assert config["extraction"] == locomo_qa.extraction_fingerprint()
    assert config["search"] == locomo_qa.arm_config({"budget": 40}, "remem")["search"]


def test_main_runs_the_facts_arm_and_reports_the_extraction(tmp_path, monkeypatch):
    def fn(request: ChatRequest) -> str:
        if request.json_schema is not None:
            return _facts_reply(request)
        return "xylophone" if "xylophone" in request.messages[-1].content else "I do not know"

    monkeypatch.setattr(locomo_qa, "make_reader", lambda name, threads, n_ctx: FunctionChatModel(fn, name="both"))
    out = tmp_path / "out"
    argv = ["--data", str(LOCOMO), "--embedder", "hash", "--budget", "40", "--work", str(tmp_path / "w")]
    assert locomo_qa.main([*argv, "--arms", "remem,bm25,remem_facts", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["extraction"]["sessions"] == 3 and summary["meta"]["extraction"]["failed"] == 0
    assert {"remem_facts-remem", "remem_facts-bm25"} <= set(summary["pairs"])
    assert "| remem_facts |" in (out / "summary.md").read_text()
    assert list((tmp_path / "w" / "both").glob("facts-locomo_tiny-*.jsonl"))


def test_locomo_observations_become_facts_that_stand_for_the_turns_they_cite() -> None:
    sample = json.loads(LOCOMO.read_text())[0]
    turns, _ = sample_turns(sample)
    facts = observation_facts(sample, turns)
    assert [(f["speaker"], f["session"], cited) for f, cited in facts] == [
        ("Alice", "session_1", ("D1:3",)),
        ("Bob", "session_1", ("D1:2",)),
        ("Bob", "session_2", ("D2:1",)),
    ]  # a session the conversation does not hold is left out
    last_of_session_1 = max(t["t"] for t in turns if t["session"] == "session_1")
    assert facts[0][0]["timestamp"] == last_of_session_1 and facts[0][0]["role"] == "note"


def test_the_observations_arm_serves_locomo_facts_beside_the_turns(tmp_path):
    reader = _reader()
    logs = _run(tmp_path, reader, budget=40, arms=("remem", "remem_obs"))
    assert len(logs["remem_obs"].rows) == 4
    dogs = logs["remem_obs"].rows[("tiny-1", 1)]  # "What are the names of Bob's dogs?" (D1:2, D2:1)
    assert dogs["memory_tokens"] <= 40 and set(dogs["served"]) >= {"D1:2", "D2:1"}
    noted = [r for r in reader.requests if "notes taken from it" in r.messages[0].content]
    assert len(noted) == 4 and any("Bob adopted a beagle named Pepper." in r.messages[-1].content for r in noted)
    assert locomo_qa.arm_config({"budget": 40}, "remem_obs")["facts"] == "locomo observation"
