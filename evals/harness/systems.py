"""Systems of the benchmark, loaded from ``evals/harness/systems.yaml``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from remem_agent import RememConfig
from remem_agent.learning.retention import RetentionPolicy
from remem_agent.learning.staleness import StalenessPolicy
from remem_agent.ranking.features import FeatureConfig

SYSTEMS_FILE = Path(__file__).with_name("systems.yaml")


@dataclass(frozen=True)
class System:
    name: str
    description: str
    config: RememConfig
    keys: bool = True
    as_of: bool = True
    learn: bool = True
    prune: str | None = None  # "frequency": the retention control that archives rarely retrieved memories
    label_noise: float = 0.0  # fraction of outcome labels flipped before feedback
    loo_replay: bool = False  # give feedback a replay callback (leave-one-out credit through the reader)
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


def _preset(name: str) -> RememConfig:
    if name == "similarity_only":
        return RememConfig.similarity_only()
    if name == "static":
        return RememConfig(
            utility="heuristic",
            guard_top=0,
            p_floor=0.0,
            selection="greedy",
            features=FeatureConfig(groups=("static",)),
            retention=RetentionPolicy(enabled=False),
            staleness=StalenessPolicy(outcome_invalidation=False),
            static_prior="always",  # the reference's static score: the prior at full weight, no outcomes
            time_weight=0.0,  # a flat vector store's ranking: no lift for the times or speakers a query names
            speaker_weight=0.0,
        )
    if name == "default":
        return RememConfig()
    raise ValueError(f"unknown preset {name!r}")


def build(name: str, spec: dict[str, Any]) -> System:
    cfg = _preset(spec.get("preset", "default"))
    cfg = cfg.overriding(spec.get("overrides") or {})
    return System(
        name=name,
        description=spec.get("description", ""),
        config=cfg,
        keys=bool(spec.get("keys", True)),
        as_of=bool(spec.get("as_of", True)),
        learn=bool(spec.get("learn", True)),
        prune=spec.get("prune"),
        label_noise=float(spec.get("label_noise", 0.0)),
        loo_replay=bool(spec.get("loo_replay", False)),
        raw=spec,
    )


def load_systems(path: str | Path = SYSTEMS_FILE) -> dict[str, System]:
    data = yaml.safe_load(Path(path).read_text())
    return {name: build(name, spec) for name, spec in data["systems"].items()}
