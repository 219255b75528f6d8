"""``remem ledger STORE``: list, show, history and verify a store's ledger as aligned tables or JSON."""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from remem_agent.errors import UserInputError
from remem_agent.store.base import Store
from remem_agent.types import ALL_TASKS, ROLES, Event, Memory, State, TaskStats
from remem_agent.validate import check_scope
from remem_agent.viz.dashboard import fmt_time

TEXT_WIDTH = 60
REASON_WIDTH = 70


def one_line(text: str) -> str:
    """Whitespace collapsed to single spaces; control characters (e.g. terminal escapes) shown as �."""
    return "".join(c if c.isprintable() else "\ufffd" for c in " ".join(text.split()))


def truncate(text: str, width: int) -> str:
    """One line, at most ``width`` characters, with … when cut."""
    flat = one_line(text)
    return flat if len(flat) <= width else flat[: max(0, width - 1)] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> str:
    """A plain aligned text table (columns in ``right`` are right-aligned)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        out = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths, strict=True))]
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), sep, *(line(r) for r in cells)])


def add_ledger_parser(sub: Any) -> None:
    """Register ``remem ledger`` on an argparse subparsers object."""
    p: argparse.ArgumentParser = sub.add_parser("ledger", help="inspect a store's ledger (list, show, history, verify)")
    p.add_argument("store")
    act = p.add_mutually_exclusive_group(required=True)
    act.add_argument("--list", action="store_true", help="list memories (filter with --state, --role, --task)")
    act.add_argument("--show", metavar="ID", help="everything about one memory")
    act.add_argument("--history", metavar="ID", help="the lifecycle events of one memory")
    act.add_argument("--verify", action="store_true", help="check the ledger's invariants")
    p.add_argument("--state", help=f"with --list: one of {', '.join(s.value for s in State)}")
    p.add_argument("--role", help=f"with --list: one of {', '.join(ROLES)}")
    p.add_argument("--task", help="with --list: memories declared for or shown in this task class")
    p.add_argument("--scope", help="with --list: only this scope's memories")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _key(m: Memory) -> str:
    if m.entity is None and m.attribute is None:
        return "-"
    return f"{m.entity or '-'}.{m.attribute or '-'}"


def cmd_list(
    store: Store, state: str | None, role: str | None, task: str | None, as_json: bool, scope: str | None = None
) -> int:
    st: State | None = None
    if state is not None:
        try:
            st = State(state.upper())
        except ValueError:
            raise UserInputError(f"unknown state {state!r}; one of {[s.value for s in State]}") from None
    if role is not None and role not in ROLES:
        raise UserInputError(f"unknown role {role!r}; one of {list(ROLES)}")
    with store.read() as tx:
        mems = tx.list_memories(st, role, scope=None if scope is None else check_scope(scope, "--scope"))
        stats = {}
        for start in range(0, len(mems), 500):
            chunk = mems[start : start + 500]
            stats.update(tx.stats_all_classes([m.id for m in chunk]))
    if task is not None:
        mems = [m for m in mems if task in m.tasks or task in stats.get(m.id, {})]
    if as_json:
        out = []
        for m in mems:
            d = m.to_dict()
            d["stats"] = {t: s.to_dict() for t, s in sorted(stats.get(m.id, {}).items())}
            out.append(d)
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return 0
    rows = []
    for m in mems:
        o = stats.get(m.id, {}).get(ALL_TASKS, TaskStats(task=ALL_TASKS))
        rows.append(
            [
                m.id,
                m.state.value,
                m.role,
                truncate(_key(m), 28),
                o.shown,
                o.credited,
                f"{o.contribution_rate:.2f}",
                truncate(m.text, TEXT_WIDTH),
            ]
        )
    print(table(["ID", "STATE", "ROLE", "KEY", "SHOWN", "CREDITED", "RATE", "TEXT"], rows, right=(4, 5, 6)))
    print(f"\n{len(rows)} memor{'y' if len(rows) == 1 else 'ies'}")
    return 0


def cmd_show(store: Store, memory_id: str, as_json: bool) -> int:
    with store.read() as tx:
        m = tx.memory(memory_id)
        stats = tx.all_stats(memory_id)
        events = tx.events(memory_id)
        credits = tx.credits_for(memory_id)
        supersedes = tx.supersedes(memory_id)
    if as_json:
        d = m.to_dict()
        d.update(
            stats={t: s.to_dict() for t, s in sorted(stats.items())},
            supersedes=supersedes,
            history=[e.to_dict() for e in events],
            credits=[c.to_dict() for c in credits],
        )
        print(json.dumps(d, indent=2, ensure_ascii=False))
        return 0
    fields: list[tuple[str, str]] = [
        ("id", m.id),
        ("state", m.state.value),
        ("text", m.text),
    ]
    if m.original_text != m.text:
        fields.append(("original_text", m.original_text))
    fields += [
        ("entity", m.entity or "-"),
        ("attribute", m.attribute or "-"),
        ("role", m.role),
        ("tasks", ", ".join(m.tasks) or "-"),
        ("created_at", fmt_time(m.created_at)),
        ("valid", f"{fmt_time(m.valid_from)} -> {fmt_time(m.valid_to) if m.valid_to is not None else 'now'}"),
        ("superseded_by", m.superseded_by or "-"),
        ("supersedes", ", ".join(supersedes) or "-"),
        ("token_cost", str(m.token_cost)),
        ("confidence", f"{m.confidence:g}"),
        ("credit records", str(len(credits))),
        ("events", str(len(events))),
    ]
    width = max(len(k) for k, _ in fields)
    for k, v in fields:
        print(f"{k.ljust(width)}  {one_line(v)}")
    print()
    srows = []
    for t in [ALL_TASKS, *sorted(t for t in stats if t != ALL_TASKS)]:
        s = stats.get(t, TaskStats(task=t))
        label = "(all)" if t == ALL_TASKS else truncate(t, 40)
        srows.append(
            [label, s.retrieved, s.shown, s.credited, s.blamed, f"{s.credit_sum:.2f}", f"{s.contribution_rate:.2f}"]
        )
    print(
        table(
            ["TASK CLASS", "RETRIEVED", "SHOWN", "CREDITED", "BLAMED", "CREDIT_SUM", "RATE"], srows, (1, 2, 3, 4, 5, 6)
        )
    )
    if events:
        print()
        _print_events(events)
    return 0


def _print_events(events: Sequence[Event]) -> None:
    """Events as a table; each reason is printed whole, wrapped at REASON_WIDTH onto continuation rows."""
    rows: list[list[object]] = []
    for e in events:
        lines = textwrap.wrap(one_line(e.reason), REASON_WIDTH, break_long_words=True, break_on_hyphens=False) or [""]
        rows.append(
            [
                e.seq,
                fmt_time(e.at),
                e.kind,
                f"{e.from_state.value if e.from_state else '-'} -> {e.to_state.value}",
                lines[0],
            ]
        )
        rows.extend(["", "", "", "", more] for more in lines[1:])
    print(table(["SEQ", "AT (UTC)", "EVENT", "FROM -> TO", "REASON"], rows, right=(0,)))


def cmd_history(store: Store, memory_id: str, as_json: bool) -> int:
    with store.read() as tx:
        tx.memory(memory_id)  # UnknownMemoryError for an unknown id
        events = tx.events(memory_id)
    if as_json:
        print(json.dumps([e.to_dict() for e in events], indent=2, ensure_ascii=False))
    else:
        _print_events(events)
    return 0


def cmd_verify(store: Store, as_json: bool) -> int:
    dim = store.get_meta("dim")
    problems = store.verify(int(dim) if dim else None)
    counts = store.counts()
    if as_json:
        print(json.dumps({"ok": not problems, "problems": problems, "counts": counts}, indent=2))
    else:
        for p in problems:
            print(f"problem: {p}")
        print(f"{counts['memories']} memories, {counts['events']} events, {counts['searches']} searches")
        print("ok" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


def run_ledger(args: argparse.Namespace, open_store: Callable[[str], Store]) -> int:
    """Dispatch ``remem ledger``; RememError propagates (the caller prints it and exits 2)."""
    if not args.list and (args.state or args.role or args.task):
        raise UserInputError("--state, --role and --task go with --list")
    store = open_store(args.store)
    try:
        if args.list:
            return cmd_list(store, args.state, args.role, args.task, args.json, args.scope)
        if args.show is not None:
            return cmd_show(store, args.show, args.json)
        if args.history is not None:
            return cmd_history(store, args.history, args.json)
        return cmd_verify(store, args.json)
    finally:
        store.close()
