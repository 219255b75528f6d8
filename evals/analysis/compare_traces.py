"""Compare real-LLM trace sets over the same (family, seed, system) cells, the first set as the baseline.

Every set is classified by :mod:`evals.analysis.analyze_traces` (same categories, same heuristics; each set's
value domains come from its own lines, which are the same tasks, so the same domains). On top of that,
per cell, from the trace lines:

``citations_first``     the first attempt's JSON reply starts with the ``citations`` key (the order the
                        grammar imposed)
``repeated_citation``   some attempt's reply cites an id more than once (visible in the raw reply even
                        when the middleware keeps it once instead of rejecting the answer)
``no_valid_answer``     the ask ended without a valid answer (the middleware's error)
``who_ok``              successes on person-valued questions (``oncall``, ``approver``): the questions
                        where the memory-id answers happen
``memid_is_gold``       memory-id answers whose id is the gold memory's (the model pointed at the right
                        memory instead of copying its value); with per-ask aliases (traces with
                        ``aliases``), an answer that is a label (``M1``) names the memory it maps to
``memid_alias``         memory-id answers written as an alias label rather than an ``m_...`` id
``empty_citations``     valid answers citing nothing; ``citations`` all cited ids; ``gold_cited`` lines
                        whose citations include a gold memory

and, against the baseline set, a paired view by task id: tasks that succeeded in both, only in the
baseline, only in the other set, in neither, with an exact two-sided sign test on the discordant tasks
(tasks repeat questions, so discordant tasks are not independent: the distinct questions are counted too).

    python -m evals.analysis.compare_traces \\
        --cells contradiction_0_A,contradiction_0_C,state_change_0_A,state_change_0_C \\
        --sets before=traces/llm,after=traces/llm_after_fixes \\
        --out results/llm_agent/iterations/after_fixes/comparison.json
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.analysis.analyze_traces import PRIMARY, _parse, build_domains, classify, memory_ref
from evals.harness.jsonio import write_json
from evals.harness.stats import mcnemar_exact
from remem_agent.agent.trace import load_traces

WHO_ATTRIBUTES = ("oncall", "approver")
_MEMORY_ID = re.compile(r"m_[0-9a-f]{8,}")


def _first_key(raw: str | None) -> str | None:
    body = (raw or "").lstrip()
    if not body.startswith("{"):
        return None
    rest = body[1:].lstrip()
    if not rest.startswith('"'):
        return None
    end = rest.find('"', 1)
    return rest[1:end] if end > 0 else None


def _repeated(raw: str | None) -> bool:
    obj = _parse(raw)
    cites = obj.get("citations") if isinstance(obj, Mapping) else None
    if not isinstance(cites, list):
        return False
    strs = [c for c in cites if isinstance(c, str)]
    return len(strs) != len(set(strs))


def _attribute(rec: Mapping[str, Any]) -> str:
    key = str(next(iter(rec.get("truth") or {"?": ""})))
    return key.split(".", 1)[-1]


def cell_stats(recs: Sequence[Mapping[str, Any]], domains: Mapping[str, set[str]]) -> dict[str, Any]:
    primary = dict.fromkeys(PRIMARY, 0)
    s: dict[str, Any] = dict.fromkeys(
        (
            "lines", "successes", "failures", "stale_served", "stale_cited", "citations_first",
            "repeated_citation", "no_valid_answer", "reasked", "attempts", "who_lines", "who_ok",
            "other_lines", "other_ok", "memid_is_gold", "valid", "empty_citations", "citations",
            "gold_cited", "completion_tokens", "prompt_tokens", "memid_alias",
        ),
        0,
    )  # fmt: skip
    lat: list[float] = []
    by_task: dict[str, tuple[bool, str]] = {}
    for r in recs:
        c = classify(r, domains)
        attempts = r.get("attempts") or []
        who = _attribute(r) in WHO_ATTRIBUTES
        cites = set(r.get("citations") or [])
        s["lines"] += 1
        s["successes"] += c["success"]
        s["failures"] += not c["success"]
        if c["primary"]:
            primary[c["primary"]] += 1
        s["stale_served"] += c["flags"]["stale_served"]
        s["stale_cited"] += c["flags"]["stale_cited"]
        s["reasked"] += c["flags"]["reasked"]
        s["citations_first"] += _first_key((attempts or [{}])[0].get("raw")) == "citations"
        s["repeated_citation"] += any(_repeated(a.get("raw")) for a in attempts)
        s["no_valid_answer"] += bool(r.get("error"))
        s["attempts"] += len(attempts)
        s["who_lines" if who else "other_lines"] += 1
        s["who_ok" if who else "other_ok"] += c["success"]
        if c["primary"] == "answered_memory_id":
            answer = r.get("answer") or {}
            refs = [memory_ref(r, answer.get(k)) for k in (r.get("truth") or answer)]
            refs = [x for x in refs if x] or [memory_ref(r, v) for v in answer.values()]
            s["memid_is_gold"] += any(x in c["gold_ids"] for x in refs if x)
            s["memid_alias"] += not any(_MEMORY_ID.search(str(v)) for v in answer.values())
        if r.get("answer") is not None:
            s["valid"] += 1
            s["empty_citations"] += not cites
        s["citations"] += len(cites)
        s["gold_cited"] += bool(cites & c["gold_ids"])
        s["completion_tokens"] += sum(((a.get("usage") or {}).get("completion_tokens") or 0) for a in attempts)
        s["prompt_tokens"] += sum(((a.get("usage") or {}).get("prompt_tokens") or 0) for a in attempts)
        lat.append((r.get("latency_ms") or {}).get("total") or 0.0)
        by_task[str(r.get("task_id"))] = (c["success"], str(r.get("question")))
    s["primary"] = primary
    s["latency_s_mean"] = sum(lat) / max(1, len(lat)) / 1000
    s["_by_task"] = by_task
    return s


def compare(sets: Mapping[str, Path], cells: Sequence[str]) -> dict[str, Any]:
    names = list(sets)
    out: dict[str, Any] = {"sets": {n: str(d) for n, d in sets.items()}, "cells": {}}
    stats: dict[str, dict[str, Any]] = {}
    for name, d in sets.items():
        recs = {c: list(load_traces(d / f"{c}.jsonl", kind="ask")) for c in cells}
        domains = build_domains(r for c in cells for r in recs[c])
        stats[name] = {c: cell_stats(recs[c], domains) for c in cells}
    base = names[0]
    for c in cells:
        row: dict[str, Any] = {}
        bt = stats[base][c]["_by_task"]
        for name in names:
            st = dict(stats[name][c])
            tasks = st.pop("_by_task")
            row[name] = st
            if name == base:
                continue
            common = [t for t in bt if t in tasks]
            lost = [t for t in common if bt[t][0] and not tasks[t][0]]
            won = [t for t in common if tasks[t][0] and not bt[t][0]]
            both = sum(bt[t][0] and tasks[t][0] for t in common)
            st["paired_vs_" + base] = {
                "common_tasks": len(common),
                "both_ok": both,
                f"only_{base}_ok": len(lost),
                f"only_{name}_ok": len(won),
                "both_failed": len(common) - both - len(lost) - len(won),
                "sign_test_p": mcnemar_exact(len(lost), len(won)).p_value,
                f"only_{base}_ok_questions": sorted({bt[t][1] for t in lost}),
                f"only_{name}_ok_questions": sorted({tasks[t][1] for t in won}),
            }
        out["cells"][c] = row
    return out


def pooled(res: Mapping[str, Any]) -> dict[str, Any]:
    """Sums over cells (successes and counts; the sign test on all discordant tasks, questions distinct per cell)."""
    names = list(res["sets"])
    base = names[0]
    out: dict[str, Any] = {}
    for name in names:
        tot: dict[str, Any] = {}
        for row in res["cells"].values():
            for k, v in row[name].items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    tot[k] = tot.get(k, 0) + v
                elif k == "primary":
                    tot.setdefault("primary", dict.fromkeys(PRIMARY, 0))
                    for p, n in v.items():
                        tot["primary"][p] += n
        tot["latency_s_mean"] = tot["latency_s_mean"] / max(1, len(res["cells"]))
        if name != base:
            lost = sum(row[name][f"paired_vs_{base}"][f"only_{base}_ok"] for row in res["cells"].values())
            won = sum(row[name][f"paired_vs_{base}"][f"only_{name}_ok"] for row in res["cells"].values())
            tot[f"paired_vs_{base}"] = {
                f"only_{base}_ok": lost,
                f"only_{name}_ok": won,
                "sign_test_p": mcnemar_exact(lost, won).p_value,
            }
        out[name] = tot
    return out


ROWS: tuple[tuple[str, Any], ...] = (
    ("success", lambda d: f"{d['successes']}/{d['lines']} ({d['successes'] / max(1, d['lines']):.0%})"),
    ("&nbsp; on who-questions (oncall, approver)", lambda d: f"{d['who_ok']}/{d['who_lines']}"),
    ("&nbsp; on the other questions", lambda d: f"{d['other_ok']}/{d['other_lines']}"),
    ("**failures**", lambda d: d["failures"]),
    *((f"&nbsp; {k}", lambda d, k=k: d["primary"][k]) for k in PRIMARY[: PRIMARY.index("answered_memory_id") + 1]),
    ("&nbsp;&nbsp; of which written as an alias (M1, ...)", lambda d: d.get("memid_alias", 0)),
    *((f"&nbsp; {k}", lambda d, k=k: d["primary"][k]) for k in PRIMARY[PRIMARY.index("answered_memory_id") + 1 :]),
    ("memory-id / alias answers naming the gold memory", lambda d: d["memid_is_gold"]),
    ("no valid answer (after re-asks)", lambda d: d["no_valid_answer"]),
    ("reply repeats a citation (any attempt)", lambda d: d["repeated_citation"]),
    ("re-asked", lambda d: d["reasked"]),
    ("stale served / stale cited", lambda d: f"{d['stale_served']} / {d['stale_cited']}"),
    ("reply starts with citations", lambda d: d["citations_first"]),
    ("valid answers citing nothing", lambda d: f"{d['empty_citations']}/{d['valid']}"),
    ("cited ids per line", lambda d: f"{d['citations'] / max(1, d['lines']):.2f}"),
    ("lines citing a gold memory", lambda d: d["gold_cited"]),
    ("completion tokens per line", lambda d: f"{d['completion_tokens'] / max(1, d['lines']):.0f}"),
    ("prompt tokens per line", lambda d: f"{d.get('prompt_tokens', 0) / max(1, d['lines']):.0f}"),
    ("mean latency s", lambda d: f"{d['latency_s_mean']:.1f}"),
)


def _one_table(title: str, data: Mapping[str, Mapping[str, Any]], base: str) -> list[str]:
    names = list(data)
    lines = [f"#### {title}", "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, get in ROWS:
        lines.append(f"| {label} | " + " | ".join(str(get(data[n])) for n in names) + " |")
    cells = []
    for n in names:
        p = data[n].get(f"paired_vs_{base}")
        cells.append(f"−{p[f'only_{base}_ok']} +{p[f'only_{n}_ok']} (p={p['sign_test_p']:.2g})" if p else "")
    lines.append(f"| tasks lost / won vs {base} (exact sign test) | " + " | ".join(cells) + " |")
    return [*lines, ""]


def to_markdown(res: Mapping[str, Any]) -> str:
    """One table per cell (columns: the sets) and one summed over the cells."""
    names = list(res["sets"])
    lines: list[str] = []
    for cell, row in res["cells"].items():
        lines += _one_table(cell, {n: row[n] for n in names}, names[0])
    pool = pooled(res)
    lines += _one_table("all cells (summed)", {n: pool[n] for n in names}, names[0])
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Compare trace sets over the same cells (the first set is the baseline).")
    p.add_argument("--sets", required=True, help="name=trace_dir,name=trace_dir,... (baseline first)")
    p.add_argument("--cells", required=True, help="comma-separated <family>_<seed>_<system> stems")
    p.add_argument("--out", default=None, help="write the comparison as JSON here")
    args = p.parse_args(argv)
    sets = {k: Path(v) for k, _, v in (s.partition("=") for s in args.sets.split(",") if s)}
    res = compare(sets, [c for c in args.cells.split(",") if c])
    res["pooled"] = pooled(res)
    if args.out:
        write_json(args.out, res, indent=1, newline=False)
    print(to_markdown(res))


if __name__ == "__main__":
    main()
