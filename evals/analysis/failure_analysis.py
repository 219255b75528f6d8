"""Failure analysis of a benchmark run: what a system still gets wrong, task by task.

    python -m evals.analysis.failure_analysis                               # system C, reader first, results/benchmark
    python -m evals.analysis.failure_analysis --bench results/quick --system B --reader latest

For every task of the chosen system and reader, tags are computed from the run's rows
(``runs/<family>/<seed>.json``) and from the world, regenerated deterministically with
``make_world(family, seed, WorldParams(n_tasks=<params.tasks_per_world of benchmark.json>))``, which tells
each served fact's hidden kind, key and value and each task's needs. The simulated reader is replayed on
the served facts (it is deterministic) to recover the answer, and the replay is checked against the row.

Tags (a task can carry several):

=================================== ======================================================================
success / failure                   the task's outcome
gold_never_served                   for some needed key, no fact true at the time asked was served
gold_served_but_failed_distracted   every needed key had a true fact in context, the reader lost the thread
gold_served_but_failed_other        every needed key had a true fact in context, failed all the same
stale_chosen                        the answer committed to an outdated value that was in context
stale_in_context                    a served fact asserted an outdated value for a needed key
irrelevant_context                  failure, >= 1 irrelevant memory served, and the reader was distracted
similar_correct_pushed_out          a true fact for a needed key was in the store, not served, while
                                    system A (pure similarity) served it on the same task
gold_missed_by_A_too                a true fact for a needed key was not served, and A did not serve it either
guessed                             the reader guessed at chance level for some needed key
empty_context                       nothing was served
=================================== ======================================================================

Each failure also gets one **cause**, in this order: ``gold_never_served``, ``distracted`` (gold in context),
``stale_chosen`` (gold in context), ``other``.

Writes ``<bench>/failures.jsonl`` (one line per failed task) and ``<bench>/failure_analysis.md``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from evals.harness.families import CORE_FAMILIES, make_world
from evals.harness.jsonio import dumps
from evals.harness.reader import ReaderParams, read, reader_mode
from evals.harness.world import Fact, Task, World, WorldParams, key_name

TAGS = (
    "success",
    "failure",
    "gold_never_served",
    "gold_served_but_failed_distracted",
    "gold_served_but_failed_other",
    "stale_chosen",
    "stale_in_context",
    "irrelevant_context",
    "similar_correct_pushed_out",
    "gold_missed_by_A_too",
    "guessed",
    "empty_context",
)
CAUSES = ("gold_never_served", "distracted", "stale_chosen", "other")
TABLE_TAGS = (
    "gold_never_served",
    "similar_correct_pushed_out",
    "gold_missed_by_A_too",
    "gold_served_but_failed_distracted",
    "gold_served_but_failed_other",
    "stale_chosen",
    "stale_in_context",
    "irrelevant_context",
    "guessed",
    "empty_context",
)


def _status(f: Fact, task: Task, asked_at: float) -> str:
    """What a served fact is to this task: current / stale / future (for a needed key), or its kind."""
    if f.key in task.needs:
        if f.t > asked_at:
            return "future"
        return "current" if f.value == task.truth.get(key_name(f.key)) else "stale"
    if f.key is not None:
        return "other_key"
    return f.kind


def _gold_facts(facts: Sequence[Fact], task: Task, asked_at: float) -> dict[tuple[str, str], list[Fact]]:
    """Per needed key, the facts in the store when the task was asked that assert the value true at ``asked_at``."""
    out: dict[tuple[str, str], list[Fact]] = {}
    for key in task.needs:
        truth = task.truth.get(key_name(key))
        out[key] = [f for f in facts if f.key == key and f.t <= asked_at and f.t <= task.t and f.value == truth]
    return out


def analyse_world(
    world: World,
    rows: Sequence[dict[str, Any]],
    *,
    reader: ReaderParams,
    system: str,
    baseline_rows: Sequence[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One record per task of ``rows`` (a run of ``system`` on ``world``) with its tags and, on failure, cause.

    ``baseline_rows`` are system A's rows of the same world and reader (for ``similar_correct_pushed_out``).
    """
    tasks = list(world.tasks())
    if [t.tid for t in tasks] != [r["tid"] for r in rows]:
        raise ValueError(
            f"{world.family}/{world.seed}: the run's tasks do not match the regenerated world "
            f"({len(rows)} rows vs {len(tasks)} tasks): was it run with another --tasks?"
        )
    base = {r["tid"]: r for r in baseline_rows or ()}
    facts = list(world.facts())
    fidx = {f.fid: f for f in facts}
    # (fid, task class) -> times served before on a task that did not need it (filler) / that needed it (own)
    filler: Counter[tuple[str, str]] = Counter()
    own: Counter[tuple[str, str]] = Counter()
    out = []
    for task, row in zip(tasks, rows, strict=True):
        asked_at = task.as_of if task.as_of is not None else task.t
        served = [fidx[fid] for fid in row["served_fids"]]
        reading = read(task, served, seed=world.seed, params=reader, domains=world.domains)
        replay_ok = (
            reading.success == row["success"]
            and reading.gold_served == row["gold_served"]
            and reading.stale_in_context == row["stale_in_context"]
            and reading.distracted == row["distracted"]
            and reading.guessed == row["guessed"]
        )
        gold = _gold_facts(facts, task, asked_at)
        served_ids = set(row["served_fids"])
        missing = [k for k, fs in gold.items() if fs and not any(f.fid in served_ids for f in fs)]
        tags = ["success" if row["success"] else "failure"]
        if not row["gold_served"]:
            tags.append("gold_never_served")
        failed = not row["success"]
        if failed and row["gold_served"]:
            tags.append("gold_served_but_failed_distracted" if row["distracted"] else "gold_served_but_failed_other")
        by_fid = {f.fid: f for f in served}
        stale_used = any(
            (k := by_fid[u].key) is not None and by_fid[u].value != task.truth.get(key_name(k)) for u in reading.used
        )
        if failed and stale_used:
            tags.append("stale_chosen")
        if row["stale_in_context"]:
            tags.append("stale_in_context")
        irrelevant = sum(f.key not in task.needs for f in served)
        if failed and irrelevant and row["distracted"]:
            tags.append("irrelevant_context")
        b = base.get(task.tid)
        a_served_gold = None
        if b is not None and system != "A":
            a_ids = set(b["served_fids"])
            a_served_gold = [k for k in missing if any(f.fid in a_ids for f in gold[k])]
            if a_served_gold:
                tags.append("similar_correct_pushed_out")
            if any(k not in a_served_gold for k in missing):
                tags.append("gold_missed_by_A_too")
        if row["guessed"]:
            tags.append("guessed")
        if not served:
            tags.append("empty_context")
        missing_ids = [f.fid for k in missing for f in gold[k]]
        served_gold = [f.fid for fs in gold.values() for f in fs if f.fid in served_ids]
        exposures = {
            fid: [filler[(fid, task.task_class)], own[(fid, task.task_class)]] for fid in missing_ids + served_gold
        }
        for f in served:
            (own if f.key in task.needs else filler)[(f.fid, task.task_class)] += 1
        cause = None
        if failed:
            if not row["gold_served"]:
                cause = "gold_never_served"
            elif row["distracted"]:
                cause = "distracted"
            elif stale_used:
                cause = "stale_chosen"
            else:
                cause = "other"
        out.append(
            {
                "family": world.family,
                "seed": world.seed,
                "system": system,
                "reader": reader.mode,
                "tid": task.tid,
                "task_class": task.task_class,
                "query": task.query,
                "historical": task.as_of is not None,
                "critical": task.critical,
                "truth": dict(task.truth),
                "answer": reading.answer,
                "success": row["success"],
                "cause": cause,
                "tags": tags,
                "served": [[f.fid, f.kind, _status(f, task, asked_at)] for f in served],
                "gold_in_store": [f.fid for fs in gold.values() for f in fs],
                "gold_not_served": missing_ids,
                # per true fact: [times served before in this task class as filler (on a question not needing
                # it), times served before on a question needing it]
                "gold_exposures": exposures,
                "a_success": b["success"] if b is not None else None,
                "replay_ok": replay_ok,
            }
        )
    return out


