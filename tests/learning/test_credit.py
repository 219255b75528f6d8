"""Credit assignment: signals, value use, variants, leave-one-out replay.

The tests on a ledger run on both backends (``[sqlite]`` and ``[postgres]``, via ``store_location``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from remem_agent import ReMem, RememConfig
from remem_agent.learning.credit import CreditPolicy, answer_values, values_used
from remem_agent.learning.retention import RetentionPolicy

StoreLocation = Callable[[str], "str | Path"]


def test_signal_credit_is_per_memory_not_split() -> None:
    p = CreditPolicy()
    out = p.assign(["a", "b", "c", "d"], success=True, cited={"a", "c"}, used={"a", "b"})
    assert out == {"a": (1.0, 0.0), "b": (0.75, 0.0), "c": (0.5, 0.0), "d": (0.0, 0.0)}
    fail = p.assign(["a", "b", "c", "d"], success=False, cited={"a", "c"}, used={"a", "b"})
    assert fail == {"a": (0.0, 1.0), "b": (0.0, 1.0), "c": (0.0, 0.25), "d": (0.0, 0.0)}


def test_equal_and_usage_only_variants() -> None:
    eq = CreditPolicy(mode="equal").assign(["a", "b"], success=True, cited={"a"}, used=set())
    assert eq == {"a": (0.5, 0.0), "b": (0.5, 0.0)}
    uo = CreditPolicy(mode="usage_only").assign(["a", "b"], success=False, cited={"a"}, used=set())
    assert uo == {"a": (0.5, 0.0), "b": (0.0, 0.0)}


def test_value_use_is_lexical_and_whole_word() -> None:
    texts = {"m1": "The server is in west-2.", "m2": "west-20 is a different region", "m3": "Nothing here."}
    assert values_used(texts, {"region": "west-2", "citations": ["m3"]}) == {"m1"}
    assert values_used(texts, "West-2") == {"m1"}
    assert answer_values({"a": [1, "x", {"b": "Alice"}], "ok": True}) == ["alice"]  # 1 and "x" too short


def test_feedback_with_answer_marks_value_use(store_location: StoreLocation) -> None:
    mem = ReMem(store_location("store"))
    a = mem.add("The billing owner is Alice.", timestamp=1)
    b = mem.add("The billing channel is busy.", timestamp=1)
    res = mem.search("who owns billing", now=2)
    r = mem.feedback(res.search_id, success=True, answer={"owner": "Alice"})
    assert r.credit == {a: 0.75, b: 0.0}
    # repeating with the same answer is the same payload: idempotent
    assert mem.feedback(res.search_id, success=True, answer={"owner": "Alice"}).repeated


def test_leave_one_out_full_and_ambiguous(store_location: StoreLocation) -> None:
    calls: list[Sequence[str]] = []

    def make(policy: str) -> ReMem:
        cfg = RememConfig(credit=CreditPolicy(loo=policy), retention=RetentionPolicy(enabled=False))  # type: ignore[arg-type]
        return ReMem(store_location(policy), config=cfg)

    for policy, expect_calls in (("full", 3), ("ambiguous", 1)):
        mem = make(policy)
        key = mem.add("Deploy key is K-42.", timestamp=1)
        cited_only = mem.add("Deploys happen on Tuesday.", timestamp=1)
        noise = mem.add("Deploy party photos.", timestamp=1)
        res = mem.search("deploy key", k=3, now=2)
        assert set(res.ids) == {key, cited_only, noise}
        calls.clear()

        def replay(ids: Sequence[str], key: str = key) -> bool:
            calls.append(list(ids))
            return key in ids  # the task only succeeds with the key memory

        r = mem.feedback(res.search_id, success=True, used_ids=[key], cited_ids=[key, cited_only], replay=replay)
        assert r.replay_calls == expect_calls == len(calls)
        assert r.credit[key] == 1.0 and r.credit[cited_only] == 0.5 and r.credit[noise] == 0.0


def test_leave_one_out_upgrades_an_unsignalled_but_essential_memory(store_location: StoreLocation) -> None:
    mem = ReMem(store_location("store"), config=RememConfig(credit=CreditPolicy(loo="full")))
    hidden = mem.add("The vault code is 7781.", timestamp=1)
    other = mem.add("The vault is in the basement.", timestamp=1)
    res = mem.search("vault", k=2, now=2)
    r = mem.feedback(res.search_id, success=True, cited_ids=[other], replay=lambda ids: hidden in ids)
    assert r.credit[hidden] == 1.0 and r.credit[other] == 0.5


def test_weighted_feedback_scales_credit(store_location: StoreLocation) -> None:
    mem = ReMem(store_location("store"))
    a = mem.add("The billing owner is Alice.", timestamp=1)
    res = mem.search("billing owner", now=2)
    r = mem.feedback(res.search_id, success=True, used_ids=[a], cited_ids=[a], weight=0.25)
    assert r.credit[a] == 0.25
    assert mem.inspect(a).overall.credit_sum == 0.25
    import pytest

    from remem_agent import UserInputError

    for bad in (0, 1.5, True, "1"):
        with pytest.raises(UserInputError):
            mem.feedback(res.search_id, success=True, weight=bad)  # type: ignore[arg-type]


def test_citation_support_rule_cuts_unsupported_citations_on_success_only() -> None:
    on = CreditPolicy(citation_support=True)
    ok = on.assign(["a", "b", "c"], success=True, cited={"a", "b"}, used={"a"})
    assert ok == {"a": (1.0, 0.0), "b": (0.25, 0.0), "c": (0.0, 0.0)}  # b: 0.25 x a supported citation
    assert CreditPolicy().assign(["a", "b", "c"], success=True, cited={"a", "b"}, used={"a"})["b"] == (0.5, 0.0)
    # failure: the current rule exactly (no extra blame for an unsupported citation)
    fail = on.assign(["a", "b", "c"], success=False, cited={"a", "b"}, used={"a"})
    assert fail == CreditPolicy().assign(["a", "b", "c"], success=False, cited={"a", "b"}, used={"a"})
    # no value-use evidence at all (no answer given): citations keep cited_only
    assert on.assign(["a", "b"], success=True, cited={"a", "b"}, used=set()) == {"a": (0.5, 0.0), "b": (0.5, 0.0)}
    # an explicit support set overrides `used`
    assert on.assign(["a", "b"], success=True, cited={"a", "b"}, used=set(), supported={"b"})["a"] == (0.25, 0.0)
    # leave-one-out essential still earns full credit
    assert on.assign(["a", "b"], success=True, cited={"a", "b"}, used={"a"}, essential={"b"})["b"] == (1.0, 0.0)


def test_citation_support_through_feedback_with_answer(store_location: StoreLocation) -> None:
    def run(support: bool) -> tuple[dict[str, float], str, str]:
        cfg = RememConfig(credit=CreditPolicy(citation_support=support), retention=RetentionPolicy(enabled=False))
        mem = ReMem(store_location(f"support-{support}"), config=cfg)
        a = mem.add("The billing owner is Alice.", timestamp=1)
        b = mem.add("The billing channel is busy.", timestamp=1)
        res = mem.search("who owns billing", now=2)
        r = mem.feedback(res.search_id, success=True, cited_ids=[a, b], answer={"owner": "Alice"})
        return r.credit, a, b

    credit, a, b = run(True)
    assert credit == {a: 1.0, b: 0.25}  # b was cited but holds none of the answer's values
    credit, a, b = run(False)
    assert credit == {a: 1.0, b: 0.5}  # default off: unchanged


def test_c_support_system_turns_the_rule_on() -> None:
    from evals.harness.systems import load_systems

    systems = load_systems()
    assert systems["C_support"].config.credit.citation_support is True
    assert systems["C"].config.credit.citation_support is False
