"""``remem demo``: the whole idea in one offline run on embedded defaults.

1. Supersession: a replaced fact is retired (with its reason) yet still answers ``as_of`` questions.
2. Learning from outcomes: a look-alike note that is *more similar* to the question but never helps
   drops below a less similar note that does, after a few rounds of feedback.
3. The ledger verifies and every decision can be inspected.

Time is explicit (a fixed clock) so the output is the same on every run.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from remem_agent.memory import ReMem

DAY = 86_400.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def run_demo(
    path: str | Path | None = None, *, rounds: int = 8, out: Callable[[str], None] = print
) -> dict[str, object]:
    """Run the demo in ``path`` (a fresh temporary folder by default); returns a summary."""
    tmp = None
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="remem-demo-")
        path = tmp.name
    try:
        with ReMem(path) as mem:
            return _run(mem, rounds, out)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _run(mem: ReMem, rounds: int, out: Callable[[str], None]) -> dict[str, object]:
    out(f"remem demo - store: {mem.path}\n")
    out("1. Facts that change")
    east = mem.add("Our server is in east-1.", entity="server", attribute="region", timestamp=T0)
    west = mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=T0 + 7 * DAY)
    hits = mem.search("Where is our server?", now=T0 + 8 * DAY)
    out(f"   search 'Where is our server?'      -> {hits.items[0].text}")
    info = mem.inspect(east)
    out(f"   the east-1 fact is {info.state.value}: {info.reason}")
    past = mem.search("Where is our server?", as_of=T0 + 3 * DAY)
    out(f"   as_of three days after the first -> {past.items[0].text}\n")
    mem.feedback(hits.search_id, success=True, used_ids=[west], cited_ids=[west])

    out("2. Learning which memories help")
    helpful = mem.add(
        "Before shipping, run the database migration script, then tag the build.", role="note", timestamp=T0
    )
    lookalike = mem.add(
        "Release day notes: the production release channel has a new bot avatar.", role="note", timestamp=T0
    )
    mem.add("Production releases happen on Tuesdays and Thursdays.", role="note", timestamp=T0)
    mem.add("The team lunch is on Friday.", role="note", timestamp=T0)
    question = "How do I ship the release to production?"

    def ranking(now: float) -> list[str]:
        res = mem.search(question, k=2, task="deploy", now=now, explain=True)
        for h in res.items:
            tag = "helpful  " if h.id == helpful else "look-alike" if h.id == lookalike else "other    "
            out(f"     {h.rank + 1}. [{tag}] p={h.score:.2f} sim={h.similarity:.2f}  {h.text}")
        return res.ids

    out(f"   question: {question!r} (task 'deploy', k=2)")
    out("   before any feedback:")
    before = ranking(T0 + DAY)
    for r in range(rounds):
        res = mem.search(question, k=2, task="deploy", now=T0 + (2 + r) * DAY)
        ok = helpful in res.ids  # the simulated agent succeeds when the migration step is in context
        mem.feedback(res.search_id, success=ok, used_ids=[helpful] if ok else [], cited_ids=[helpful] if ok else [])
    out(f"   after {rounds} rounds of feedback (the agent succeeds when it sees the migration step):")
    after = ranking(T0 + (3 + rounds) * DAY)
    li, hi = mem.inspect(lookalike).stats.get("deploy"), mem.inspect(helpful).stats.get("deploy")
    if li and hi:
        out(
            f"   look-alike: shown {li.shown}x, credited {li.credited}x (rate {li.contribution_rate:.2f}); "
            f"helpful: shown {hi.shown}x, credited {hi.credited}x (rate {hi.contribution_rate:.2f})\n"
        )

    out("3. The ledger")
    report = mem.verify()
    s = mem.stats()
    out(f"   {s.memories} memories, {s.events} events, {s.searches} searches, {s.feedbacks} feedbacks")
    out(f"   states: {dict(s.by_state)}")
    out(f"   verify(): {'ok' if report.ok else report.problems}")
    return {
        "current_region": hits.items[0].text,
        "as_of_region": past.items[0].text,
        "east_state": info.state.value,
        "before": before,
        "after": after,
        "helpful_first_after": bool(after) and after[0] == helpful,
        "verify_ok": report.ok,
    }
