"""``remem demo``: the whole idea in one offline run on embedded defaults.

1. Supersession: a replaced fact is retired (with its reason) yet still answers ``as_of`` questions.
2. Learning from outcomes: a look-alike note that is *more similar* to the question but never helps
   drops below a less similar note that does, after a few rounds of feedback.
3. The ledger verifies and every decision can be inspected.
4. With a local GGUF chat model installed: the MemoryAgent loop (recall, cited JSON answer, scoring,
   learning, a trace line per call), fully offline.

Time is explicit (a fixed clock) so the output is the same on every run.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from remem_agent.adapters.base import ChatModel
from remem_agent.agent.middleware import MemoryAgent
from remem_agent.doctor import LLAMA_INSTALL, MODELS_FIX, probe_local_model
from remem_agent.embedders.registry import default_embedder_name
from remem_agent.errors import ModelError, OutputValidationError, UserInputError
from remem_agent.memory import ReMem

DemoModel = Literal["auto", "qwen", "smollm2", "none"]

DAY = 86_400.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def run_demo(
    path: str | Path | None = None,
    *,
    rounds: int = 8,
    out: Callable[[str], None] = print,
    model: DemoModel = "auto",
    trace: str | Path | None = None,
    embedder: str | None = None,
) -> dict[str, object]:
    """Run the demo in ``path`` (a fresh temporary folder by default); returns a summary.

    ``embedder``: a name of :mod:`remem_agent.embedders.registry` for a new store; by default the real
    all-MiniLM-L6-v2 when it is installed, else the hash embedder (an existing ``path`` keeps its own).
    Part 4 first asks a child process to load the model and decode one token (:mod:`remem_agent.doctor`):
    a llama.cpp build that crashes on this CPU is reported, with the command that fixes it, and the summary's
    ``model_failed`` is True; the temporary folder is removed either way.

    ``model`` picks the local chat model for part 4 (the MemoryAgent loop): "qwen" (sensible answers),
    "smollm2" (fast, weak content), "auto" (qwen if installed, else smollm2, else skip) or "none".
    Part 4 writes its trace to ``trace`` (overwritten; its folder must exist), by default to
    ``traces/remem-demo.jsonl`` inside the store folder: never into the current directory.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise UserInputError(f"rounds must be a positive integer, got {rounds!r}")
    trace_path = Path(trace).expanduser() if trace is not None else None
    if trace_path is not None and (trace_path.is_dir() or not trace_path.parent.is_dir()):
        raise UserInputError(f"trace {str(trace_path)!r}: give a file in an existing folder")
    tmp = None
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="remem-demo-")
        path = tmp.name
    try:
        store = ReMem(path, new_store_embedder=default_embedder_name()) if embedder is None else ReMem(path, embedder)
        with store as mem:
            summary = _run(mem, rounds, out)
            if trace_path is None:  # a PostgreSQL store has no folder: the system temp folder then
                folder = mem.path if isinstance(mem.path, Path) else Path(tempfile.gettempdir())
                trace_path = folder / "traces" / "remem-demo.jsonl"
            agent = asyncio.run(_agent_part(mem, model, trace_path, out, temporary=tmp is not None))
            summary["agent"] = agent
            summary["model_failed"] = bool(agent.get("failed"))
            return summary
    finally:
        if tmp is not None:
            tmp.cleanup()


