"""The ``remem`` command line: ``demo``, ``verify``, ``stats``, ``dashboard``, ``ledger``, ``migrate`` and ``backup``.

STORE is a store folder (SQLite) or a ``postgresql://`` URL everywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from remem_agent.errors import RememError
from remem_agent.store.factory import open_store
from remem_agent.types import ROLES, State, StoreStats


def _open_store(location: str) -> Any:
    """Open an existing ledger (folder or postgresql:// URL) without needing its embedder."""
    return open_store(location, create=False)


def _positive_int(value: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def _stats(store: Any) -> dict[str, Any]:
    """The shape of ``ReMem.stats()`` (every state and role, dim an int) from a store opened without its embedder."""
    c = store.counts()
    dim = store.get_meta("dim")
    stats = StoreStats(
        memories=c["memories"],
        by_state={s.value: c["by_state"].get(s.value, 0) for s in State},
        by_role={r: c["by_role"].get(r, 0) for r in ROLES},
        events=c["events"],
        searches=c["searches"],
        feedbacks=c["feedbacks"],
        tokens_active=c["tokens_active"],
        embedder=store.get_meta("embedder") or "",
        dim=int(dim) if dim else 0,
        schema_version=store.schema_version,
    )
    return dataclasses.asdict(stats)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="remem", description="remem-agent: memory that learns from outcomes")
    sub = parser.add_subparsers(dest="cmd", required=True)

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

    p_verify = sub.add_parser("verify", help="check a store's ledger invariants")
    p_verify.add_argument("store")

    p_stats = sub.add_parser("stats", help="counts of a store")
    p_stats.add_argument("store")

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

    p_migrate = sub.add_parser(
        "migrate", help="copy a store with its full history into another (e.g. a folder into postgresql://...)"
    )
    p_migrate.add_argument("source", help="store folder or postgresql:// URL to copy from (not modified)")
    p_migrate.add_argument("target", help="postgresql:// URL or new folder to copy into (must be empty)")

    p_backup = sub.add_parser(
        "backup", help="online backup of a store folder into a new folder (SQLite backup API; for PostgreSQL: pg_dump)"
    )
    p_backup.add_argument("store", help="store folder to back up (may be in use by other processes)")
    p_backup.add_argument("dest", help="new (or empty) folder that becomes a complete copy of the store")

    from remem_agent.viz.ledger_cli import add_ledger_parser

    add_ledger_parser(sub)

    args = parser.parse_args(argv)
    try:
        if args.cmd == "demo":
            from remem_agent.demo import run_demo

            summary = run_demo(args.path, rounds=args.rounds, model=args.model, trace=args.trace)
            return 0 if summary["verify_ok"] else 1
        if args.cmd == "dashboard":
            from remem_agent.viz.dashboard import write_dashboard

            out = write_dashboard(args.store, args.output, title=args.title, max_rows=args.max_rows)
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
            print(json.dumps(_stats(store), indent=2))
            return 0
        finally:
            store.close()
    except RememError as exc:
        print(f"remem: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
