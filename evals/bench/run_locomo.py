"""LoCoMo retrieval benchmark (no LLM): evidence recall of each system over long two-person conversations.

    python -m evals.bench.run_locomo --data locomo10.json [--systems ReMem,ReMem-dense,ReMem-lexical,BM25]
        [--embedder hash|minilm] [--transfer ReMem] [--out results/locomo]

Input is the LoCoMo JSON (locomo10.json; CC BY-NC, never committed here): a list of samples with
``sample_id``, ``conversation`` (``speaker_a``, ``speaker_b``, ``session_<n>`` lists of turns
``{speaker, dia_id: "D<s>:<t>", text}`` and ``session_<n>_date_time`` like "1:56 pm on 8 May, 2023")
and ``qa`` (``question``, ``answer``, ``evidence`` dia ids, ``category`` 1 multi-hop, 2 temporal,
3 open-domain, 4 single-hop, 5 adversarial).

Per sample and system one fresh store holds every turn as a ``note`` memory "speaker: text", stamped
with its session's date (+ the turn index in seconds, so turns keep their order). Each question of
categories 1-4 is searched with k=10 and ``now`` one hour after the last turn; category 5 (adversarial,
no answer in the conversation) is excluded. Evidence ids are normalised (whitespace removed, then
every ``D(\\d+):(\\d+)`` taken, leading zeros dropped) and ids that name no turn are dropped; a question
left without evidence is counted and excluded. Metric: evidence recall@k, the fraction of a question's
evidence turns among the top k, for k = 1, 5, 10, per category and over categories 1-4. ``BM25`` is
plain Okapi BM25 (evals/bench/bm25.py, k1=1.5, b=0.75). No feedback is sent, so nothing is learned; system
C's retrieval-history features do see the sample's earlier searches, as they would in use.

Systems: those of evals/harness/systems.yaml, ``BM25``, and the library's own configurations
(evals/bench/retrieval.py ``library_systems``): ``ReMem`` (the default RememConfig, hybrid retrieval),
``ReMem-dense``, ``ReMem-lexical`` and ``cosine`` (``RememConfig.similarity_only`` on the dense channel, over
each turn's own vector).
The turns go in through ``ReMem.add_conversation`` (speaker and session kept as fields).

``--transfer SYSTEM`` adds the learning-transfer measurement: per sample two stores of SYSTEM;
in the learning store each even-index question (by its index in the sample's qa list) is searched (k=10,
task "locomo") and given feedback ``success`` = an evidence turn was served, ``used_ids`` = the served
evidence turns; the cold store gets the same searches without feedback. Then the odd-index questions are
searched in both, and recall@k of the pairs is compared: the paired mean difference with its 95% t-interval,
the Wilcoxon signed-rank and sign tests (evals/harness/stats.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from evals.bench.bm25 import BM25
from evals.bench.retrieval import KS, parse_date, select_systems, write_outputs
from evals.harness.embedders import CachedEmbedder, make_embedder
from evals.harness.replay import temp_store
from evals.harness.stats import estimate, paired, sign_test, wilcoxon_signed_rank
from evals.harness.systems import System
from remem_agent.ingest import FactExtractor
from remem_agent.memory import ReMem
from remem_agent.types import SearchResult

TASK = "locomo"

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SCORED = (1, 2, 3, 4)
_DIA_RE = re.compile(r"D(\d+):(\d+)")
_SESSION_RE = re.compile(r"^session_(\d+)$")


def load_samples(path: str | Path) -> list[dict[str, Any]] | None:
    """The samples of a LoCoMo JSON file (a single sample becomes a list of one); None, said on stderr, when the
    file holds something else."""
    samples = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(samples, dict):
        samples = [samples]
    if not isinstance(samples, list):
        print(f"{path}: expected a list of LoCoMo samples", file=sys.stderr)
        return None
    return samples


def normalise_dia_ids(value: object) -> list[str]:
    """Dia ids in ``value`` (a string or list), canonical "D<s>:<t>", in order, without duplicates."""
    items = value if isinstance(value, list | tuple) else [value]
    out: list[str] = []
    for item in items:
        if item is None:
            continue
        for s, t in _DIA_RE.findall(re.sub(r"\s+", "", str(item))):
            dia = f"D{int(s)}:{int(t)}"
            if dia not in out:
                out.append(dia)
    return out


def sample_turns(sample: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every turn of a sample's sessions (in session-number order): dia id, text, timestamp."""
    conv = sample.get("conversation") or {}
    sessions = sorted(
        (int(m.group(1)), key) for key in conv if (m := _SESSION_RE.match(key)) and isinstance(conv[key], list)
    )
    turns: list[dict[str, Any]] = []
    counts = {"sessions": len(sessions), "undated_sessions": 0, "skipped_turns": 0, "duplicate_dia_ids": 0}
    seen: set[str] = set()
    last = datetime(2000, 1, 1, tzinfo=UTC)
    for n, key in sessions:
        when = parse_date(conv.get(f"{key}_date_time"))
        if when is None:  # undated: a day after the previous session
            counts["undated_sessions"] += 1
            when = last + timedelta(days=1)
        last = when
        for ti, turn in enumerate(conv[key]):
            text = turn.get("text") if isinstance(turn, dict) else None
            ids = normalise_dia_ids(turn.get("dia_id")) if isinstance(turn, dict) else []
            if not isinstance(text, str) or not text.strip() or "\x00" in text:
                counts["skipped_turns"] += 1
                continue
            dia = ids[0] if ids else f"D{n}:{ti + 1}"  # a missing or broken dia id: its position
            if dia in seen:
                counts["duplicate_dia_ids"] += 1
            seen.add(dia)
            speaker = str(turn.get("speaker") or "speaker").strip()
            turns.append(
                {
                    "dia": dia,
                    "speaker": speaker,
                    "session": key,
                    "raw": text.strip(),
                    "text": f"{speaker}: {text.strip()}",
                    "t": when + timedelta(seconds=ti),
                }
            )
    return turns, counts


