"""What the public-data retrieval benchmarks (LongMemEval, LoCoMo) share: k values, dates, systems, output.

Both benchmarks build one fresh store per question or sample (:func:`evals.harness.replay.temp_store`),
embed with :func:`evals.harness.embedders.make_embedder`, rank with the systems of
``evals/harness/systems.yaml`` or plain BM25 (:mod:`evals.bench.bm25`), and write ``<base>.json`` + ``<base>.md``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from evals.harness.jsonio import write_json
from evals.harness.systems import System, load_systems
from remem_agent.config import RememConfig
from remem_agent.transcripts import parse_when

KS = (1, 5, 10)
BM25_NAME = "BM25"


# -- dates ---------------------------------------------------------------------------------------------
def parse_date(value: object) -> datetime | None:
    """The benchmarks' free-text dates as an aware UTC datetime (None when no date is found): the library's
    own transcript date reader (:func:`remem_agent.transcripts.parse_when`), which ``add_conversation`` uses."""
    return parse_when(value)


def library_systems() -> dict[str, System]:
    """``ReMem.search`` as a user gets it (the default RememConfig, no learning in a cold run) per retrieval
    channel, with the store's re-ranker on (``ReMem-rerank``; ``ReMem-rerank-nocal`` without the prior calibration
    under it), and plain cosine (``RememConfig.similarity_only`` on the dense channel, each turn's own vector:
    ``turn_context`` 0) for reference."""
    base = RememConfig()
    configs = {
        "ReMem": base,
        "ReMem-dense": replace(base, retrieval="dense"),
        "ReMem-lexical": replace(base, retrieval="lexical"),
        # the re-ranker as its studies ran it, over the ranking of that time (the calibrated prior, the floor at
        # 0.35), and without the calibration under it (results/locomo/PLAN_rerank_calibration.md)
        "ReMem-rerank": replace(base, rerank="store", contribution_calibration=5.0, p_floor=0.35),
        "ReMem-rerank-nocal": replace(base, rerank="store", contribution_calibration=0.0, p_floor=0.35),
        "cosine": RememConfig.similarity_only(retrieval="dense", turn_context=0.0),
    }
    return {
        name: System(name=name, description=f"library config {name}", config=cfg, keys=False, as_of=False, learn=False)
        for name, cfg in configs.items()
    }


def select_systems(spec: str) -> list[tuple[str, System | None]]:
    """Names from ``--systems`` -> (name, System) pairs; ``BM25`` maps to None (the lexical baseline).

    Names are those of evals/harness/systems.yaml and of :func:`library_systems`.
    """
    known = {**load_systems(), **library_systems()}
    out: list[tuple[str, System | None]] = []
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        if name.upper() == BM25_NAME:
            out.append((BM25_NAME, None))
        elif name in known:
            out.append((name, known[name]))
        else:
            raise SystemExit(f"unknown system {name!r}; known: {', '.join([*known, BM25_NAME])}")
    if not out:
        raise SystemExit("no systems given")
    return out


def write_outputs(result: dict[str, Any], md: str, base: Path, *, quiet: bool) -> None:
    """Write ``<base>.json`` and ``<base>.md`` (shared by the LongMemEval and LoCoMo runners)."""
    base.parent.mkdir(parents=True, exist_ok=True)
    write_json(base.with_suffix(".json"), result, indent=1)
    base.with_suffix(".md").write_text(md, encoding="utf-8")
    if not quiet:
        print(md)
        print(f"wrote {base}.json and {base}.md")


def command_line(module: str, argv: Sequence[str]) -> str:
    """The command that ran ``module`` with ``argv``, shell-quoted, naming the ``--data`` file by its name only
    (where a user keeps the data, which may not be redistributed, is not part of a result)."""
    args = list(argv)
    for i, a in enumerate(args):
        if a == "--data" and i + 1 < len(args):
            args[i + 1] = Path(args[i + 1]).name
        elif a.startswith("--data="):
            args[i] = "--data=" + Path(a.split("=", 1)[1]).name
    return f"python -m {module} {shlex.join(args)}".rstrip()