def _bench_params(bench_dir: Path) -> dict[str, Any]:
    bench = json.loads((bench_dir / "benchmark.json").read_text())
    params = bench.get("params") or {}
    return {
        "families": bench["families"],
        "seeds": bench["seeds"],
        "n_tasks": int(params.get("tasks_per_world") or WorldParams().n_tasks),
        "distraction": float(params.get("distraction", ReaderParams().distraction)),
    }


def _find(runs: Iterable[dict[str, Any]], system: str, reader: str) -> dict[str, Any] | None:
    return next((r for r in runs if r["system"] == system and r["reader"] == reader), None)


def analyse(bench_dir: Path, *, system: str = "C", reader: str = "first") -> dict[str, list[dict[str, Any]]]:
    """Records of every task of ``system`` and of system A (reader ``reader``), over the run's worlds."""
    p = _bench_params(bench_dir)
    rp = ReaderParams(mode=reader_mode(reader), distraction=p["distraction"])
    records: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for fam in p["families"]:
        for seed in p["seeds"]:
            path = bench_dir / "runs" / fam / f"{seed}.json"
            if not path.exists():
                continue
            runs = json.loads(path.read_text())["runs"]
            mine, base = _find(runs, system, reader), _find(runs, "A", reader)
            if mine is None:
                continue
            world = make_world(fam, seed, WorldParams(n_tasks=p["n_tasks"]))
            records[system] += analyse_world(
                world, mine["rows"], reader=rp, system=system, baseline_rows=base["rows"] if base else None
            )
            if base is not None and system != "A":
                records["A"] += analyse_world(world, base["rows"], reader=rp, system="A")
    return dict(records)