def _local_model(choice: DemoModel) -> tuple[ChatModel | None, str, bool]:
    """The local chat model to use, or None with the reason and whether that is a failure (not a skip)."""
    if choice == "none":
        return None, "skipped (--model none)", False
    try:
        from remem_agent.adapters.llamacpp_chat import LlamaCppChat
    except ImportError:
        return None, f"llama-cpp-python is not installed: {LLAMA_INSTALL}", False
    probe = probe_local_model(choice)  # in a child process: a native crash cannot take the demo down
    if probe.status == "fail":
        return None, f"the local model does not work here: {probe.detail}\n   fix: {probe.fix}", True
    if probe.status == "missing":
        return None, f"{probe.detail}: {probe.fix}", False
    order = ["qwen", "smollm2"] if choice == "auto" else [choice]
    reasons = []
    for name in order:
        try:
            if name == "qwen":
                return LlamaCppChat.qwen(n_ctx=4096, seed=0), "Qwen2.5-Coder-0.5B-Instruct (local GGUF)", False
            return LlamaCppChat.smollm2(n_ctx=4096, seed=0), "SmolLM2-135M-Instruct (local GGUF)", False
        except (ModelError, ImportError) as exc:
            reasons.append(str(exc))
    return None, f"no local model package: {MODELS_FIX} (" + "; ".join(reasons) + ")", False


async def _agent_part(
    mem: ReMem, choice: DemoModel, trace_path: Path, out: Callable[[str], None], *, temporary: bool
) -> dict[str, object]:
    """Part 4; ``temporary``: the store folder (and a default trace inside it) is removed at the end."""
    out("\n4. The MemoryAgent loop with a local chat model")
    model, desc, failed = _local_model(choice)
    if model is None:
        out(f"   {desc}")
        return {"ran": False, "reason": desc, "failed": failed}
    out(f"   model: {desc}")
    in_store = isinstance(mem.path, Path) and trace_path.resolve().is_relative_to(mem.path.resolve())
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    trace_path.unlink(missing_ok=True)  # one demo run per file
    agent = MemoryAgent(mem, model, trace=trace_path, max_tokens=96, k=3)
    schema = {"type": "object", "properties": {"region": {"type": "string", "maxLength": 40}}, "required": ["region"]}
    results = []
    for q, truth, now in (
        ("Where is our server? Give the region.", {"region": "west-2"}, T0 + 20 * DAY),
        ("Which region was our server in at the start?", {"region": "east-1"}, T0 + 3 * DAY),
    ):
        as_of = now if now < T0 + 7 * DAY else None
        try:
            ans = await agent.ask(q, task="ops", schema=schema, truth=truth, now=now, as_of=as_of)
        except OutputValidationError as exc:
            out(f"   Q: {q}\n      the model gave no valid answer after {exc.attempts} attempts (see the trace)")
            results.append(False)
            continue
        ok = ans.outcome.success if ans.outcome else None
        out(f"   Q: {q}")
        out(f"      served: {[h.text for h in ans.served]}")
        texts = {h.id: h.text for h in ans.served}
        out(f"      answer: {ans.value}  correct: {ok}")
        out(f"      cites: {[texts.get(c, c) for c in ans.citations] or 'nothing'}")
        results.append(bool(ok))
    if hasattr(model, "close"):
        model.close()
    out(f"   every prompt and reply is in the trace: {trace_path}")
    if temporary and in_store:
        out("   (inside the temporary store, removed at exit: keep it with --trace FILE or --path DIR)")
    return {"ran": True, "model": model.name, "correct": results, "trace": str(trace_path)}


def _run(mem: ReMem, rounds: int, out: Callable[[str], None]) -> dict[str, object]:
    out(f"remem demo - store: {mem.path} (embedder {mem.embedder.name})\n")
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
    mem.add("Release day notes: the production release channel has a new bot avatar.", role="note", timestamp=T0)
    mem.add("Production releases happen on Tuesdays and Thursdays.", role="note", timestamp=T0)
    mem.add("The team lunch is on Friday.", role="note", timestamp=T0)
    question = "How do I ship the release to production?"
    # The look-alike is the note the embedder finds most similar to the question that is not the helpful one
    # (which note that is depends on the embedder: MiniLM and the hash embedder pick different ones).
    first = mem.search(question, k=4, task="deploy", now=T0 + DAY / 2, explain=True)
    lookalike = max((h for h in first.items if h.id != helpful), key=lambda h: h.similarity).id

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
