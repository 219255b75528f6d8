"""Real-LLM evaluation: the benchmark worlds answered by a real chat model through ``MemoryAgent``.

For each (family, seed, system) the world is replayed into a ReMem store configured as the system (like
:mod:`evals.harness.runner`: public facts only, the world's hash embedder), and every task becomes one
``MemoryAgent.ask`` whose answer schema has exactly the task's answer keys (``"billing.region"``: string).
Success is the middleware's default ``exact_match`` against the task's truth, key by key. Systems that
learn (``learn: true`` in ``evals/harness/systems.yaml``) learn from the real model's outcomes and citations;
the others get no feedback. Every ask is traced (one JSON line) to ``<trace-dir>/<family>_<seed>_<system>.jsonl``.

Resumable: one JSON result per (family, seed, system) in ``<out>/runs/``; a finished run is skipped, an
unfinished one is redone from the start (its trace file is truncated first). ``<out>/summary.json`` and a
printed table aggregate what exists::

    python -m evals.bench.run_llm_agent --adapter llamacpp --family contradiction,state_change \\
        --seeds 0,1,2 --tasks 40 --systems A,C
    python -m evals.bench.run_llm_agent --summarize-only --out results/llm_agent
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evals.harness.embedders import embedder_for
from evals.harness.families import make_world
from evals.harness.jsonio import write_json
from evals.harness.replay import WorldReplay, temp_store
from evals.harness.stats import estimate, paired
from evals.harness.systems import System, load_systems
from evals.harness.world import Fact, Task, World, WorldParams
from remem_agent import ReMem
from remem_agent.adapters.base import Capabilities, ChatModel, ChatRequest, ChatResponse
from remem_agent.agent.middleware import Answer, MemoryAgent
from remem_agent.agent.scoring import normalise_value
from remem_agent.errors import OutputValidationError
from remem_agent.types import FeedbackReceipt

RESULT_VERSION = 1
VALUE_MAX_LENGTH = 40


# ----------------------------------------------------------------------------------------- models
class FreeFormChat:
    """Forwards to a model with ``json_schema=None``: no native schema enforcement (``--output-mode free``).

    The middleware still puts the schema in the prompt, validates the reply and re-asks on errors.
    """

    def __init__(self, inner: ChatModel) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def adapter(self) -> str:
        return self.inner.adapter

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(native_json_schema=False, json_mode=False)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        return await self.inner.complete(replace(request, json_schema=None))


def _served_ids(request: ChatRequest) -> list[str]:
    cite = (request.json_schema or {}).get("properties", {}).get("citations", {})
    return list(cite.get("items", {}).get("enum", []))


def _answer_keys(request: ChatRequest) -> list[str]:
    props = (request.json_schema or {}).get("properties", {})
    return [k for k in props if k != "citations"]


def scripted_model(kind: str, truth_of: Callable[[str], Mapping[str, str] | None]) -> ChatModel:
    """Deterministic test models (no LLM). ``truth_of(question)`` gives the truth of the task being asked.

    * ``truthful``: answers the truth, cites every served memory;
    * ``wrong-key``: puts the true value under a made-up key (fails the schema every attempt in schema
      mode; the scorer never sees it);
    * ``invalid-json``: replies prose, never JSON;
    * ``dup-cite``: the true values, citing the first served memory twice (the middleware keeps it once);
    * ``unserved-cite``: the true values, citing an id that was not served (fails every attempt);
    * ``first-served``: copies the value-looking last word of the first served memory.
    """
    from remem_agent.adapters.fakes import FunctionChatModel

    def fn(req: ChatRequest) -> str:
        question = req.messages[1].content.rsplit("Question: ", 1)[-1] if len(req.messages) > 1 else ""
        truth = dict(truth_of(question) or {})
        keys = _answer_keys(req)
        ids = _served_ids(req)
        if kind == "truthful":
            return json.dumps({**{k: truth.get(k, "unknown") for k in keys}, "citations": ids})
        if kind == "wrong-key":
            return json.dumps({**{f"{k}_value": truth.get(k, "?") for k in keys}, "citations": []})
        if kind == "invalid-json":
            return "I think the answer is " + ", ".join(truth.values())
        if kind == "dup-cite":
            return json.dumps({**{k: truth.get(k, "?") for k in keys}, "citations": ids[:1] * 2})
        if kind == "unserved-cite":
            return json.dumps({**{k: truth.get(k, "?") for k in keys}, "citations": ["m_not_served"]})
        if kind == "first-served":
            lines = req.messages[1].content.split("\n")  # "Memories:", then "[M1] ..." (old prompts: "[m:...")
            mem = lines[1] if len(lines) > 1 and lines[1].startswith(("[M1]", "[m:")) else ""
            word = mem.rstrip('".').split()[-1].rstrip('."') if mem else "unknown"
            return json.dumps({**{k: word[:VALUE_MAX_LENGTH] for k in keys}, "citations": ids[:1]})
        raise ValueError(f"unknown scripted model {kind!r}")

    return FunctionChatModel(fn, name=f"scripted-{kind}", adapter="scripted")


def make_model(args: argparse.Namespace) -> ChatModel:
    if args.adapter == "llamacpp":
        from remem_agent.adapters.llamacpp_chat import LlamaCppChat

        kw: dict[str, Any] = {"n_threads": args.threads, "n_ctx": args.n_ctx}
        if args.model in (None, "qwen", "qwen2.5-coder-0.5b"):
            model = LlamaCppChat.qwen(**kw)
        elif args.model == "smollm2":
            model = LlamaCppChat.smollm2(**kw)
        else:
            model = LlamaCppChat(args.model, **kw)
        model.warm_up()
        return model
    if args.adapter == "openai":
        from remem_agent.adapters.openai_chat import OpenAIChat

        base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
        return OpenAIChat(args.model or "gpt-4o-mini", base_url=base_url)
    if args.adapter == "ollama":
        from remem_agent.adapters.ollama_chat import OllamaChat

        host = args.base_url or os.environ.get("OLLAMA_HOST") or "http://localhost:11434"
        return OllamaChat(args.model or "qwen2.5:3b", host=host)
    raise SystemExit(f"unknown adapter {args.adapter!r}")


# ------------------------------------------------------------------------------------------ memory
class NoLearningReMem(ReMem):
    """A ReMem whose (async) feedback is dropped: systems with ``learn: false`` never learn from outcomes.

    ``MemoryAgent`` reports outcomes through ``afeedback`` only; the receipt says what the outcome was and
    credits nothing.
    """

    async def afeedback(self, search_id: str, **kwargs: Any) -> FeedbackReceipt:
        return FeedbackReceipt(search_id, bool(kwargs.get("success")), {}, {})


def answer_schema(task: Task) -> dict[str, Any]:
    """The exact answer keys of the task: one bounded string per key, all required."""
    keys = list(task.truth)
    return {
        "type": "object",
        "properties": {k: {"type": "string", "maxLength": VALUE_MAX_LENGTH} for k in keys},
        "required": keys,
        "additionalProperties": False,
    }


@dataclass
class RunSpec:
    family: str
    seed: int
    system: str

    @property
    def stem(self) -> str:
        return f"{self.family}_{self.seed}_{self.system}"


def _task_row(
    task: Task, ans: Answer | None, err: str | None, fact_of: Mapping[str, Fact], trace: dict[str, Any]
) -> dict[str, Any]:
    """One task's row of a run: outcome, error and what was served (stale, gold), cited and answered."""
    served = [h.id for h in ans.served] if ans is not None else trace.get("served_ids", [])
    cites = list(ans.citations) if ans is not None else []
    needs = {f"{k[0]}.{k[1]}": k for k in task.needs}
    stale: set[str] = set()
    gold: set[str] = set()
    for mid in served:
        f = fact_of.get(mid)
        if f is None or f.key is None:
            continue
        for name, key in needs.items():
            if f.key == key:
                (gold if normalise_value(f.value) == normalise_value(task.truth[name]) else stale).add(mid)
    return {
        "tid": task.tid,
        "historical": task.as_of is not None,
        "success": bool(ans is not None and ans.outcome is not None and ans.outcome.success),
        "score": (ans.outcome.score if ans is not None and ans.outcome is not None else 0.0),
        "error": err,
        "served": len(served),
        "cited": len(cites),
        "stale_served": bool(stale),
        "stale_cited": bool(stale & set(cites)),
        "gold_served": bool(gold),
        "answered_stale": bool(
            ans is not None
            and ans.value is not None
            and any(
                normalise_value(ans.value.get(name)) == normalise_value(fact_of[m].value)
                for m in stale
                for name, key in needs.items()
                if fact_of[m].key == key
            )
        ),
    }


