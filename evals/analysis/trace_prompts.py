"""Pretty-print the full prompts and replies of a few traced asks, for a person to read.

Traces with per-ask citation ``aliases`` show each served memory's label (``[M1]``) before its id, so
the prompt and the raw replies (which cite labels) can be read against the ids (which credit uses).

``python -m evals.analysis.trace_prompts traces/llm/contradiction_0_C.jsonl --n 3 [--failures] [--task TID]``
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from remem_agent.agent.trace import load_traces

RULE = "=" * 100


def render(rec: Mapping[str, Any], *, width: int = 100) -> str:
    out = [RULE]
    outcome = rec.get("outcome") or {}
    status = "OK" if outcome.get("success") else ("ERROR" if rec.get("error") else "WRONG")
    out.append(f"{rec.get('task_id')}  system={rec.get('system')}  model={rec.get('model', {}).get('name')}  {status}")
    out.append(f"question: {rec.get('question')}")
    out.append(f"truth:    {json.dumps(rec.get('truth'))}")
    out.append(f"answer:   {json.dumps(rec.get('answer'))}   citations: {rec.get('citations')}")
    if rec.get("error"):
        out.append(f"error:    {rec['error']}")
    out.append("served:")
    cited = set(rec.get("citations") or [])
    label = {mid: alias for alias, mid in (rec.get("aliases") or {}).items()}  # absent in older traces
    for s in rec.get("served") or []:
        mark = "*" if s["id"] in cited else " "
        tag = f"[{label[s['id']]}] " if s["id"] in label else ""
        out.append(
            f" {mark} #{s['rank']} {tag}{s['id']} [{s['state']}] score={s['score']:.3f} sim={s['similarity']:.3f}"
        )
        out.append(textwrap.indent(textwrap.fill(str(s.get("text")), width - 6), "      "))
    out.append("-" * 40 + " messages (first attempt) " + "-" * 34)
    for m in rec.get("messages") or []:
        out.append(f"[{m['role']}]")
        for para in str(m["content"]).split("\n"):
            out.append(textwrap.fill(para, width, subsequent_indent="  ") if para else "")
    for i, a in enumerate(rec.get("attempts") or [], 1):
        usage = a.get("usage") or {}
        out.append(
            f"-- attempt {i}: kind={a.get('kind')} finish={a.get('finish_reason')} "
            f"{a.get('latency_ms', 0) / 1000:.1f}s tokens in/out={usage.get('prompt_tokens')}/"
            f"{usage.get('completion_tokens')}"
        )
        out.append(f"[assistant] {a.get('raw')}")
        for e in a.get("errors") or []:
            out.append(f"   error: {e}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Pretty-print prompts and replies from a trace file.")
    p.add_argument("trace")
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--failures", action="store_true", help="only asks that did not succeed")
    p.add_argument("--task", default=None, help="only this task_id")
    args = p.parse_args(argv)
    recs = load_traces(args.trace, kind="ask")
    if args.task:
        recs = [r for r in recs if r.get("task_id") == args.task]
    if args.failures:
        recs = [r for r in recs if not (r.get("outcome") or {}).get("success")]
    for rec in recs[: args.n]:
        print(render(rec))
    print(RULE)
    print(f"{min(args.n, len(recs))} of {len(recs)} shown")


if __name__ == "__main__":
    main()
