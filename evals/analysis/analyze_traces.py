"""Failure taxonomy of real-LLM runs, computed from ``MemoryAgent`` trace lines ALONE (no world access).

Everything used is in each trace line: the served memories (id, state, text), the answer schema, the
truth, the answer, the citations, and every attempt's raw reply and error kind. The system of a line
is its ``system`` field (``MemoryAgent(system=...)``), else the last ``_`` part of the file name; the
family is the ``task_id`` prefix (``contradiction-0-t0001``), else the file name's first part.

Per failed line, one primary category, checked in this order:

``invalid_json``       no valid answer after the re-asks and the last attempt was not JSON
``truncated``          no valid answer; the last attempt was cut off at max_tokens
``right_value_wrong_key`` the true value of a key appears in a JSON reply (final answer or any
                       attempt's raw reply), but not under that key
``invalid_right_value`` no valid answer, although a reply held the true value under the right key
                       (it failed on something else: e.g. repeated or unserved citations)
``invalid_other``      no valid answer for another reason (schema errors, citations of unserved ids)
``answered_memory_id`` a valid but wrong answer whose value is a memory id (``m_...``), not a value, or
                       (traces with per-ask ``aliases``) one of the citation labels shown (``M1``, ``[M2]``)
``gold_never_served``  a valid but wrong answer, and no served memory contains the true value
``answered_stale``     a valid but wrong answer equal to a value that a stale served memory holds
``answered_distractor`` a valid but wrong answer copied from another served memory (one that holds the
                       answered value but is neither gold nor stale for the key: another key's fact)
``gold_served_wrong``  any other valid but wrong answer although a served memory contains the true value

Flags counted over all lines (a line may have several): ``gold_served``, ``stale_served``,
``stale_cited``, ``unknown_citation`` (an attempt cited an id that was not served; the middleware
re-asked), ``duplicate_citations`` (an attempt repeated a citation: ``uniqueItems`` is not enforced by
llama.cpp grammars, and at temperature 0 a re-ask tends to repeat the same reply), ``invalid_json_attempt``,
``truncated_attempt``, ``reasked``.

Heuristics (text matching, so approximate):

* a memory *mentions a key* ``entity.attribute`` when its text contains the entity as a whole word
  (hyphens count as word characters);
* a memory *holds value v* when ``v`` occurs in its text as a whole token (case-insensitive);
* the *domain* of an attribute is the set of truth values of that attribute over all loaded lines
  (the traces never hold the world's value lists, so with few lines a domain can be incomplete);
* a memory is *gold* for a key when it mentions the entity and holds the true value;
* a memory is *stale* for a key when it mentions the entity, holds another value of the attribute's
  domain and not the true value; if the domain knows no other value, a memory that mentions the entity
  and the attribute's name but not the true value (and is not a question) counts as stale.

``python -m evals.analysis.analyze_traces traces/llm/*.jsonl.gz --out results/llm_agent/analysis`` writes
``analysis.json`` and ``analysis.md``.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evals.harness.jsonio import write_json
from remem_agent.agent.prompt import is_alias
from remem_agent.agent.scoring import normalise_value
from remem_agent.agent.trace import load_traces, trace_stem

PRIMARY = (
    "invalid_json",
    "truncated",
    "right_value_wrong_key",
    "invalid_right_value",
    "invalid_other",
    "answered_memory_id",
    "gold_never_served",
    "answered_stale",
    "answered_distractor",
    "gold_served_wrong",
)
FLAGS = (
    "gold_served",
    "stale_served",
    "stale_cited",
    "unknown_citation",
    "duplicate_citations",
    "invalid_json_attempt",
    "truncated_attempt",
    "reasked",
)
N_EXAMPLES = 3
_MEMORY_ID = re.compile(r"\bm_[0-9a-f]{8,}")


def memory_ref(rec: Mapping[str, Any], value: Any) -> str | None:
    """The memory a written answer value names instead of giving a value: the id, or None.

    Old traces show memories as ``[m:<id>]``: an ``m_...`` id in the value names that memory. Traces
    with per-ask ``aliases`` show ``[M1]``...: a value that is one of those labels (optionally
    bracketed) names the memory it maps to. A label-shaped value that was not shown maps to "?".
    """
    text = str(value or "")
    m = _MEMORY_ID.search(text)
    if m:
        return m.group(0)
    aliases = rec.get("aliases") or {}
    if aliases and is_alias(text):
        return str(aliases.get(text.strip().strip("[]").strip(), "?"))
    return None


def _norm(s: Any) -> str:
    return normalise_value(s)


def holds(text: str, value: str) -> bool:
    """``value`` occurs in ``text`` as a whole token (case-insensitive; hyphens are word characters)."""
    v = _norm(value)
    if not v:
        return False
    return re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-]|\.\w)", _norm(text)) is not None


def split_key(key: str) -> tuple[str | None, str]:
    ent, dot, attr = key.partition(".")
    return (ent, attr) if dot else (None, key)


def truth_map(rec: Mapping[str, Any]) -> dict[str, str]:
    truth = rec.get("truth")
    if isinstance(truth, Mapping):
        return {str(k): str(v) for k, v in truth.items()}
    if truth is None:
        return {}
    keys = [k for k in (rec.get("schema") or {}).get("properties", {}) if k != "citations"]
    return {keys[0] if len(keys) == 1 else "answer": str(truth)}


def build_domains(records: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    dom: dict[str, set[str]] = defaultdict(set)
    for rec in records:
        for k, v in truth_map(rec).items():
            dom[split_key(k)[1]].add(_norm(v))
    return dom


def memory_kind(text: str, key: str, truth: str, domain: set[str]) -> str | None:
    """Return "gold", "stale" or None for one served memory and one answer key (see the module doc)."""
    ent, attr = split_key(key)
    if ent is not None and not holds(text, ent):
        return None
    if holds(text, truth):
        return "gold"
    others = [v for v in domain if v != _norm(truth)]
    if others:
        return "stale" if any(holds(text, v) for v in others) else None
    if "?" not in text and attr and re.search(rf"\b{re.escape(attr.casefold())}", text.casefold()):
        return "stale"
    return None


def _values_in(obj: Any) -> Iterable[tuple[str | None, str]]:
    """(key, value) leaves of a parsed JSON reply (key = the top-level key holding the value)."""
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if k == "citations":
                continue
            for _, leaf in _values_in(v):
                yield str(k), leaf
    elif isinstance(obj, list):
        for v in obj:
            yield from _values_in(v)
    elif obj is not None:
        yield None, str(obj)


def _parse(raw: str | None) -> Any:
    if not raw:
        return None
    body = raw.strip()
    m = re.match(r"^```(?:json)?\s*(.*?)\s*```$", body, re.DOTALL)
    body = m.group(1) if m else body
    for cand in (body, body[body.find("{") : body.rfind("}") + 1] if "{" in body else ""):
        try:
            return json.loads(cand)
        except (json.JSONDecodeError, ValueError):
            continue
    return None


def right_value_wrong_key(rec: Mapping[str, Any], truth: Mapping[str, str]) -> bool:
    answer = rec.get("answer") or {}
    replies = [answer] + [_parse(a.get("raw")) for a in rec.get("attempts", [])]
    for k, v in truth.items():
        if _norm(answer.get(k)) == _norm(v):
            continue
        for obj in replies:
            if not isinstance(obj, Mapping):
                continue
            if _norm(obj.get(k)) == _norm(v):
                continue  # right value under the right key in this reply
            if any(key != k and (_norm(leaf) == _norm(v) or holds(leaf, v)) for key, leaf in _values_in(obj)):
                return True
    return False


def _right_value_in_a_reply(attempts: Sequence[Mapping[str, Any]], truth: Mapping[str, str]) -> bool:
    for a in attempts:
        obj = _parse(a.get("raw"))
        if isinstance(obj, Mapping) and truth and all(_norm(obj.get(k)) == _norm(v) for k, v in truth.items()):
            return True
    return False


def classify(rec: Mapping[str, Any], domains: Mapping[str, set[str]]) -> dict[str, Any]:
    """The primary category (None for a success) and the flags of one trace line."""
    truth = truth_map(rec)
    attempts = rec.get("attempts") or []
    kinds = [a.get("kind") for a in attempts]
    outcome = rec.get("outcome") or {}
    success = bool(outcome.get("success"))
    served = rec.get("served") or []
    cited = set(rec.get("citations") or [])
    gold_ids, stale_ids, stale_values = set(), set(), set()
    for s in served:
        text = s.get("text") or ""
        for k, v in truth.items():
            kind = memory_kind(text, k, v, domains.get(split_key(k)[1], set()))
            if kind == "gold":
                gold_ids.add(s["id"])
            elif kind == "stale":
                stale_ids.add(s["id"])
                stale_values |= {d for d in domains.get(split_key(k)[1], set()) if holds(text, d)}
    flags = {
        "gold_served": bool(gold_ids),
        "stale_served": bool(stale_ids),
        "stale_cited": bool(stale_ids & cited),
        "unknown_citation": "unknown_citation" in kinds,
        "duplicate_citations": any("non-unique" in e for a in attempts for e in a.get("errors") or []),
        "invalid_json_attempt": "invalid_json" in kinds,
        "truncated_attempt": "truncated" in kinds,
        "reasked": len(attempts) > 1,
    }
    primary: str | None = None
    if not success:
        answer = rec.get("answer")
        last = kinds[-1] if kinds else None
        if rec.get("error") and last == "invalid_json":
            primary = "invalid_json"
        elif rec.get("error") and last == "truncated":
            primary = "truncated"
        elif right_value_wrong_key(rec, truth):
            primary = "right_value_wrong_key"
        elif (rec.get("error") or answer is None) and _right_value_in_a_reply(attempts, truth):
            primary = "invalid_right_value"
        elif rec.get("error") or answer is None:
            primary = "invalid_other"
        elif any(memory_ref(rec, answer.get(k)) for k in truth):
            primary = "answered_memory_id"
        elif not gold_ids:
            primary = "gold_never_served"
        elif any(_norm(answer.get(k)) in stale_values and _norm(answer.get(k)) != _norm(v) for k, v in truth.items()):
            primary = "answered_stale"
        elif any(
            s["id"] not in gold_ids | stale_ids and holds(s.get("text") or "", str(answer.get(k) or ""))
            for s in served
            for k, v in truth.items()
            if _norm(answer.get(k)) != _norm(v)
        ):
            primary = "answered_distractor"
        else:
            primary = "gold_served_wrong"
    return {"success": success, "primary": primary, "flags": flags, "gold_ids": gold_ids, "stale_ids": stale_ids}


def system_of(rec: Mapping[str, Any], path: Path) -> str:
    return str(rec.get("system") or trace_stem(path).rsplit("_", 1)[-1])


def family_of(rec: Mapping[str, Any], path: Path) -> str:
    tid = rec.get("task_id") or ""
    parts = tid.rsplit("-", 2)
    return parts[0] if len(parts) == 3 else trace_stem(path).split("_", 1)[0]


def _example(rec: Mapping[str, Any], c: Mapping[str, Any], path: Path) -> dict[str, Any]:
    last_raw = next((a.get("raw") for a in reversed(rec.get("attempts") or []) if a.get("raw")), None)
    return {
        "file": path.name,
        "task_id": rec.get("task_id"),
        "question": rec.get("question"),
        "truth": rec.get("truth"),
        "answer": rec.get("answer"),
        "error": (rec.get("error") or "")[:200] or None,
        "last_raw": (last_raw or "")[:300],
        "served": [
            {
                "id": s["id"],
                "state": s.get("state"),
                "text": s.get("text"),
                "tag": "gold" if s["id"] in c["gold_ids"] else "stale" if s["id"] in c["stale_ids"] else "",
                "cited": s["id"] in (rec.get("citations") or []),
            }
            for s in rec.get("served") or []
        ],
    }


def _empty() -> dict[str, Any]:
    return {"lines": 0, "successes": 0, "primary": Counter(), "flags": Counter(), "failed_flags": Counter()}


def analyze(paths: Sequence[str | Path]) -> dict[str, Any]:
    loaded = [(Path(p), rec) for p in paths for rec in load_traces(p, kind="ask")]
    domains = build_domains(rec for _, rec in loaded)
    per_system: dict[str, dict[str, Any]] = defaultdict(_empty)
    per_fam_sys: dict[str, dict[str, Any]] = defaultdict(_empty)
    examples: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    latency, tokens = defaultdict(list), defaultdict(list)
    for path, rec in loaded:
        sysname, fam = system_of(rec, path), family_of(rec, path)
        c = classify(rec, domains)
        for bucket in (per_system[sysname], per_fam_sys[f"{fam}/{sysname}"]):
            bucket["lines"] += 1
            bucket["successes"] += c["success"]
            if c["primary"]:
                bucket["primary"][c["primary"]] += 1
            for f, on in c["flags"].items():
                bucket["flags"][f] += on
                if not c["success"]:
                    bucket["failed_flags"][f] += on
        if c["primary"] and len(examples[sysname][c["primary"]]) < N_EXAMPLES:
            examples[sysname][c["primary"]].append(_example(rec, c, path))
        latency[sysname].append((rec.get("latency_ms") or {}).get("total") or 0.0)
        tokens[sysname].append(
            sum(
                ((a.get("usage") or {}).get("prompt_tokens") or 0)
                + ((a.get("usage") or {}).get("completion_tokens") or 0)
                for a in rec.get("attempts") or []
            )
        )

    def finish(b: Mapping[str, Any]) -> dict[str, Any]:
        n = max(1, b["lines"])
        return {
            "lines": b["lines"],
            "successes": b["successes"],
            "success_rate": b["successes"] / n,
            "failures": b["lines"] - b["successes"],
            "primary": {k: b["primary"].get(k, 0) for k in PRIMARY},
            "flags": {k: b["flags"].get(k, 0) for k in FLAGS},
            "flags_among_failures": {k: b["failed_flags"].get(k, 0) for k in FLAGS},
        }

    systems = {
        s: finish(b)
        | {
            "latency_ms_mean": sum(latency[s]) / max(1, len(latency[s])),
            "tokens_per_line": sum(tokens[s]) / max(1, len(tokens[s])),
        }
        for s, b in sorted(per_system.items())
    }
    return {
        "files": [str(p) for p in paths],
        "lines": len(loaded),
        "domains": {k: sorted(v) for k, v in sorted(domains.items())},
        "per_system": systems,
        "per_family_system": {k: finish(b) for k, b in sorted(per_fam_sys.items())},
        "examples": {s: dict(v) for s, v in sorted(examples.items())},
        "categories": {"primary": list(PRIMARY), "flags": list(FLAGS)},
    }


def _table(rows: Mapping[str, Mapping[str, Any]], title: str) -> list[str]:
    names = list(rows)
    out = [f"### {title}", "", "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    out.append("| lines | " + " | ".join(str(rows[n]["lines"]) for n in names) + " |")
    out.append(
        "| success | " + " | ".join(f"{rows[n]['successes']} ({rows[n]['success_rate']:.0%})" for n in names) + " |"
    )
    out.append("| **failures** | " + " | ".join(str(rows[n]["failures"]) for n in names) + " |")
    for k in PRIMARY:
        out.append(f"| &nbsp; {k} | " + " | ".join(str(rows[n]["primary"][k]) for n in names) + " |")
    out.append("| **flags (all lines / failures)** | " + " | " * (len(names) - 1) + " |")
    for k in FLAGS:
        cells = [f"{rows[n]['flags'][k]} / {rows[n]['flags_among_failures'][k]}" for n in names]
        out.append(f"| &nbsp; {k} | " + " | ".join(cells) + " |")
    return [*out, ""]


def to_markdown(res: Mapping[str, Any]) -> str:
    lines = [
        "# Failure taxonomy of real-LLM traces",
        "",
        f"{res['lines']} trace lines from {len(res['files'])} files; computed from the traces alone "
        "(see `evals/analysis/analyze_traces.py` for the categories and text-matching heuristics).",
        "",
    ]
    lines += _table(res["per_system"], "Per system")
    lines += [
        "| | " + " | ".join(res["per_system"]) + " |",
        "|---|" + "---|" * len(res["per_system"]),
        "| mean latency (s) | "
        + " | ".join(f"{v['latency_ms_mean'] / 1000:.1f}" for v in res["per_system"].values())
        + " |",
        "| tokens per line | " + " | ".join(f"{v['tokens_per_line']:.0f}" for v in res["per_system"].values()) + " |",
        "",
    ]
    lines += _table(res["per_family_system"], "Per family / system")
    lines.append("## Examples")
    for sysname, cats in res["examples"].items():
        for cat, exs in cats.items():
            lines.append(f"\n### {sysname}: {cat}\n")
            for ex in exs:
                lines.append(f"- `{ex['task_id']}` ({ex['file']}) Q: {ex['question']}")
                lines.append(f"  - truth `{json.dumps(ex['truth'])}`, answer `{json.dumps(ex['answer'])}`")
                if ex["error"]:
                    lines.append(f"  - error: {ex['error']}")
                lines.append(f"  - last raw: `{ex['last_raw']}`")
                for s in ex["served"]:
                    tag = f"**{s['tag']}** " if s["tag"] else ""
                    lines.append(f"  - {tag}{'(cited) ' if s['cited'] else ''}[{s['state']}] {s['text']}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Failure taxonomy from MemoryAgent traces alone.")
    p.add_argument("traces", nargs="+")
    p.add_argument("--out", default="results/llm_agent/analysis")
    args = p.parse_args(argv)
    res = analyze(sorted(args.traces))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "analysis.json", res, indent=1, default=str, newline=False)
    (out / "analysis.md").write_text(to_markdown(res))
    print("\n".join(_table(res["per_system"], "Per system")))
    print(f"wrote {out / 'analysis.json'} and {out / 'analysis.md'}")


if __name__ == "__main__":
    main()