async def run_one(
    world: World,
    system: System,
    model: ChatModel,
    *,
    trace_path: Path,
    run_id: str,
    max_reasks: int = 2,
    max_tokens: int = 256,
    progress: Callable[[str], None] | None = None,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Replay ``world`` into a fresh store configured as ``system`` and ask every task through ``model``."""
    t0 = time.perf_counter()
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    trace_path.write_text("")  # a run is redone from scratch: the store is rebuilt anyway
    rows: list[dict[str, Any]] = []
    timed_out = False
    store_class = ReMem if system.learn else NoLearningReMem
    with temp_store(system.config, embedder_for(world), prefix="remem-llm-", store_class=store_class) as mem:
        agent = MemoryAgent(
            mem,
            model,
            k=world.params.k,
            token_budget=world.params.token_budget,
            max_reasks=max_reasks,
            trace=trace_path,
            run_id=run_id,
            system=system.name,
            max_tokens=max_tokens,
            temperature=0.0,
            infer_outcomes=False,
        )
        replay = WorldReplay(mem, world, keys=system.keys, as_of=system.as_of)
        n_tasks = sum(1 for _ in world.tasks())
        for task in replay.tasks():
            if deadline is not None and time.time() > deadline:
                timed_out = True
                break
            ta = time.perf_counter()
            ans, err = None, None
            try:
                ans = await agent.ask(
                    task.query,
                    task=task.task_class,
                    schema=answer_schema(task),
                    truth=dict(task.truth),
                    now=task.t,
                    as_of=replay.as_of(task),
                    task_id=task.tid,
                )
            except OutputValidationError as exc:
                err = str(exc)
            row = _task_row(task, ans, err, replay.fact_of, {})
            if ans is None:  # the served ids of a failed ask are only in its trace line
                row.update(_from_last_trace(trace_path, task, replay.fact_of))
            row["latency_ms"] = round((time.perf_counter() - ta) * 1000, 1)
            row["attempts"] = ans.attempts if ans is not None else max_reasks + 1
            rows.append(row)
            if progress:
                ok = sum(r["success"] for r in rows)
                progress(
                    f"{run_id}: {len(rows)}/{n_tasks} {'ok ' if row['success'] else 'ERR' if err else 'no '}"
                    f" ({ok}/{len(rows)} ok, {row['latency_ms'] / 1000:.1f}s)"
                )
    usage = _usage_from_trace(trace_path)
    return summarize_rows(rows, world, system, model, usage, time.perf_counter() - t0, complete=not timed_out)


def _from_last_trace(trace_path: Path, task: Task, fact_of: Mapping[str, Fact]) -> dict[str, Any]:
    lines = trace_path.read_text().splitlines()
    rec = json.loads(lines[-1]) if lines else {}
    if rec.get("task_id") != task.tid:
        return {}
    served = [s["id"] for s in rec.get("served", [])]
    row = _task_row(task, None, None, fact_of, {"served_ids": served})
    kinds = [a.get("kind") for a in rec.get("attempts", [])]
    return {k: row[k] for k in ("served", "stale_served", "gold_served")} | {"error_kind": kinds[-1] if kinds else None}


def _usage_from_trace(path: Path) -> dict[str, float]:
    prompt = completion = n = 0
    invalid_attempts = attempts = 0
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        n += 1
        for a in rec.get("attempts", []):
            attempts += 1
            invalid_attempts += a.get("kind") == "invalid_json"
            u = a.get("usage") or {}
            prompt += u.get("prompt_tokens") or 0
            completion += u.get("completion_tokens") or 0
    return {
        "prompt_tokens_per_task": prompt / max(1, n),
        "completion_tokens_per_task": completion / max(1, n),
        "invalid_json_attempt_rate": invalid_attempts / max(1, attempts),
        "attempts_per_task": attempts / max(1, n),
    }


def summarize_rows(
    rows: list[dict[str, Any]],
    world: World,
    system: System,
    model: ChatModel,
    usage: Mapping[str, float],
    wall_s: float,
    *,
    complete: bool,
) -> dict[str, Any]:
    n = len(rows)

    def rate(key: str, sub: Sequence[dict[str, Any]] | None = None) -> float | None:
        xs = rows if sub is None else sub
        return sum(bool(r[key]) for r in xs) / len(xs) if xs else None

    lat = [r["latency_ms"] for r in rows]
    return {
        "v": RESULT_VERSION,
        "family": world.family,
        "seed": world.seed,
        "system": system.name,
        "model": model.name,
        "adapter": model.adapter,
        "native_json_schema": model.capabilities.native_json_schema,
        "n_tasks_world": world.params.n_tasks,
        "n_tasks": n,
        "complete": complete,
        "success": rate("success"),
        "historical_success": rate("success", [r for r in rows if r["historical"]]),
        "invalid_final": sum(r["error"] is not None for r in rows) / n if n else None,
        "stale_served": rate("stale_served"),
        "stale_cited": rate("stale_cited"),
        "answered_stale": rate("answered_stale"),
        "gold_served": rate("gold_served"),
        "latency_ms_mean": statistics.fmean(lat) if lat else None,
        **usage,
        "wall_s": round(wall_s, 2),
        "rows": rows,
    }


# ----------------------------------------------------------------------------------------- driver
def _result_path(out: Path, spec: RunSpec) -> Path:
    return out / "runs" / f"{spec.stem}.json"


def _config_of(args: argparse.Namespace, model_name: str) -> dict[str, Any]:
    return {"model": model_name, "n_tasks_world": args.tasks, "output_mode": args.output_mode}


def _is_done(path: Path, cfg: Mapping[str, Any]) -> bool:
    if not path.is_file():
        return False
    res = json.loads(path.read_text())
    if not res.get("complete"):
        return False
    mode = res.get("output_mode") or ("schema" if res.get("native_json_schema") else "free")
    mine = {"model": res.get("model"), "n_tasks_world": res.get("n_tasks_world"), "output_mode": mode}
    if mine != dict(cfg):
        raise SystemExit(f"{path} holds a finished run with another configuration {mine} != {dict(cfg)}; use --out")
    return True


def _fmt(e: Mapping[str, Any]) -> str:
    if e["n"] == 0 or e["mean"] is None or (isinstance(e["mean"], float) and math.isnan(e["mean"])):
        return "-"
    hw = e["ci95"]
    return f"{e['mean'] * 100:.1f}" + ("" if hw is None or math.isnan(hw) else f" ± {hw * 100:.1f}")


def aggregate(out: Path) -> dict[str, Any]:
    """Aggregate ``<out>/runs/*.json`` into per family x system estimates over seeds and paired C - A.

    Unfinished runs (stopped by ``--deadline``) count with the tasks they finished and are listed in
    ``partial_runs``. The paired C - A difference compares, per seed, the common prefix of tasks both
    systems finished (the same tasks in the same order), so a partial pair is still paired.
    """
    runs = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]
    runs = [r for r in runs if r.get("n_tasks")]
    partial = [f"{r['family']}_{r['seed']}_{r['system']} ({r['n_tasks']} tasks)" for r in runs if not r.get("complete")]
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["family"], r["system"]), {})[r["seed"]] = r
    metrics = (
        "success",
        "historical_success",
        "stale_served",
        "stale_cited",
        "answered_stale",
        "gold_served",
        "invalid_final",
    )
    metrics_x = ("invalid_json_attempt_rate", "latency_ms_mean", "prompt_tokens_per_task", "completion_tokens_per_task")
    table: dict[str, dict[str, Any]] = {}
    for (fam, sysname), seeds in sorted(by.items()):
        rs = [seeds[s] for s in sorted(seeds)]
        entry: dict[str, Any] = {
            "seeds": sorted(seeds),
            "tasks": sum(r["n_tasks"] for r in rs),
            "partial_seeds": [r["seed"] for r in rs if not r.get("complete")],
        }
        for m in (*metrics, *metrics_x):
            vals = [r[m] for r in rs if r.get(m) is not None]
            entry[m] = estimate(vals).to_dict()
        entry["model"] = sorted({r["model"] for r in rs})
        table.setdefault(fam, {})[sysname] = entry
    pairs: dict[str, Any] = {}
    for fam in table:
        a, c = by.get((fam, "A"), {}), by.get((fam, "C"), {})
        per_seed: dict[int, dict[str, Any]] = {}
        for seed in sorted(set(a) & set(c)):
            ra, rc = a[seed]["rows"], c[seed]["rows"]
            n = min(len(ra), len(rc))
            while n and [r["tid"] for r in ra[:n]] != [r["tid"] for r in rc[:n]]:
                n -= 1
            if n:
                per_seed[seed] = {
                    "n_tasks": n,
                    **{
                        f"{m}_{s}": sum(bool(r[m]) for r in rows[:n]) / n
                        for m in ("success", "stale_served")
                        for s, rows in (("A", ra), ("C", rc))
                    },
                }
        if not per_seed:
            continue
        ps = list(per_seed.values())
        pairs[fam] = {
            "seeds": sorted(per_seed),
            "tasks_per_seed": {str(k): v["n_tasks"] for k, v in per_seed.items()},
            "per_seed": {str(k): v for k, v in per_seed.items()},
            "success_A": estimate([p["success_A"] for p in ps]).to_dict(),
            "success_C": estimate([p["success_C"] for p in ps]).to_dict(),
            "success": paired([p["success_A"] for p in ps], [p["success_C"] for p in ps]).to_dict(),
            "stale_served": paired([p["stale_served_A"] for p in ps], [p["stale_served_C"] for p in ps]).to_dict(),
        }
    summary = {"runs": len(runs), "partial_runs": partial, "by_family": table, "paired_C_minus_A": pairs}
    write_json(out / "summary.json", summary, indent=1, default=str, newline=False, atomic=True)
    return summary


def print_table(summary: Mapping[str, Any], file: Any = sys.stdout) -> None:
    hdr = (
        f"{'family':<15}{'sys':<4}{'seeds':>6}{'tasks':>6}  {'success %':<14}{'stale served %':<15}"
        f"{'stale cited %':<14}{'invalid %':<12}{'lat s':>6}{'tok in':>8}{'tok out':>8}"
    )
    print(hdr, file=file)
    for fam, systems in summary["by_family"].items():
        for s, e in systems.items():
            lat = e["latency_ms_mean"]["mean"]
            print(
                f"{fam:<15}{s:<4}{len(e['seeds']):>6}{e['tasks']:>6}  {_fmt(e['success']):<14}"
                f"{_fmt(e['stale_served']):<15}{_fmt(e['stale_cited']):<14}{_fmt(e['invalid_final']):<12}"
                f"{lat / 1000:>6.1f}{e['prompt_tokens_per_task']['mean']:>8.0f}"
                f"{e['completion_tokens_per_task']['mean']:>8.0f}",
                file=file,
            )
        if fam in summary["paired_C_minus_A"]:
            p = summary["paired_C_minus_A"][fam]
            print(
                f"{fam:<15}C-A {len(p['seeds']):>6}{sum(p['tasks_per_seed'].values()):>6}  {_fmt(p['success']):<14}"
                f"{_fmt(p['stale_served']):<15}(paired, common tasks)",
                file=file,
            )
    if summary.get("partial_runs"):
        print(f"unfinished runs (counted with their finished tasks): {', '.join(summary['partial_runs'])}", file=file)


async def _main_async(args: argparse.Namespace, specs: list[RunSpec], systems: Mapping[str, System]) -> None:
    out, trace_dir = Path(args.out), Path(args.trace_dir)
    model: ChatModel | None = None
    deadline = _parse_deadline(args.deadline)
    for i, spec in enumerate(specs, 1):
        path = _result_path(out, spec)
        if model is None and not args.adapter.startswith("scripted"):
            pending = [s for s in specs if not _result_path(out, s).is_file()]
            if not pending and all(_is_done(_result_path(out, s), _config_of(args, _name_hint(args))) for s in specs):
                break
            model = make_model(args)
            if args.output_mode == "free":
                model = FreeFormChat(model)
        if deadline is not None and time.time() > deadline:
            print(f"[{i}/{len(specs)}] deadline passed, stopping", flush=True)
            break
        world = make_world(spec.family, spec.seed, WorldParams(n_tasks=args.tasks))
        if args.adapter.startswith("scripted"):
            truths = {t.query: t.truth for t in world.tasks()}
            model = scripted_model(args.adapter.removeprefix("scripted-"), truths.get)
            if args.output_mode == "free":
                model = FreeFormChat(model)
        assert model is not None
        if _is_done(path, _config_of(args, model.name)):
            print(f"[{i}/{len(specs)}] {spec.stem}: done, skipped", flush=True)
            continue
        run_deadline = deadline
        if deadline is not None and args.share_deadline:
            left = sum(1 for s in specs[i - 1 :] if not _is_done(_result_path(out, s), _config_of(args, model.name)))
            run_deadline = time.time() + (deadline - time.time()) / max(1, left)
        print(f"[{i}/{len(specs)}] {spec.stem}: {args.tasks} tasks with {model.name}", flush=True)
        res = await run_one(
            world,
            systems[spec.system],
            model,
            trace_path=trace_dir / f"{spec.stem}.jsonl",
            run_id=f"{spec.stem}-{model.name}",
            max_reasks=args.max_reasks,
            max_tokens=args.max_tokens,
            progress=(lambda s: print("  " + s, flush=True)) if args.verbose else None,
            deadline=run_deadline,
        )
        res["output_mode"] = args.output_mode
        write_json(path, res, indent=1, default=str, newline=False, atomic=True)
        print(
            f"[{i}/{len(specs)}] {spec.stem}: success {res['success']:.3f} over {res['n_tasks']} tasks,"
            f" {res['latency_ms_mean'] / 1000:.1f}s/ask, {res['wall_s']:.0f}s"
            + ("" if res["complete"] else " (UNFINISHED: deadline)"),
            flush=True,
        )


def _name_hint(args: argparse.Namespace) -> str:
    if args.adapter == "llamacpp" and args.model in (None, "qwen", "qwen2.5-coder-0.5b"):
        return "qwen2.5-coder-0.5b-instruct-q4_k_m"
    if args.adapter == "llamacpp" and args.model == "smollm2":
        return "smollm2-135m-instruct-q4_1"
    return str(args.model)


def _parse_deadline(text: str | None) -> float | None:
    """``HH:MM`` (UTC, today) or seconds since the epoch."""
    if not text:
        return None
    if ":" in text:
        from datetime import UTC, datetime

        hh, mm = (int(x) for x in text.split(":"))
        now = datetime.now(UTC)
        return now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    return float(text)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adapter", default="llamacpp", help="llamacpp | openai | ollama")
    p.add_argument("--model", default=None, help="llamacpp: qwen (default), smollm2 or a .gguf path")
    p.add_argument("--base-url", default=None, help="openai/ollama endpoint (else OPENAI_BASE_URL / OLLAMA_HOST)")
    p.add_argument("--family", default="contradiction,state_change")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--tasks", type=int, default=40)
    p.add_argument("--systems", default="A,C")
    p.add_argument("--output-mode", choices=("schema", "free"), default="schema")
    p.add_argument("--out", default="results/llm_agent")
    p.add_argument("--trace-dir", default="traces/llm")
    p.add_argument("--threads", type=int, default=1, help="llamacpp n_threads")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--max-reasks", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--deadline", default=None, help="stop starting tasks after HH:MM UTC (unfinished runs kept)")
    p.add_argument(
        "--share-deadline",
        action="store_true",
        help="give each remaining run an equal share of the time to --deadline (runs stop early, kept as partial)",
    )
    p.add_argument("--summarize-only", action="store_true")
    p.add_argument("--no-summary", action="store_true", help="do not aggregate at the end (parallel workers)")
    p.add_argument("-v", "--verbose", action="store_true", help="a progress line per task")
    args = p.parse_args(argv)
    out = Path(args.out)
    if not args.summarize_only:
        systems = load_systems()
        names = [s for s in args.systems.split(",") if s]
        unknown = [s for s in names if s not in systems]
        if unknown:
            raise SystemExit(f"unknown systems {unknown}")
        specs = [
            RunSpec(fam, int(seed), s)
            for fam in args.family.split(",")
            for seed in args.seeds.split(",")
            for s in names
        ]
        asyncio.run(_main_async(args, specs, systems))
    if args.no_summary:
        return
    summary = aggregate(out)
    print_table(summary)
    print(f"wrote {out / 'summary.json'}")


if __name__ == "__main__":
    main()
