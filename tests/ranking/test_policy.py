"""Ranking and learning read a configuration only through the protocols they declare.

``ranking/policy.py`` (``RankingPolicy``) and ``learning/policy.py`` (``LearningPolicy``) list what each
package reads. Here every entry point of the two packages that ``ReMem`` calls gets, instead of the
``RememConfig``, a proxy that answers only the protocol's members: a search, feedback, exploratory serving and
off-policy evaluation all run through it, so a read of anything else (a new setting used without adding it to
the protocol) fails this test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from remem_agent import ReMem, RememConfig
from remem_agent import gather as gather_module
from remem_agent import memory as memory_module
from remem_agent.learning import ope
from remem_agent.learning.policy import LearningPolicy
from remem_agent.ranking import pipeline
from remem_agent.ranking.policy import RankingPolicy, StalenessSettings

T0 = 1_700_000_000.0


def members(protocol: type) -> frozenset[str]:
    return frozenset(n for n in vars(protocol) if not n.startswith("_"))


class Only:
    """``config`` as seen through ``protocol``: any other attribute read is a failure, with its name."""

    def __init__(self, config: Any, protocol: type, nested: dict[str, type] | None = None) -> None:
        self._config, self._names, self._nested = config, members(protocol), nested or {}
        self._protocol = protocol.__name__

    def __getattr__(self, name: str) -> Any:
        if name not in self._names:
            raise AssertionError(f"{name!r} read outside {self._protocol}")
        value = getattr(self._config, name)
        return Only(value, self._nested[name]) if name in self._nested else value


def ranking_view(config: Any) -> Any:
    return Only(config, RankingPolicy, {"staleness": StalenessSettings})


def through(view: Callable[[Any], Any], fn: Callable[..., Any], *, position: int | None = None) -> Callable[..., Any]:
    """``fn`` with its configuration (keyword ``config``, or the positional argument ``position``) seen through
    ``view``."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if position is not None and len(args) > position:
            args = (*args[:position], view(args[position]), *args[position + 1 :])
        if "config" in kwargs:
            kwargs["config"] = view(kwargs["config"])
        return fn(*args, **kwargs)

    return wrapped


@pytest.fixture
def protocols_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_module, "rank_and_select", through(ranking_view, pipeline.rank_and_select))
    monkeypatch.setattr(gather_module, "fuse", through(ranking_view, gather_module.fuse))
    needs = pipeline.EvidenceNeeds.of.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(pipeline.EvidenceNeeds, "of", classmethod(lambda cls, c: needs(cls, ranking_view(c))))
    learning_view = lambda c: Only(c, LearningPolicy)  # noqa: E731
    monkeypatch.setattr(memory_module, "plan_feedback", through(learning_view, memory_module.plan_feedback, position=1))
    monkeypatch.setattr(
        memory_module, "apply_feedback", through(learning_view, memory_module.apply_feedback, position=2)
    )


def test_the_proxy_refuses_what_its_protocol_does_not_name() -> None:
    view = ranking_view(RememConfig())
    assert view.p_floor == RememConfig().p_floor and view.staleness.mode == "key"
    with pytest.raises(AssertionError, match="'pool_factor' read outside RankingPolicy"):
        _ = view.pool_factor
    with pytest.raises(AssertionError, match="'attributes_at_stake' read outside StalenessSettings"):
        _ = view.staleness.attributes_at_stake


@pytest.mark.parametrize(
    "config",
    [
        RememConfig(),
        RememConfig(utility="heuristic", guard_top=3, p_floor_reference="absolute"),
        RememConfig(explore_serving=0.5, explore_width=3, explore_seed=7, fusion="rrf"),
    ],
    ids=["default", "heuristic-guarded", "exploring-rrf"],
)
def test_search_and_feedback_read_only_their_protocols(
    tmp_path: Path, protocols_only: None, config: RememConfig
) -> None:
    with ReMem(tmp_path / "m", config=config) as mem:
        mem.add_many([f"Deploy note {i}: service {w} runs in region {i}." for i, w in enumerate("abcdefgh")])
        mem.add("The billing service runs in region 9.", entity="billing", attribute="region", timestamp=T0)
        for _ in range(4):
            res = mem.search("Which region does the billing service run in?", k=3, task="ops", token_budget=60)
            assert res.items
            used = [h.id for h in res.items if "billing" in h.text]
            mem.feedback(res.search_id, success=bool(used), used_ids=used)
        top = mem.search("billing service region", k=1, task="ops").items[0].text
        assert "billing" in top or config.explore_serving  # an exploring search may serve an alternative
        if config.explore_serving:
            estimate = ope.evaluate_policy(mem.store, ranking_view(RememConfig(p_floor=0.5)))
            assert estimate.searches == 4