# -- report -------------------------------------------------------------------------------------------


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.1f}" if d else "–"


def tag_counts(records: Sequence[dict[str, Any]]) -> Counter[str]:
    return Counter(t for r in records for t in r["tags"])


def _per_family(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        out[r["family"]].append(r)
    return out


def _family_groups(
    records: Sequence[dict[str, Any]], families: Sequence[str]
) -> list[tuple[str, list[dict[str, Any]]]]:
    """(family, its records) per family present, then all core families together."""
    fam = _per_family(records)
    core = [r for f in families if f in CORE_FAMILIES for r in fam.get(f, [])]
    rows = [(f, fam[f]) for f in families if f in fam]
    if core:
        rows.append(("**core families**", core))
    return rows


def _family_table(records: Sequence[dict[str, Any]], families: Sequence[str], tags: Sequence[str]) -> list[str]:
    lines = [
        "| family | tasks | success | " + " | ".join(t.replace("_", " ") for t in tags) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in tags) + " |",
    ]
    for name, rs in _family_groups(records, families):
        c = tag_counts(rs)
        cells = [str(len(rs)), _pct(c["success"], len(rs)), *(_pct(c[t], len(rs)) for t in tags)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _cause_table(records: Sequence[dict[str, Any]], families: Sequence[str]) -> list[str]:
    lines = [
        "| family | failures | " + " | ".join(c.replace("_", " ") for c in CAUSES) + " |",
        "| --- | --- | " + " | ".join("---" for _ in CAUSES) + " |",
    ]
    for name, rs in _family_groups(records, families):
        fails = [r for r in rs if not r["success"]]
        c = Counter(r["cause"] for r in fails)
        lines.append(f"| {name} | {len(fails)} | " + " | ".join(_pct(c[x], len(fails)) for x in CAUSES) + " |")
    return lines


def top_tags(records: Sequence[dict[str, Any]], n: int = 5, core_only: bool = True) -> list[tuple[str, float]]:
    """The most frequent tags of *failed* tasks, as % of all tasks (core families by default)."""
    rs = [r for r in records if not core_only or r["family"] in CORE_FAMILIES]
    c = tag_counts([r for r in rs if not r["success"]])
    ranked = sorted(((t, 100 * c[t] / len(rs)) for t in TABLE_TAGS if c[t]), key=lambda x: -x[1]) if rs else []
    return ranked[:n]


def _median(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    if not ys:
        return math.nan
    m = len(ys) // 2
    return float(ys[m]) if len(ys) % 2 else (ys[m - 1] + ys[m]) / 2


def _filler_note(records: Sequence[dict[str, Any]], system: str, min_exposures: int = 3) -> list[str]:
    """Share of a true fact's earlier exposures in its task class that were as filler for other questions."""

    def share(r: dict[str, Any], fid: str) -> float | None:
        fill, own = r["gold_exposures"][fid]
        return fill / (fill + own) if fill + own >= min_exposures else None

    pushed = [
        x
        for r in records
        if "similar_correct_pushed_out" in r["tags"]
        for f in r["gold_not_served"]
        if (x := share(r, f)) is not None
    ]
    served = [
        x
        for r in records
        for f in r["gold_exposures"]
        if f not in r["gold_not_served"] and (x := share(r, f)) is not None
    ]
    if not pushed or not served:
        return []
    return [
        "Why true facts get pushed out: of the earlier exposures (in the task class asked) of the true facts that "
        f"system {system} left out while A served them ({len(pushed)} cases with >= {min_exposures} exposures), a "
        f"median {100 * _median(pushed):.0f}% were as *filler* on other questions, which earn no credit; for the "
        f"true facts {system} did serve on their question, {100 * _median(served):.0f}% ({len(served)} cases). "
        "Uncredited exposures lower a memory's per-class contribution rate, which can lift its similarity guard "
        "and drop it under the utility floor for the question it does answer.",
        "",
    ]


def _example(r: dict[str, Any], texts: dict[tuple[str, int], dict[str, str]]) -> list[str]:
    t = texts[(r["family"], r["seed"])]
    lines = [
        f"* `{r['tid']}` ({r['family']}, cause **{r['cause']}**; tags: {', '.join(r['tags'][1:])})",
        f"  * query: “{r['query']}” — truth {r['truth']}, answered {r['answer']}"
        + ("; system A answered correctly" if r.get("a_success") else ""),
    ]
    for fid, kind, status in r["served"]:
        lines.append(f"  * served `{fid}` [{kind}, {status}]: {t[fid]}")
    if not r["served"]:
        lines.append("  * nothing served")
    for fid in r["gold_not_served"][:2]:
        fill, own = r["gold_exposures"].get(fid, (0, 0))
        lines.append(
            f"  * not served: true fact `{fid}` (served before in this class: {fill}x as filler, {own}x on its own "
            f"question): {t[fid]}"
        )
    return lines


def write_outputs(
    bench_dir: Path, records: dict[str, list[dict[str, Any]]], *, system: str, reader: str, n_examples: int = 6
) -> tuple[Path, Path]:
    p = _bench_params(bench_dir)
    families = p["families"]
    mine = records.get(system, [])
    fails = [r for r in mine if not r["success"]]
    jsonl = bench_dir / "failures.jsonl"
    with jsonl.open("w") as fh:
        for r in fails:
            line = {k: v for k, v in r.items() if k not in ("replay_ok", "success")}
            fh.write(dumps(line, separators=(",", ":")) + "\n")

    bad_replay = sum(not r["replay_ok"] for rs in records.values() for r in rs)
    lines = [
        f"# Failure analysis: system {system}, reader `{reader}`",
        "",
        "Generated by "
        f"`python -m evals.analysis.failure_analysis --bench {bench_dir} --system {system} --reader {reader}` "
        f"from {len({(r['family'], r['seed']) for r in mine})} worlds ({len(families)} families x "
        f"{len(p['seeds'])} seeds, {p['n_tasks']} tasks per world). Worlds are regenerated from their seed; the "
        f"simulated reader is replayed on the served facts ({bad_replay} replay mismatches with the recorded rows).",
        "",
        "What the system still gets wrong: each task is tagged from what was served (its hidden kind, key and "
        "value) and what the reader did. Percentages are of **all tasks** of the family unless said otherwise. "
        f"`failures.jsonl` holds the {len(fails)} failed tasks, one per line, with tags, cause, answer and the "
        "served facts as `[fid, kind, status]` (status: current / stale / future for a needed key, `other_key` "
        "for another key's state fact, else the fact's kind).",
        "",
        "Tags: `gold_never_served` no fact true at the time asked was served for some needed key; "
        "`similar_correct_pushed_out` such a fact was in the store and system A (pure similarity) served it on "
        "the same task; `gold_missed_by_A_too` neither served it; `gold_served_but_failed_distracted` / `_other` "
        "failed with the truth in context, distracted or not; `stale_chosen` the answer used an outdated value; "
        "`stale_in_context` an outdated value was served; `irrelevant_context` failed, distracted, with "
        "irrelevant memories served; `guessed` answered at chance level; `empty_context` nothing served.",
        "",
    ]
    if mine:
        fails_core = [r for r in fails if r["family"] in CORE_FAMILIES]
        core = [r for r in mine if r["family"] in CORE_FAMILIES]
        lines += [
            "## Summary (core families)",
            "",
            f"System {system} fails {_pct(len(fails_core), len(core))}% of {len(core)} tasks. Cause of failure "
            "(share of failures): "
            + ", ".join(
                f"{c.replace('_', ' ')} {_pct(n, len(fails_core))}%"
                for c, n in Counter(r["cause"] for r in fails_core).most_common()
            )
            + ".",
            "",
        ]
        if "A" in records and system != "A":
            a_core = [r for r in records["A"] if r["family"] in CORE_FAMILIES]
            ca, cs = tag_counts(a_core), tag_counts(core)
            lines += [
                f"| tag (% of core tasks) | {system} | A |",
                "| --- | --- | --- |",
                f"| failure | {_pct(cs['failure'], len(core))} | {_pct(ca['failure'], len(a_core))} |",
            ]
            for t in TABLE_TAGS:
                a_val = (
                    "n/a" if t in ("similar_correct_pushed_out", "gold_missed_by_A_too") else _pct(ca[t], len(a_core))
                )
                lines.append(f"| {t} | {_pct(cs[t], len(core))} | {a_val} |")
            a_ok = {(r["family"], r["seed"], r["tid"]) for r in a_core if r["success"]}
            lost = sum(1 for r in fails_core if (r["family"], r["seed"], r["tid"]) in a_ok)
            won = sum(1 for r in core if r["success"] and (r["family"], r["seed"], r["tid"]) not in a_ok)
            lines += [
                "",
                f"On {lost} core tasks ({_pct(lost, len(core))}%) system {system} failed where A succeeded; on {won} "
                f"({_pct(won, len(core))}%) A failed where {system} succeeded.",
                "",
                *_filler_note(core, system),
            ]
        lines += [f"## Cause of failure per family, system {system} (% of failures)", ""]
        lines += _cause_table(mine, families)
        lines += ["", f"## Tags per family, system {system} (% of tasks)", ""]
        lines += _family_table(mine, families, TABLE_TAGS)
        lines.append("")
    if "A" in records and system != "A":
        a_tags = [t for t in TABLE_TAGS if t not in ("similar_correct_pushed_out", "gold_missed_by_A_too")]
        lines += ["## Cause of failure per family, system A (% of failures)", ""]
        lines += _cause_table(records["A"], families)
        lines += ["", "## Tags per family, system A (% of tasks)", ""]
        lines += _family_table(records["A"], families, a_tags)
        lines.append("")
    if fails:
        texts: dict[tuple[str, int], dict[str, str]] = {}
        for key in {(r["family"], r["seed"]) for r in fails}:
            w = make_world(key[0], key[1], WorldParams(n_tasks=p["n_tasks"]))
            texts[key] = {f.fid: f.text for f in w.facts()}
        lines += [f"## Examples (system {system})", ""]
        picked: list[dict[str, Any]] = []
        # one per (cause, family) pair, most frequent causes first, preferring failures A got right
        for cause, _ in Counter(r["cause"] for r in fails).most_common():
            seen: set[str] = set()
            for r in sorted(fails, key=lambda r: (not r.get("a_success"), r["family"], r["seed"], r["tid"])):
                if r["cause"] == cause and r["family"] not in seen and len(seen) < 3:
                    seen.add(r["family"])
                    picked.append(r)
        for r in picked[:n_examples]:
            lines += _example(r, texts)
        lines.append("")
    md = bench_dir / "failure_analysis.md"
    md.write_text("\n".join(lines))
    return jsonl, md


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evals.analysis.failure_analysis", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="results/benchmark", help="folder holding benchmark.json and runs/")
    ap.add_argument("--reader", default="first")
    ap.add_argument("--system", default="C")
    args = ap.parse_args(argv)
    bench_dir = Path(args.bench)
    records = analyse(bench_dir, system=args.system, reader=args.reader)
    if not records.get(args.system):
        raise SystemExit(f"no runs of system {args.system!r} with reader {args.reader!r} under {bench_dir}")
    jsonl, md = write_outputs(bench_dir, records, system=args.system, reader=args.reader)
    for name, rs in records.items():
        tops = ", ".join(f"{t} {v:.1f}%" for t, v in top_tags(rs))
        fails = [r for r in rs if r["family"] in CORE_FAMILIES and not r["success"]]
        n_core = sum(r["family"] in CORE_FAMILIES for r in rs)
        print(
            f"system {name}, reader {args.reader}: fails {_pct(len(fails), n_core)}% of core tasks; "
            f"top tags of failures (% of core tasks): {tops}"
        )
    print(f"-> {jsonl}, {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