def sample_questions(sample: dict[str, Any], dia_ids: set[str]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The scored questions (categories 1-4) with resolvable evidence, and what was left out and why."""
    out: list[dict[str, Any]] = []
    counts = {"qa": 0, "excluded_category_5": 0, "excluded_bad_category": 0, "excluded_no_evidence": 0}
    counts["evidence_ids_dropped"] = 0
    for i, qa in enumerate(sample.get("qa") or []):
        counts["qa"] += 1
        try:
            cat = int(qa.get("category"))
        except (TypeError, ValueError):
            counts["excluded_bad_category"] += 1
            continue
        if cat == 5:
            counts["excluded_category_5"] += 1
            continue
        if cat not in SCORED or not isinstance(qa.get("question"), str) or not qa["question"].strip():
            counts["excluded_bad_category"] += 1
            continue
        ids = normalise_dia_ids(qa.get("evidence") or [])
        good = [d for d in ids if d in dia_ids]
        counts["evidence_ids_dropped"] += len(ids) - len(good)
        if not good:
            counts["excluded_no_evidence"] += 1
            continue
        out.append({"index": i, "question": qa["question"].strip(), "category": cat, "evidence": good})
    return out, counts


def recall_at(ranked: list[set[str]], evidence: list[str]) -> dict[str, float]:
    """Fraction of the evidence ids among the dia ids of the top k, for each k."""
    out = {}
    for k in KS:
        got = set().union(*ranked[:k]) if ranked[:k] else set()
        out[f"recall@{k}"] = sum(d in got for d in evidence) / len(evidence)
    return out


def rank_sample(
    system: System | None, embedder: Any, turns: list[dict[str, Any]], questions: list[dict[str, Any]], now: datetime
) -> list[list[set[str]]]:
    """Per question, the top-10 as sets of dia ids (a restated text stands for each of its turns)."""
    kmax = max(KS)
    if system is None:
        bm = BM25([t["text"] for t in turns])
        return [[{turns[i]["dia"]} for i in bm.top_k(q["question"], kmax)] for q in questions]
    out = []
    with temp_store(system.config, embedder, prefix="remem_bench_") as mem:
        dias = store_turns(mem, turns)
        for q in questions:
            res = mem.search(q["question"], k=kmax, now=now)
            out.append([dias.get(h.id, set()) for h in res.items])
    return out


def store_turns(mem: ReMem, turns: list[dict[str, Any]], extractor: FactExtractor | None = None) -> dict[str, set[str]]:
    """Every turn as a note through ``add_conversation`` (with ``extractor``, each session's facts too, stored
    after the turns); memory id -> the dia ids it stands for (a fact stands for none)."""
    mids = mem.add_conversation(
        [
            {"speaker": t["speaker"], "text": t["text"].split(": ", 1)[1], "timestamp": t["t"], "session": t["session"]}
            for t in turns
        ],
        extractor,
        turns=True,
    )[: len(turns)]
    dias: dict[str, set[str]] = {}
    for t, mid in zip(turns, mids, strict=True):
        dias.setdefault(mid, set()).add(t["dia"])
    return dias


def give_feedback(mem: ReMem, res: SearchResult, dias: dict[str, set[str]], evidence: set[str]) -> None:
    """The transfer protocol's feedback on one search: a success when it served evidence of its question, with
    the served evidence turns as ``used_ids``."""
    hits = [h.id for h in res.items if dias.get(h.id, set()) & evidence]
    mem.feedback(res.search_id, success=bool(hits), used_ids=hits)


def transfer_arms(
    system: System, embedder: Any, turns: list[dict[str, Any]], questions: list[dict[str, Any]], now: datetime
) -> tuple[dict[str, list[list[set[str]]]], set[str], set[str]]:
    """The transfer protocol's two arms: feedback on the even-index questions in the learning store only, then the
    odd ones' top-10 (as dia-id sets) in each store; also the dia ids the learning store served on the even
    questions and those of them its feedback called used."""
    kmax = max(KS)
    train = [q for q in questions if q["index"] % 2 == 0]
    test = [q for q in questions if q["index"] % 2 == 1]
    tops: dict[str, list[list[set[str]]]] = {}
    served: set[str] = set()
    used: set[str] = set()
    for arm in ("cold", "learned"):
        with temp_store(system.config, embedder, prefix="remem_bench_") as mem:
            dias = store_turns(mem, turns)
            for q in train:
                res = mem.search(q["question"], k=kmax, now=now, task=TASK)
                if arm == "learned":
                    evidence = set(q["evidence"])
                    give_feedback(mem, res, dias, evidence)
                    for h in res.items:
                        served |= dias.get(h.id, set())
                        used |= dias.get(h.id, set()) & evidence
            tops[arm] = []
            for q in test:
                res = mem.search(q["question"], k=kmax, now=now, task=TASK)
                tops[arm].append([dias.get(h.id, set()) for h in res.items])
    return tops, served, used


def transfer_sample(
    system: System, embedder: Any, turns: list[dict[str, Any]], questions: list[dict[str, Any]], now: datetime
) -> list[dict[str, Any]]:
    """Feedback on the even-index questions, then the odd ones' recall in that store and in a cold twin."""
    tops, _, _ = transfer_arms(system, embedder, turns, questions, now)
    test = [q for q in questions if q["index"] % 2 == 1]
    return [
        {
            "qa_index": q["index"],
            "category": q["category"],
            "cold": recall_at(c, q["evidence"]),
            "learned": recall_at(lt, q["evidence"]),
        }
        for q, c, lt in zip(test, tops["cold"], tops["learned"], strict=True)
    ]


def transfer_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric and group: cold and learned means, the paired difference and the two paired tests."""
    out: dict[str, Any] = {}
    for group in ["overall", *(CATEGORIES[c] for c in SCORED)]:
        sel = [r for r in rows if group == "overall" or CATEGORIES[r["category"]] == group]
        cell: dict[str, Any] = {"questions": len(sel)}
        for m in metric_names():
            cold = [r["cold"][m] for r in sel]
            learned = [r["learned"][m] for r in sel]
            cell[m] = {
                "cold": estimate(cold).to_dict(),
                "learned": estimate(learned).to_dict(),
                "learned_minus_cold": paired(cold, learned).to_dict(),
                "wilcoxon": wilcoxon_signed_rank(cold, learned).to_dict(),
                "sign_test": sign_test(cold, learned).to_dict(),
            }
        out[group] = cell
    return out


def transfer_by_sample(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per conversation: its questions and recall@5 cold, after feedback and the paired difference."""
    out: dict[str, Any] = {}
    for sid in dict.fromkeys(r["sample_id"] for r in rows):
        sel = [r for r in rows if r["sample_id"] == sid]
        cold = [r["cold"]["recall@5"] for r in sel]
        learned = [r["learned"]["recall@5"] for r in sel]
        out[sid] = {
            "questions": len(sel),
            "recall@5": {
                "cold": estimate(cold).to_dict(),
                "learned": estimate(learned).to_dict(),
                "learned_minus_cold": paired(cold, learned).to_dict(),
            },
        }
    return out


def metric_names() -> list[str]:
    return [f"recall@{k}" for k in KS]


def aggregate(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        per: dict[str, Any] = {}
        for group in ["overall", *(CATEGORIES[c] for c in SCORED)]:
            sel = [r for r in rows if group == "overall" or CATEGORIES[r["category"]] == group]
            cell: dict[str, Any] = {"questions": len(sel)}
            for m in metric_names():
                cell[m] = estimate([r["systems"][name][m] for r in sel]).to_dict()
            cell["mean_served"] = (sum(r["systems"][name]["served"] for r in sel) / len(sel)) if sel else 0.0
            per[group] = cell
        out[name] = per
    return out


def run(
    samples: list[dict[str, Any]],
    systems: list[tuple[str, System | None]],
    embedder: CachedEmbedder,
    transfer: System | None = None,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    transfer_rows: list[dict[str, Any]] = []
    totals: dict[str, int] = {}
    seconds = {n: 0.0 for n, _ in systems}
    for si, sample in enumerate(samples):
        sid = str(sample.get("sample_id", si))
        turns, tc = sample_turns(sample)
        questions, qc = sample_questions(sample, {t["dia"] for t in turns})
        for key, v in {**tc, **qc}.items():
            totals[key] = totals.get(key, 0) + v
        totals["turns"] = totals.get("turns", 0) + len(turns)
        if not turns or not questions:
            continue
        now = max(t["t"] for t in turns) + timedelta(hours=1)
        per_q: list[dict[str, Any]] = [
            {"sample_id": sid, "qa_index": q["index"], "category": q["category"], "evidence": q["evidence"]}
            for q in questions
        ]
        for r in per_q:
            r["systems"] = {}
        for name, system in systems:
            ts = time.perf_counter()
            ranked = rank_sample(system, embedder, turns, questions, now)
            seconds[name] += time.perf_counter() - ts
            for r, q, top in zip(per_q, questions, ranked, strict=True):
                r["systems"][name] = {
                    **recall_at(top, q["evidence"]),
                    "served": len(top),
                    "top": [sorted(s) for s in top],
                }
        rows += per_q
        if transfer is not None:
            transfer_rows += [
                {"sample_id": sid, **r} for r in transfer_sample(transfer, embedder, turns, questions, now)
            ]
    names = [n for n, _ in systems]
    meta = {
        "samples": len(samples),
        "questions": len(rows),
        **totals,
        "embedder": embedder.name,
        "k": list(KS),
        "embedding_seconds": round(embedder.seconds, 2),
        "seconds": round(time.perf_counter() - t0, 2),
        "system_seconds": {n: round(s, 2) for n, s in seconds.items()},
    }
    result: dict[str, Any] = {"meta": meta, "metrics": aggregate(rows, names), "questions": rows}
    if transfer is not None:
        result["transfer"] = {
            "system": transfer.name,
            "task": TASK,
            "summary": transfer_summary(transfer_rows),
            "by_sample": transfer_by_sample(transfer_rows),
            "questions": transfer_rows,
        }
    return result


def _fmt(cell: dict[str, Any]) -> str:
    return "–" if cell["n"] == 0 else f"{100 * cell['mean']:.1f}"


def markdown(result: dict[str, Any]) -> str:
    meta, agg = result["meta"], result["metrics"]
    names = list(agg)
    lines = [
        f"# LoCoMo evidence recall: {meta['name']}",
        "",
        f"Data: `{meta['data']}` · embedder: {meta['embedder']} · {meta['samples']} samples, {meta['turns']} turns · "
        f"{meta['questions']} questions scored (categories 1-4; {meta.get('excluded_category_5', 0)} adversarial "
        f"excluded, {meta.get('excluded_no_evidence', 0)} without resolvable evidence, "
        f"{meta.get('evidence_ids_dropped', 0)} evidence ids dropped) · runtime {meta['seconds']:.1f} s",
        "",
        "Cells: mean evidence recall@k in percent (fraction of a question's evidence turns in the top k).",
        "",
    ]
    groups = list(next(iter(agg.values()))) if agg else []
    for m in metric_names():
        lines += [f"## {m}", "", "| category | questions | " + " | ".join(names) + " |"]
        lines.append("|---" * (len(names) + 2) + "|")
        for g in groups:
            q = agg[names[0]][g]["questions"]
            lines.append(f"| {g} | {q} | " + " | ".join(_fmt(agg[n][g][m]) for n in names) + " |")
        lines.append("")
    lines.append("Mean served per question: " + ", ".join(f"{n} {agg[n]['overall']['mean_served']:.1f}" for n in names))
    lines.append("")
    if "transfer" in result:
        tr = result["transfer"]
        lines += [
            f"## Learning transfer ({tr['system']}): feedback on even-index questions, recall on the odd ones",
            "",
            "| category | questions | metric | cold | after feedback | paired difference | Wilcoxon p | sign p |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for g, cell in tr["summary"].items():
            for m in metric_names():
                c = cell[m]
                d = c["learned_minus_cold"]
                cold, learned = 100 * c["cold"]["mean"], 100 * c["learned"]["mean"]
                lines.append(
                    f"| {g} | {cell['questions']} | {m} | {cold:.1f} | {learned:.1f} | "
                    f"{100 * d['mean']:+.1f} ± {100 * d['ci95']:.1f} | {c['wilcoxon']['p']:.2g} | "
                    f"{c['sign_test']['p']:.2g} |"
                )
        lines += [
            "",
            "Per conversation (recall@5):",
            "",
            "| conversation | questions | cold | after feedback | paired difference |",
            "|---|---|---|---|---|",
        ]
        for sid, cell in tr.get("by_sample", {}).items():
            c = cell["recall@5"]
            d = c["learned_minus_cold"]
            lines.append(
                f"| {sid} | {cell['questions']} | {100 * c['cold']['mean']:.1f} | {100 * c['learned']['mean']:.1f} | "
                f"{100 * d['mean']:+.1f} ± {100 * d['ci95']:.1f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="locomo10.json")
    ap.add_argument(
        "--systems",
        default="ReMem,ReMem-dense,ReMem-lexical,cosine,BM25",
        help="names from evals/harness/systems.yaml or evals/bench/retrieval.py library_systems, or BM25",
    )
    ap.add_argument("--transfer", help="also measure learning transfer with this system (e.g. ReMem)")
    ap.add_argument("--embedder", choices=("hash", "minilm"), default="hash")
    ap.add_argument("--out", default="results/locomo")
    ap.add_argument("--name", help="output file stem (default: the data file's stem)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    samples = load_samples(args.data)
    if samples is None:
        return 2
    systems = select_systems(args.systems)
    embedder = make_embedder(args.embedder)
    transfer = None
    if args.transfer:
        ((_, transfer),) = select_systems(args.transfer)
        if transfer is None:
            raise SystemExit("--transfer needs a ReMem system, not BM25")
    result = run(samples, systems, embedder, transfer)
    stem = args.name or Path(args.data).stem
    # the file name only: where a user keeps the (not redistributable) data is not part of the result
    result["meta"] = {"name": f"{stem}_{args.embedder}", "data": Path(args.data).name, **result["meta"]}
    write_outputs(result, markdown(result), Path(args.out) / f"{stem}_{args.embedder}", quiet=args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
