"""Citation precision and recall of real-LLM traces against the synthetic worlds' hidden gold.

Per answered ask (a v1 ``ask`` trace line with an answer and no error):

* **cited**: the trace's ``citations`` (memory ids; alias traces already store ids, not labels);
* **gold**: the served memories that state the task's true value for its key, by the matching logic of
  :mod:`evals.analysis.analyze_traces` (``classify(...)["gold_ids"]``, domains from ``build_domains``
  over the trace set). The trace's ``truth`` is the world's hidden truth; as a check, every ask's world
  is rebuilt (``make_world(family, seed, WorldParams(n_tasks=...))``) and the served memories whose
  text is *exactly* a world fact asserting the task's true value for the key are counted as
  ``world_gold``; ``gold_agreement`` reports how often the two sets are equal;
* **supported**: the cited memories whose text holds one of the answer's values
  (:func:`remem_agent.learning.credit.values_used`), the signal ``CreditPolicy(citation_support=True)``
  uses.

Micro-averaged per trace set and system (and over successful asks only, where the credit rule acts):
``precision`` = |cited ∩ gold| / |cited|, ``recall`` = |cited ∩ gold| / |gold served|,
``unsupported_share`` = |cited − supported| / |cited|, ``supported_precision`` =
|supported ∩ gold| / |supported|, ``supported_recall`` = |supported ∩ gold| / |gold served|, and
``unsupported_gold_share`` = |(cited − supported) ∩ gold| / |cited − supported| (how often the support
rule would down-weight a gold citation).

``python -m evals.analysis.citation_precision --out results/llm_agent/citation_precision.json``
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from evals.analysis.analyze_traces import build_domains, classify, system_of
from evals.harness.families import make_world
from evals.harness.jsonio import write_json
from evals.harness.world import World, WorldParams, key_name
from remem_agent.agent.trace import load_traces, trace_files
from remem_agent.learning.credit import values_used

TRACE_SETS = ("traces/llm", "traces/llm_after_fixes", "traces/llm_aliases", "traces/llm_sorted_keys")
COUNTS = (
    *("asks", "answered", "gold_served", "cited", "gold", "cited_gold", "supported", "supported_gold"),
    *("unsupported", "unsupported_gold", "world_checked", "gold_agreement"),
)


@cache
def _world(family: str, seed: int, n_tasks: int) -> World:
    return make_world(family, seed, WorldParams(n_tasks=n_tasks))


def world_gold(rec: Mapping[str, Any], path: Path, n_tasks: int) -> set[str] | None:
    """Served ids whose text is exactly a world fact asserting the task's true value (None: no world)."""
    tid = str(rec.get("task_id") or "")
    m = re.fullmatch(r"(.+)-(\d+)-t\d+", tid)
    if not m:
        return None
    try:
        world = _world(m.group(1), int(m.group(2)), n_tasks)
    except KeyError:
        return None
    task = next((t for t in world.tasks() if t.tid == tid), None)
    if task is None or task.query != rec.get("question"):
        return None
    texts = {
        f.text
        for f in world.facts()
        if f.key is not None and f.value is not None and task.truth.get(key_name(f.key)) == f.value
    }
    return {s["id"] for s in rec.get("served") or [] if s.get("text") in texts}


def _answered(rec: Mapping[str, Any]) -> bool:
    return isinstance(rec.get("answer"), Mapping) and not rec.get("error")


def _finish(b: Mapping[str, int]) -> dict[str, Any]:
    def r(num: str, den: str) -> float | None:
        return round(b[num] / b[den], 4) if b[den] else None

    return dict(b) | {
        "precision": r("cited_gold", "cited"),
        "recall": r("cited_gold", "gold"),
        "unsupported_share": r("unsupported", "cited"),
        "supported_precision": r("supported_gold", "supported"),
        "supported_recall": r("supported_gold", "gold"),
        "unsupported_gold_share": r("unsupported_gold", "unsupported"),
        "citations_per_answer": r("cited", "answered"),
        "gold_agreement_rate": r("gold_agreement", "world_checked"),
    }


