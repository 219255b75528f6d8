"""The ``remem`` command line: demo, doctor, verify, stats, prune, dashboard, ledger, migrate, reembed, backup
and serve.

STORE is a store folder (SQLite) or a ``postgresql://`` URL everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from remem_agent.embedders.registry import EMBEDDER_NAMES
from remem_agent.errors import RememError, UserInputError
from remem_agent.store.base import Store
from remem_agent.store.factory import open_store
from remem_agent.store.pruning import GrowthLimits
from remem_agent.types import ROLES
from remem_agent.validate import check_scope


def _open_store(location: str) -> Any:
    """Open an existing ledger (folder or postgresql:// URL) without needing its embedder."""
    return open_store(location, create=False)


def _retention(days: float) -> float:
    """Days as seconds, refused when negative or not finite (before anything starts)."""
    if not math.isfinite(days) or days < 0:
        raise SystemExit(f"remem serve: --response-retention-days must be 0 or more, got {days}")
    return days * 86_400.0


def _positive_int(value: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def _stats(store: Any, scope: str | None = None) -> dict[str, Any]:
    """The shape of ``ReMem.stats()`` (every state and role, dim an int) from a store opened without its embedder."""
    from remem_agent.maintenance import store_stats

    scope = None if scope is None else check_scope(scope, "--scope")
    dim = store.get_meta("dim")
    stats = store_stats(store, scope, embedder=store.get_meta("embedder") or "", dim=int(dim) if dim else 0)
    out = dataclasses.asdict(stats)
    folder = getattr(store, "folder", None)  # a SQLite store's folder holds its default trace folder
    if folder is not None:
        traces = [f for f in (folder / "traces").glob("*") if f.is_file()]
        out["traces"] = {"files": len(traces), "bytes": sum(f.stat().st_size for f in traces)}
    return out


def _positive(value: str, unit: str) -> float:
    """A positive, finite number (of ``unit``) for an argparse type."""
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(n) or n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of {unit}, got {value}")
    return n


def _days(value: str) -> float:
    """argparse type: a positive number of days, as seconds."""
    return _positive(value, "days") * 86_400.0


def _days_or_off(value: str) -> float | None:
    """argparse type: a number of days as seconds; 0 is None (no limit)."""
    return None if value.strip() in ("0", "0.0") else _days(value)


def _mb_or_off(value: str) -> int | None:
    """argparse type: a number of MiB as bytes; 0 is None (no limit)."""
    return None if value.strip() in ("0", "0.0") else max(1, int(_positive(value, "MiB") * 2**20))


def _port(value: str) -> int:
    """argparse type: a TCP port, 1 to 65535."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {n}")
    return n


def _doctor(args: argparse.Namespace) -> int:
    from remem_agent.doctor import CHECKS, as_json, report, run_doctor

    require = [c.strip() for c in args.require.split(",") if c.strip()]
    unknown = [c for c in require if c not in CHECKS]
    if unknown:
        raise UserInputError(f"--require: unknown checks {unknown}; choose from {', '.join(CHECKS)}")
    results = run_doctor(store=args.store, host=args.host, port=args.port, model=args.model)
    text, status = report(results, require=require)
    print(json.dumps(as_json(results), indent=2) if args.json else text)
    return status


def _add_serve_parser(sub: Any) -> None:
    """``remem serve``: the OpenAI/Ollama-compatible memory gateway (extra ``gateway``; see remem_agent/gateway)."""
    p = sub.add_parser("serve", help="OpenAI- and Ollama-compatible HTTP gateway with the learning memory in front")
    p.add_argument("--store", default="remem_store", help="store folder or postgresql:// URL (default: remem_store)")
    up = p.add_mutually_exclusive_group()
    up.add_argument("--upstream", metavar="URL", help="model server: OpenAI-compatible base URL (with /v1) or Ollama")
    up.add_argument("--model", default="qwen", help="without --upstream: local model qwen | smollm2 | FILE.gguf")
    p.add_argument("--upstream-kind", choices=["openai", "ollama"], default="openai")
    p.add_argument(
        "--upstream-api-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="environment variable holding the upstream's API key (default OPENAI_API_KEY)",
    )
    p.add_argument("--upstream-timeout", type=float, default=60.0, metavar="S", help="per-call upstream timeout")
    p.add_argument("--models", default="", help="comma-separated model names served (default: the upstream's list)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--api-keys", metavar="FILE", help="JSON/YAML mapping API key -> [scopes] (required off loopback)")
    p.add_argument("--workers", type=_positive_int, default=1)
    p.add_argument("--trace", help="trace JSONL file, or 'off' (default: <store folder>/traces/gateway-<pid>.jsonl)")
    p.add_argument("--max-concurrency", type=_positive_int, default=32)
    p.add_argument("--max-queue", type=int, default=64)
    p.add_argument("--max-body-bytes", type=_positive_int, default=4 * 1024 * 1024)
    p.add_argument("--max-messages", type=_positive_int, default=256)
    p.add_argument("--max-stream-seconds", type=float, default=300.0)
    p.add_argument("--strip-citations", action="store_true", help="remove inline [M1] labels from replies")
    p.add_argument(
        "--capture-corrections",
        action="store_true",
        help="store a user's correction (\"No, it's Lisbon\") as the fact replacing the one the wrong answer cited",
    )
    p.add_argument(
        "--abstain",
        action="store_true",
        help="inject no memory when the store holds nothing more similar to the request than unrelated text",
    )
    p.add_argument(
        "--response-retention-days",
        type=float,
        default=30.0,
        help="how long a stored response of POST /v1/responses can be continued by previous_response_id "
        "(0: responses are not stored)",
    )
    p.add_argument(
        "--answer-ttl-days",
        type=_days_or_off,
        default=7 * 86_400.0,
        help="an answer with no verdict after this long expires, with no outcome (default 7; 0: never)",
    )
    p.add_argument(
        "--retention-days",
        type=_days_or_off,
        default=30 * 86_400.0,
        help="unjudged searches and settled answers older than this are pruned, learning kept (default 30; 0: never)",
    )
    p.add_argument(
        "--sweep-minutes",
        type=lambda v: _positive(v, "minutes") * 60.0,
        default=60.0 * 60.0,
        help="how often each worker expires answers and prunes (default 60)",
    )
    p.add_argument("--trace-max-mb", type=_mb_or_off, default=64 * 2**20, help="archive the trace file at this size")
    p.add_argument(
        "--trace-keep-mb", type=_mb_or_off, default=1024 * 2**20, help="trace archives take at most this much in all"
    )
    p.add_argument(
        "--trace-keep-days", type=_days_or_off, default=30 * 86_400.0, help="trace archives older than this are deleted"
    )
    p.add_argument("--otel", action="store_true", help="OpenTelemetry spans per chat turn (extra otel)")
    p.add_argument(
        "--embedder",
        choices=EMBEDDER_NAMES,
        default=None,
        help="embedder of a new store (default: minilm when installed, else hash); an existing store keeps its own",
    )


def _serve(args: argparse.Namespace) -> int:
    try:
        from remem_agent.gateway import GatewayConfig, serve
        from remem_agent.gateway.config import Limits
    except ImportError as exc:
        print(f"remem: error: {exc}", file=sys.stderr)
        return 2
    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_messages=args.max_messages,
        max_stream_seconds=args.max_stream_seconds,
        max_concurrency=args.max_concurrency,
        max_queue=args.max_queue,
    )
    config = GatewayConfig(
        store=args.store,
        upstream=args.upstream,
        upstream_kind=args.upstream_kind,
        upstream_api_key_env=args.upstream_api_key_env,
        upstream_timeout_s=args.upstream_timeout,
        model=args.model,
        models=tuple(m.strip() for m in args.models.split(",") if m.strip()),
        host=args.host,
        port=args.port,
        api_keys=args.api_keys,
        workers=args.workers,
        trace=args.trace,
        strip_citations=args.strip_citations,
        capture_corrections=args.capture_corrections,
        abstain=args.abstain,
        response_retention_s=_retention(args.response_retention_days),
        answer_ttl_s=args.answer_ttl_days,
        retention_s=args.retention_days,
        sweep_interval_s=args.sweep_minutes,
        trace_max_bytes=args.trace_max_mb,
        trace_keep_bytes=args.trace_keep_mb,
        trace_keep_days=None if args.trace_keep_days is None else args.trace_keep_days / 86_400.0,
        otel=args.otel,
        embedder=args.embedder,
        limits=limits,
    )
    serve(config)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``remem`` command line's parser: every subcommand and its options."""
    parser = argparse.ArgumentParser(prog="remem", description="remem-agent: memory that learns from outcomes")
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_tool_parsers(sub)
    _add_store_parsers(sub)
    _add_policy_parser(sub)
    from remem_agent.viz.ledger_cli import add_ledger_parser

    add_ledger_parser(sub)
    _add_serve_parser(sub)
    return parser


def _add_tool_parsers(sub: Any) -> None:
    """``demo`` and ``doctor``."""
    p_demo = sub.add_parser("demo", help="run the offline demo (supersession, as_of, learning from feedback)")
    p_demo.add_argument("--path", help="store folder (default: a temporary folder, removed afterwards)")
    p_demo.add_argument("--rounds", type=_positive_int, default=8, help="feedback rounds in the learning part (>= 1)")
    p_demo.add_argument(
        "--model",
        choices=["auto", "qwen", "smollm2", "none"],
        default="auto",
        help="local chat model for the agent loop (auto: qwen if installed, else smollm2, else skip)",
    )
    p_demo.add_argument(
        "--trace",
        metavar="FILE",
        help="trace of the agent loop (default: traces/remem-demo.jsonl inside the store folder)",
    )

    p_demo.add_argument(
        "--embedder",
        choices=EMBEDDER_NAMES,
        default=None,
        help="embedder of the demo's store (default: minilm when installed, else hash)",
    )

    p_doctor = sub.add_parser(
        "doctor", help="check that the local model, the embedder, a store and the gateway port work; say how to fix"
    )
    p_doctor.add_argument("--store", help="store folder or postgresql:// URL to verify (default: remem_store if any)")
    p_doctor.add_argument("--host", default="127.0.0.1", help="the gateway's host (default 127.0.0.1)")
    p_doctor.add_argument("--port", type=_port, default=8765, help="the gateway's port (default 8765)")
    p_doctor.add_argument("--model", choices=["auto", "qwen", "smollm2"], default="auto", help="local model to probe")
    p_doctor.add_argument(
        "--require",
        default="",
        metavar="CHECKS",
        help="comma-separated checks whose part must be installed (missing fails): build,model,embedder",
    )
    p_doctor.add_argument("--json", action="store_true", help="print the results as JSON")


def _add_policy_parser(sub: Any) -> None:
    """``remem evaluate-policy``: off-policy evaluation of another configuration on a store's logged searches."""
    p_ope = sub.add_parser(
        "evaluate-policy",
        help="estimate how another ranking configuration would have done on the searches logged with propensities",
        description="Off-policy evaluation (IPS, self-normalised IPS, doubly robust, each with a 95%% interval) "
        "of a target configuration on the judged searches a store logged with exploratory serving "
        "(RememConfig(explore_serving > 0)). Prints JSON: the base configuration's estimate beside the target's.",
    )
    p_ope.add_argument("store")
    p_ope.add_argument(
        "--target", type=_overrides, required=True, help="RememConfig fields to change, as JSON: '{\"p_floor\": 0.5}'"
    )
    p_ope.add_argument(
        "--base", type=_overrides, default={}, help="the fields the logging searches were made with (default: none)"
    )
    p_ope.add_argument("--scope", help="only this scope's searches (default: the whole store)")


def _add_store_parsers(sub: Any) -> None:
    """The commands that read, trim or move a store: verify, stats, prune, erase, dashboard, migrate, reembed,
    backup."""
    p_verify = sub.add_parser("verify", help="check a store's ledger invariants")
    p_verify.add_argument("store")

    p_stats = sub.add_parser("stats", help="counts of a store")
    p_stats.add_argument("store")
    p_stats.add_argument("--scope", help="count only this scope's memories and searches (default: the whole store)")

    p_prune = sub.add_parser(
        "prune", help="expire answers that waited too long and delete old unjudged searches (learning is kept)"
    )
    p_prune.add_argument("store")
    p_prune.add_argument(
        "--answer-ttl-days", type=_days, required=True, help="an answer with no verdict after this long expires"
    )
    p_prune.add_argument(
        "--retention-days",
        type=_days,
        help="delete unjudged searches and settled or expired answers older than this (default: keep them)",
    )

    p_erase = sub.add_parser(
        "erase",
        help="erase memories for good: their text, vectors, index entries, waiting answers and trace lines",
        description="Erase memories by id, by a filter, or a whole scope (--whole-scope --scope S). Rows and events "
        "stay, redacted, so the ledger still verifies; the store's files are rewritten afterwards (--no-scrub "
        "skips that). Prints what was done as JSON.",
    )
    p_erase.add_argument("store")
    p_erase.add_argument("ids", nargs="*", help="memory ids to erase")
    p_erase.add_argument("--scope", help="only this scope's memories (with --whole-scope: the scope to erase)")
    p_erase.add_argument("--whole-scope", action="store_true", help="erase every memory and query of --scope")
    for name in ("entity", "attribute", "speaker", "session"):
        p_erase.add_argument(f"--{name}", help=f"erase the memories with this {name}")
    p_erase.add_argument("--role", choices=ROLES, help="erase the memories of this role")
    p_erase.add_argument("--contains", help="erase the memories whose text contains this (a leaked secret, say)")
    p_erase.add_argument("--reason", default="erased on request", help="logged with the erasure (never the text)")
    p_erase.add_argument(
        "--traces", nargs="+", help="trace files or folders to scrub (default: the store folder's traces)"
    )
    p_erase.add_argument("--no-scrub", action="store_true", help="do not rewrite the store's files afterwards")

    p_dash = sub.add_parser("dashboard", help="write a self-contained HTML dashboard of a store (read only)")
    p_dash.add_argument("store")
    p_dash.add_argument("-o", "--output", default="memory.html", help="HTML file to write (default: memory.html)")
    p_dash.add_argument("--title", help="page title")
    p_dash.add_argument(
        "--max-rows",
        type=int,
        default=2000,
        help="memories in the table: the most recently added (default 2000; 0 = all); cards and plots cover all",
    )
    p_dash.add_argument("--scope", help="show only this scope's memories (default: every scope)")

    p_migrate = sub.add_parser(
        "migrate", help="copy a store with its full history into another (e.g. a folder into postgresql://...)"
    )
    p_migrate.add_argument("source", help="store folder or postgresql:// URL to copy from (not modified)")
    p_migrate.add_argument("target", help="postgresql:// URL or new folder to copy into (must be empty)")

    p_reembed = sub.add_parser(
        "reembed", help="copy a store with its full history into a new store whose vectors come from another embedder"
    )
    p_reembed.add_argument("source", help="store folder or postgresql:// URL to copy from (not modified)")
    p_reembed.add_argument("target", help="new (or empty) folder or postgresql:// URL that becomes the moved store")
    p_reembed.add_argument("--embedder", choices=EMBEDDER_NAMES, required=True, help="the target's embedder")
    p_reembed.add_argument(
        "--turn-context",
        type=float,
        help="how far a conversation turn's vector leans toward the turn before it (default: the source's weight)",
    )

    p_backup = sub.add_parser(
        "backup", help="online backup of a store folder into a new folder (SQLite backup API; for PostgreSQL: pg_dump)"
    )
    p_backup.add_argument("store", help="store folder to back up (may be in use by other processes)")
    p_backup.add_argument("dest", help="new (or empty) folder that becomes a complete copy of the store")


def _run(args: argparse.Namespace) -> int:
    """Carry out one parsed command (``RememError``s go up to ``main``)."""
    if args.cmd == "serve":
        return _serve(args)
    if args.cmd == "demo":
        from remem_agent.demo import run_demo

        summary = run_demo(args.path, rounds=args.rounds, model=args.model, trace=args.trace, embedder=args.embedder)
        return 0 if summary["verify_ok"] and not summary.get("model_failed") else 1
    if args.cmd == "doctor":
        return _doctor(args)
    if args.cmd == "reembed":
        from remem_agent.embedders.registry import make_embedder
        from remem_agent.store.copy import copy_store

        report = copy_store(
            args.source, args.target, embedder=make_embedder(args.embedder), turn_context=args.turn_context
        )
        print(json.dumps(report, indent=2))
        return 0 if report["verify_ok"] else 1
    if args.cmd == "dashboard":
        from remem_agent.viz.dashboard import write_dashboard

        out = write_dashboard(args.store, args.output, title=args.title, max_rows=args.max_rows, scope=args.scope)
        print(f"wrote {out}")
        return 0
    if args.cmd == "migrate":
        from remem_agent.store.copy import copy_store

        report = copy_store(args.source, args.target)
        print(json.dumps(report, indent=2))
        return 0 if report["verify_ok"] else 1
    if args.cmd == "backup":
        from remem_agent.store.backup import backup_store

        report = backup_store(args.store, args.dest)
        print(json.dumps(report, indent=2))
        return 0 if report["verify_ok"] else 1
    if args.cmd == "ledger":
        from remem_agent.viz.ledger_cli import run_ledger

        return run_ledger(args, _open_store)
    store = _open_store(args.store)
    try:
        if args.cmd == "verify":
            dim = store.get_meta("dim")
            problems = store.verify(int(dim) if dim else None)
            for p in problems:
                print(f"problem: {p}")
            print("ok" if not problems else f"{len(problems)} problem(s)")
            return 0 if not problems else 1
        if args.cmd == "erase":
            return _erase(store, args)
        if args.cmd == "evaluate-policy":
            from remem_agent.config import RememConfig
            from remem_agent.learning.ope import evaluate_policies

            base = RememConfig().overriding(args.base)
            found = evaluate_policies(store, {"base": base, "target": base.overriding(args.target)}, scope=args.scope)
            report = {name: est.to_dict() for name, est in found.items()}
            print(json.dumps(report, indent=2))
            return 0
        if args.cmd == "prune":
            limits = GrowthLimits(answer_ttl_s=args.answer_ttl_days, retention_s=args.retention_days)
            print(json.dumps(dataclasses.asdict(store.prune(limits, now=time.time())), indent=2))
            return 0
        print(json.dumps(_stats(store, args.scope), indent=2))
        return 0
    finally:
        store.close()


def _overrides(text: str) -> dict[str, Any]:
    """A ``--target`` / ``--base`` value: a JSON object of RememConfig fields (checked when applied)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object of RememConfig fields, like '{\"p_floor\": 0.5}'")
    return value


def _erase(store: Store, args: argparse.Namespace) -> int:
    """``remem erase``: the request checked before anything is written; the report printed as JSON."""
    from remem_agent import erasure

    req = erasure.EraseRequest.checked(
        args.ids or None,
        scope=args.scope,
        whole_scope=args.whole_scope,
        entity=args.entity,
        attribute=args.attribute,
        speaker=args.speaker,
        session=args.session,
        role=args.role,
        contains=args.contains,
        reason=args.reason,
    )
    paths = erasure.check_trace_paths(store, args.traces)
    report = erasure.run(store, req, traces=paths, scrub=not args.no_scrub, at=time.time())
    print(json.dumps(report.to_dict(), indent=2))
    if report.scrub is not None and not report.scrub.complete:
        print(f"remem: warning: the store's files were not fully scrubbed: {report.scrub.problem}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except RememError as exc:
        print(f"remem: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
