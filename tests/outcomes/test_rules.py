"""The inference rules, once for every surface: the agent, the gateway and the MCP server."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from remem_agent.outcomes import rules
from remem_agent.outcomes.pending import Waiting
from remem_agent.outcomes.rules import WEAK_SUCCESS_WEIGHT, Verdict, blamed, corrected, moved_on, next_turn, relied_on

LIB = Path(__file__).resolve().parents[2] / "remem_agent"


def test_an_answer_relied_on_what_it_cited_or_repeated_not_on_all_it_was_served() -> None:
    w = Waiting(answer_id="a", search_id="s", served_ids=("m1", "m2", "m3"), cited_ids=("m1",), value=None)
    assert relied_on(w) == ("m1",)
    w2 = Waiting(answer_id="a", search_id="s", served_ids=("m1", "m2"), cited_ids=(), value=None, used_ids=("m2",))
    assert relied_on(w2) == ("m2",)
    assert blamed({"m2", "m9"}, relied_on(w)) == []  # served m2, relied on m1 only: no verdict from this
    assert blamed({"m2", "m9"}, relied_on(w2)) == ["m2"]
    assert blamed(["m3", "m1"], ("m1", "m2", "m3")) == ["m1", "m3"]  # sorted, whatever the order given


def test_the_verdicts_the_rules_give() -> None:
    assert corrected(["m2", "m1"], by="m7") == Verdict(
        success=False, source="inferred", weight=1.0, reason="a new fact (m7) superseded served memories ['m1', 'm2']"
    )
    assert moved_on() == Verdict(success=True, source="inferred", weight=0.3, reason="the next ask moved on")
    assert WEAK_SUCCESS_WEIGHT == 0.3
    assert next_turn(True).success is False and next_turn(True).weight == 1.0
    assert next_turn(False) == moved_on("the user moved on")
    assert moved_on().to_dict() == {
        "success": True,
        "source": "inferred",
        "weight": 0.3,
        "reason": "the next ask moved on",
    }


def test_no_other_module_defines_the_weak_success_weight_or_a_verdict() -> None:
    """The rules are written once: a second ``WEAK_SUCCESS_WEIGHT = ...`` or ``class Verdict`` anywhere fails."""
    found = []
    for path in LIB.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [t.id for t in node.targets if isinstance(t, ast.Name)]
                if isinstance(node, ast.Assign)
                else [node.name]
                if isinstance(node, ast.ClassDef)
                else []
            )
            found += [(path.relative_to(LIB).as_posix(), n) for n in names if n in ("WEAK_SUCCESS_WEIGHT", "Verdict")]
    assert sorted(found) == [("outcomes/rules.py", "Verdict"), ("outcomes/rules.py", "WEAK_SUCCESS_WEIGHT")]
    assert rules.__file__.endswith("outcomes/rules.py")


@dataclass(frozen=True)
class _Row:
    cited_ids: tuple[str, ...]
    used_ids: tuple[str, ...]


def test_a_ledger_row_is_read_by_the_same_rule() -> None:
    assert relied_on(_Row(cited_ids=("a",), used_ids=("b",))) == ("a", "b")