def measure(paths: Iterable[str | Path], *, n_tasks: int = 40, world_check: bool = True) -> dict[str, Any]:
    """Per system: counts and rates over all answered asks (``all``) and over successful ones (``success``)."""
    loaded = [(Path(p), rec) for p in paths for rec in load_traces(p, kind="ask")]
    domains = build_domains(rec for _, rec in loaded)
    buckets: dict[str, dict[str, dict[str, int]]] = defaultdict(
        lambda: {"all": dict.fromkeys(COUNTS, 0), "success": dict.fromkeys(COUNTS, 0)}
    )
    for path, rec in loaded:
        c = classify(rec, domains)
        sysname = system_of(rec, path)
        targets = [buckets[sysname]["all"]] + ([buckets[sysname]["success"]] if c["success"] else [])
        for b in targets:
            b["asks"] += 1
        if not _answered(rec):
            continue
        served = {s["id"]: s.get("text") or "" for s in rec.get("served") or []}
        cited = set(rec.get("citations") or []) & set(served)
        gold: set[str] = set(c["gold_ids"])
        supported = cited & values_used(served, rec["answer"])
        unsupported = cited - supported
        wg = world_gold(rec, path, n_tasks) if world_check else None
        for b in targets:
            b["answered"] += 1
            b["gold_served"] += bool(gold)
            b["cited"] += len(cited)
            b["gold"] += len(gold)
            b["cited_gold"] += len(cited & gold)
            b["supported"] += len(supported)
            b["supported_gold"] += len(supported & gold)
            b["unsupported"] += len(unsupported)
            b["unsupported_gold"] += len(unsupported & gold)
            if wg is not None:
                b["world_checked"] += 1
                b["gold_agreement"] += wg == gold
    return {s: {k: _finish(v) for k, v in b.items()} for s, b in sorted(buckets.items())}


def run(trace_sets: Sequence[str | Path], *, n_tasks: int = 40, world_check: bool = True) -> dict[str, Any]:
    sets: dict[str, Any] = {}
    for d in trace_sets:
        files = trace_files(d)
        if files:
            sets[str(d)] = {"files": [f.name for f in files]} | {
                "per_system": measure(files, n_tasks=n_tasks, world_check=world_check)
            }
    return {
        "definitions": {
            "gold": "served memories holding the task's true value for its key (analyze_traces.classify gold_ids)",
            "supported": "cited memories whose text holds an answer value (credit.values_used)",
            "precision": "|cited ∩ gold| / |cited|",
            "recall": "|cited ∩ gold| / |gold served|",
            "unsupported_share": "|cited − supported| / |cited|",
            "supported_precision": "|supported ∩ gold| / |supported|",
            "supported_recall": "|supported ∩ gold| / |gold served|",
            "unsupported_gold_share": "|unsupported ∩ gold| / |unsupported|",
            "gold_agreement_rate": "asks whose text-matched gold equals the rebuilt world's exact-text gold",
            "scope": "answered asks (valid answer, no error); 'success' = answered asks scored correct",
        },
        "trace_sets": sets,
    }


def _pct(x: float | None) -> str:
    return "  -  " if x is None else f"{100 * x:5.1f}"


def table(res: Mapping[str, Any], scope: str = "all") -> str:
    head = f"{'trace set':<24}{'sys':<4}{'ans':>5}{'cit/ans':>8}{'prec':>7}{'recall':>7}{'unsup%':>7}"
    head += f"{'sup prec':>9}{'sup rec':>8}{'gold agree':>11}"
    lines = [f"citation precision ({scope} answered asks; %)", head]
    for name, ts in res["trace_sets"].items():
        for s, v in ts["per_system"].items():
            b = v[scope]
            cpa = "-" if b["citations_per_answer"] is None else f"{b['citations_per_answer']:.2f}"
            lines.append(
                f"{Path(name).name:<24}{s:<4}{b['answered']:>5}{cpa:>8}{_pct(b['precision']):>7}"
                f"{_pct(b['recall']):>7}{_pct(b['unsupported_share']):>7}{_pct(b['supported_precision']):>9}"
                f"{_pct(b['supported_recall']):>8}{_pct(b['gold_agreement_rate']):>11}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("trace_sets", nargs="*", default=list(TRACE_SETS))
    p.add_argument("--out", default="results/llm_agent/citation_precision.json")
    p.add_argument("--tasks", type=int, default=40, help="n_tasks of the worlds the traces were run on")
    p.add_argument("--no-world-check", action="store_true")
    a = p.parse_args(argv)
    res = run(a.trace_sets, n_tasks=a.tasks, world_check=not a.no_world_check)
    write_json(a.out, res)
    print(table(res, "all"))
    print()
    print(table(res, "success"))


if __name__ == "__main__":
    main()
