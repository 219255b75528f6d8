"""The studies of the reference design §10, each a set of systems run on the core families.

    python -m evals.bench.run_benchmark --study ablation      # -> results/studies/ablation/{benchmark.json,RESULTS.md}

A study's table puts every system beside the reference's number (reader ``first``, core families) and
gives the paired difference to the study's baseline system over seeds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.harness.stats import estimate, paired


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    systems: tuple[str, ...]
    baseline: str  # differences are reported against this system
    readers: tuple[str, ...] = ("first",)
    families: tuple[str, ...] | None = None  # None: the core families
    distraction: float = 0.05
    reference: dict[str, str] = field(default_factory=dict)  # system -> the reference's number (text)
    notes: str = ""
    extra_args: tuple[str, ...] = ()  # world knobs passed to run_benchmark (--drop-keys, --no-wording)


STUDIES: dict[str, Study] = {
    s.name: s
    for s in (
        Study(
            "ablation",
            "Cumulative ablation and leave-one-out (reader first, core families)",
            (
                "A",
                "A+static",
                "+history",
                "+outcome",
                "+contradiction",
                "+cost_aware",
                "C",
                "C-contradiction",
                "C-outcome",
                "C-cost_aware",
                "C-retention",
                "C-guard",
            ),
            baseline="C",
            reference={
                "A": "62.6",
                "+history": "64.0 (heuristic)",
                "+outcome": "+5.8 pp over the previous step",
                "+contradiction": "+7.2 pp over the previous step",
                "C": "76.8 (heuristic) / 76.4 (learned)",
                "C-contradiction": "−8.1 pp",
                "C-outcome": "−6.5 pp",
                "C-cost_aware": "−2.1 pp",
                "C-retention": "−1.4 pp",
                "C-guard": "−0.6 pp (within noise)",
            },
        ),
        Study(
            "credit",
            "Credit assignment (same system, different attribution; reader first)",
            ("C", "C_equal", "C_usage_only", "C_loo_full", "C_loo_ambiguous", "C_noise10", "C_noise20"),
            baseline="C",
            reference={
                "C": "76.4",
                "C_equal": "69.8",
                "C_usage_only": "78.4",
                "C_loo_ambiguous": "matches full LOO with 82% fewer extra agent calls",
                "C_noise10": "76.5",
                "C_noise20": "76.9",
            },
        ),
        Study(
            "explore",
            "Guard and exploration (reader first, core families)",
            ("C", "C-guard", "C_thompson", "C_no_explore"),
            baseline="C",
            reference={"C-guard": "−0.6 pp (within noise)", "C_thompson": "−1.7 pp, +3 tokens/task"},
        ),
        Study(
            "retention",
            "Retention: outcome-based vs frequency pruning (reader first)",
            ("C", "C_freqprune", "C-retention"),
            baseline="C",
            families=("rare_critical", "useless_frequent", "long_horizon"),
            reference={"C_freqprune": "archives ~60% of memory and destroys the rarely needed ones"},
        ),
        Study(
            "learned",
            "Learned vs heuristic utility (reader first, core families)",
            ("C", "C_learned"),
            baseline="C",
            reference={"C": "76.8 (heuristic)", "C_learned": "76.4 (learned); AUC 0.954 vs 0.958"},
        ),
        Study(
            "extraction",
            "Imperfect extraction: 20% of facts lose their entity/attribute key (reader first)",
            ("A", "B", "C"),
            baseline="A",
            families=("contradiction", "state_change"),
            extra_args=("--drop-keys", "0.2"),
            reference={"A": "48.7", "B": "55.9", "C": "70.4 (the two update families)"},
        ),
        Study(
            "learned_schema",
            "Learned single-valued schema, no update wording (reader first)",
            ("A", "C", "C_learned_schema"),
            baseline="A",
            families=("contradiction", "state_change"),
            extra_args=("--no-wording",),
            reference={
                "C_learned_schema": "recovers about half of the gap to a hand-written schema; "
                "never a false invalidation"
            },
        ),
        Study("sensitivity_d002", "Distraction 0.02 per irrelevant item", ("A", "C"), "A", distraction=0.02),
        Study("sensitivity_d010", "Distraction 0.10 per irrelevant item", ("A", "C"), "A", distraction=0.10),
    )
}


def study_table(study: Study, out: Path) -> str:
    """Markdown table of a finished study from its per-world run files."""
    from evals.harness.families import CORE_FAMILIES

    fams = study.families or CORE_FAMILIES
    per: dict[tuple[str, str], dict[int, dict[str, dict[str, Any]]]] = {}  # (reader, system) -> seed -> family -> run
    for fam in fams:
        for p in sorted((out / "runs" / fam).glob("*.json")):
            rec = json.loads(p.read_text())
            for r in rec["runs"]:
                per.setdefault((r["reader"], r["system"]), {}).setdefault(r["seed"], {})[fam] = r
    lines = [
        f"## {study.title}",
        "",
        f"Families: {', '.join(fams)}. Paired differences are against `{study.baseline}` over seeds.",
        "",
    ]
    for reader in study.readers:
        base = per.get((reader, study.baseline), {})
        lines += [
            f"Reader `{reader}`:",
            "",
            "| system | success % | Δ vs " + study.baseline + " (pp) | tokens/task | extra agent calls/task "
            "| archived | reference |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for system in study.systems:
            seeds = per.get((reader, system), {})
            full = {s: v for s, v in seeds.items() if len(v) == len(fams)}
            if not full:
                continue

            def mean_over(v: dict[str, dict[str, Any]], metric: str) -> float:
                return sum(float(r[metric]) for r in v.values()) / len(v)

            succ = estimate([mean_over(v, "success") for v in full.values()])
            common = sorted(set(full) & {s for s, v in base.items() if len(v) == len(fams)})
            diff = paired(
                [mean_over(base[s], "success") for s in common], [mean_over(full[s], "success") for s in common]
            )
            tok = estimate([mean_over(v, "tokens_per_task") for v in full.values()])
            calls = estimate([mean_over(v, "replays_per_task") for v in full.values()])
            arch = estimate([sum(r["states"].get("ARCHIVED", 0) for r in v.values()) / len(v) for v in full.values()])
            lines.append(
                f"| {system} | {succ.fmt()} | {diff.fmt() if system != study.baseline else '–'} | "
                f"{tok.fmt(scale=1.0)} | {calls.fmt(scale=1.0, digits=2)} | {arch.fmt(scale=1.0)} | "
                f"{study.reference.get(system, '')} |"
            )
        lines.append("")
    if study.notes:
        lines += [study.notes, ""]
    return "\n".join(lines)
