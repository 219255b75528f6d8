"""A self-contained HTML dashboard of one store's ledger (``remem dashboard STORE -o memory.html``).

The page needs no network: CSS and a small script are inline, the plots are SVG generated here. Every
string that comes from the ledger is HTML-escaped (``html.escape(..., quote=True)``) and never placed
inside ``<script>``; the script reads only escaped ``data-*`` attributes and never writes HTML. A
Content-Security-Policy that allows only this page's own script (by hash) is a second line of defence.
Without JavaScript the page shows every memory; the script only adds the state / task-class filters.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from remem_agent.errors import UserInputError
from remem_agent.store.base import Store
from remem_agent.types import ALL_TASKS, Event, Memory, State, TaskStats
from remem_agent.validate import check_scope

STATE_ORDER: tuple[State, ...] = tuple(State)
STATE_COLORS: dict[State, str] = {
    State.ACTIVE: "#2e7d32",
    State.LOW_VALUE: "#f9a825",
    State.COMPRESSED: "#ef6c00",
    State.ARCHIVED: "#6d4c41",
    State.INVALIDATED: "#c62828",
    State.ERASED: "#9e9e9e",
}


def esc(value: object) -> str:
    """HTML-escape any value for text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def fmt_time(t: float | None) -> str:
    if t is None:
        return "—"
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"{t:g}"


@dataclass(frozen=True)
class MemoryRow:
    """One memory with everything the dashboard shows about it."""

    memory: Memory
    stats: dict[str, TaskStats]
    events: tuple[Event, ...]
    supersedes: tuple[str, ...]

    @property
    def overall(self) -> TaskStats:
        return self.stats.get(ALL_TASKS, TaskStats(task=ALL_TASKS))

    @property
    def task_classes(self) -> list[str]:
        """Declared task classes plus every class the memory was shown or retrieved in."""
        return sorted(set(self.memory.tasks) | {t for t in self.stats if t != ALL_TASKS})


@dataclass(frozen=True)
class LedgerSnapshot:
    """A consistent read of the whole ledger."""

    folder: str
    rows: tuple[MemoryRow, ...]
    events: tuple[Event, ...]
    counts: dict[str, object] = field(default_factory=dict)
    meta: dict[str, str | None] = field(default_factory=dict)

    @property
    def task_classes(self) -> list[str]:
        return sorted({t for r in self.rows for t in r.task_classes})


def load_snapshot(store: Store, scope: str | None = None) -> LedgerSnapshot:
    """Read every memory (of ``scope``, if given), its per-class statistics, its events and its supersession
    links (one snapshot)."""
    with store.read() as tx:
        mems = tx.list_memories(scope=scope)
        stats: dict[str, dict[str, TaskStats]] = tx.stats_all_classes([m.id for m in mems])
        events = tx.all_events()
        searches, feedbacks = tx.search_counts()
        meta = {k: tx.get_meta(k) for k in ("embedder", "dim", "supersession")}
    by_mem: dict[str, list[Event]] = {m.id: [] for m in mems}
    for ev in events:
        by_mem.setdefault(ev.memory_id, []).append(ev)
    supersedes: dict[str, list[str]] = {}
    for m in mems:
        if m.superseded_by:
            supersedes.setdefault(m.superseded_by, []).append(m.id)
    rows = tuple(
        MemoryRow(m, stats.get(m.id, {}), tuple(by_mem.get(m.id, ())), tuple(supersedes.get(m.id, ()))) for m in mems
    )
    by_state: dict[str, int] = {}
    for m in mems:
        by_state[m.state.value] = by_state.get(m.state.value, 0) + 1
    counts: dict[str, object] = {
        "memories": len(mems),
        "by_state": by_state,
        "events": len(events),
        "searches": searches,
        "feedbacks": feedbacks,
        "tokens_active": sum(
            m.token_cost for m in mems if m.state not in (State.INVALIDATED, State.ARCHIVED, State.ERASED)
        ),
    }
    return LedgerSnapshot(store.location, rows, tuple(events), counts, meta)


# -- plots ---------------------------------------------------------------------------------------


def state_series(events: Iterable[Event]) -> list[tuple[float, dict[State, int]]]:
    """Replay the events log in ledger order (seq): (event time, count of memories per state) after each event.

    Ordered by ``seq`` rather than time: a store can mix caller-supplied timestamps with wall-clock ones.
    """
    counts = dict.fromkeys(STATE_ORDER, 0)
    series: list[tuple[float, dict[State, int]]] = []
    for ev in sorted(events, key=lambda e: e.seq):
        if ev.from_state is not None:
            counts[ev.from_state] -= 1
        counts[ev.to_state] += 1
        series.append((ev.at, dict(counts)))
    return series


def _y_axis(vmax: int, max_ticks: int = 5) -> tuple[int, int]:
    """(axis top, tick step): integer ticks of 1, 2 or 5 times a power of ten."""
    vmax = max(1, vmax)
    mag = 1
    while True:
        for m in (1, 2, 5):
            step = m * mag
            n = math.ceil(vmax / step)
            if n <= max_ticks:
                return n * step, step
        mag *= 10


def _grid(parts: list[str], left: float, width: float, top: float, height: float, vmax: int) -> int:
    ymax, step = _y_axis(vmax)
    for v in range(0, ymax + 1, step):
        yy = top + height - v / ymax * height
        parts.append(f'<line x1="{left}" x2="{left + width}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{v}</text>')
    return ymax


def svg_state_timeline(events: Sequence[Event], width: int = 640, height: int = 260) -> str:
    """Step lines: number of memories in each state along the events log (x: event order, labelled by time)."""
    series = state_series(events)
    left, right, top, bottom = 48, 130, 16, 36
    pw, ph = width - left - right, height - top - bottom
    parts = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="memory states over time">'
    ]
    if not series:
        parts.append(f'<text x="{left}" y="{top + 20}">no events</text></svg>')
        return "".join(parts)
    n = len(series)
    ymax = _grid(parts, left, pw, top, ph, max(max(c.values()) for _, c in series))

    def x(i: float) -> float:
        return left + (i / max(1, n - 1)) * pw

    def y(v: int) -> float:
        return top + ph - v / ymax * ph

    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        i = round(frac * (n - 1))
        parts.append(
            f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#999"/>'
            f'<text x="{x(i):.1f}" y="{top + ph + 16}" text-anchor="{anchor}">'
            f"{esc(fmt_time(series[i][0])[:16])}</text>"
        )
    parts.append(
        f'<text x="{left + pw / 2:.1f}" y="{height - 4}" text-anchor="middle">'
        f"events log, in ledger order ({n} events; labels: event time UTC)</text>"
    )
    step = max(1, n // 500)  # at most ~500 vertices per line
    idx = [*range(0, n, step), n - 1] if n > 1 else [0]
    for k, st in enumerate(STATE_ORDER):
        pts: list[str] = []
        prev: int | None = None
        for i in idx:
            v = series[i][1][st]
            if prev is not None:
                pts.append(f"{x(i):.1f},{y(prev):.1f}")
            pts.append(f"{x(i):.1f},{y(v):.1f}")
            prev = v
        parts.append(f'<polyline fill="none" stroke="{STATE_COLORS[st]}" stroke-width="2" points="{" ".join(pts)}"/>')
        ly = top + 12 + k * 18
        parts.append(
            f'<rect x="{left + pw + 12}" y="{ly - 9}" width="10" height="10" fill="{STATE_COLORS[st]}"/>'
            f'<text x="{left + pw + 26}" y="{ly}">{esc(st.value)} ({series[-1][1][st]})</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def svg_credit_histogram(rows: Sequence[MemoryRow], bins: int = 10, width: int = 520, height: int = 260) -> str:
    """Histogram of overall posterior contribution rates of memories that were shown at least once."""
    rates = [r.overall.contribution_rate for r in rows if r.overall.shown > 0]
    never = sum(1 for r in rows if r.overall.shown == 0)
    counts = [0] * bins
    for rate in rates:
        counts[min(bins - 1, int(rate * bins))] += 1
    left, right, top, bottom = 40, 12, 16, 50
    pw, ph = width - left - right, height - top - bottom
    parts = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="credit distribution">'
    ]
    ymax = _grid(parts, left, pw, top, ph, max(counts))
    bw = pw / bins
    for i, cnt in enumerate(counts):
        h = cnt / ymax * ph
        bx = left + i * bw
        hue = int(i / max(1, bins - 1) * 120)  # red (useless) -> green (helpful)
        parts.append(
            f'<rect x="{bx + 1:.1f}" y="{top + ph - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
            f'fill="hsl({hue},55%,48%)"><title>{i / bins:.1f}–{(i + 1) / bins:.1f}: {cnt}</title></rect>'
        )
        if cnt:
            parts.append(f'<text x="{bx + bw / 2:.1f}" y="{top + ph - h - 3:.1f}" text-anchor="middle">{cnt}</text>')
    for i in range(0, bins + 1, 2):
        parts.append(f'<text x="{left + i * bw:.1f}" y="{top + ph + 14}" text-anchor="middle">{i / bins:.1f}</text>')
    parts.append(
        f'<text x="{left + pw / 2:.1f}" y="{height - 18}" text-anchor="middle">posterior contribution rate '
        f"(memories shown ≥ 1×: {len(rates)})</text>"
        f'<text x="{left + pw / 2:.1f}" y="{height - 4}" text-anchor="middle">never shown: {never}</text></svg>'
    )
    return "".join(parts)


# -- page ------------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 24px;
  color:#1d2329;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:18px 0 8px}
.sub{color:#57606a;margin-bottom:10px}.sub code{background:#eef1f4;padding:1px 4px;border-radius:3px}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0}
.card{background:#fff;border:1px solid #d8dee4;border-radius:6px;padding:6px 12px;min-width:88px}
.card b{display:block;font-size:20px}.card span{color:#57606a;font-size:12px}
.plots{display:flex;flex-wrap:wrap;gap:16px}
.plotbox{background:#fff;border:1px solid #d8dee4;border-radius:6px;padding:8px}
.plotbox h3{margin:0 0 4px;font-size:14px}
svg.plot text{font-size:11px;fill:#333}svg.plot .grid{stroke:#e3e7eb;stroke-width:1}
#filters{margin:8px 0;padding:8px;background:#fff;border:1px solid #d8dee4;border-radius:6px}
#filters label{margin-right:14px}
table.mems{border-collapse:collapse;width:100%;background:#fff}
table.mems>thead th{position:sticky;top:0;background:#24292f;color:#fff;text-align:left;padding:6px;font-weight:600}
table.mems>tbody>tr>td{border-bottom:1px solid #d8dee4;padding:6px;vertical-align:top}
tr.mem:target{outline:3px solid #0969da}
.id{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:1px 8px;font-size:11px;font-weight:600}
.text{white-space:pre-wrap;word-break:break-word;max-width:380px}
.orig{color:#57606a;font-size:12px;margin-top:4px;white-space:pre-wrap}
.muted{color:#8c959f}.small{font-size:12px}
table.mini{border-collapse:collapse;font-size:12px}
table.mini td,table.mini th{padding:1px 6px;border-bottom:1px solid #eef1f4;text-align:right}
table.mini td:first-child,table.mini th:first-child{text-align:left}
.bar{display:inline-block;height:8px;background:#d8dee4;width:60px;vertical-align:middle;margin-left:4px}
.bar i{display:block;height:8px;background:#2e7d32}
ol.tl{margin:0;padding-left:16px;font-size:12px;max-width:360px}ol.tl li{margin-bottom:2px}
a{color:#0969da;text-decoration:none}a:hover{text-decoration:underline}
"""

_JS = """
(function(){
  var st=document.getElementById('f-state'),tk=document.getElementById('f-task'),n=document.getElementById('f-count');
  var rows=document.querySelectorAll('tr.mem');
  function apply(){
    var s=st.value,t=tk.value,shown=0;
    for(var i=0;i<rows.length;i++){
      var r=rows[i],ok=(!s||r.getAttribute('data-state')===s);
      if(ok&&t){ok=JSON.parse(r.getAttribute('data-tasks')||'[]').indexOf(t)>=0;}
      r.hidden=!ok;if(ok){shown++;}
    }
    n.textContent=shown+' of '+rows.length+' shown';
  }
  function fromHash(){
    var h=location.hash.replace(/^#/,'').split('&');
    for(var i=0;i<h.length;i++){
      var kv=h[i].split('='),v=decodeURIComponent(kv[1]||'');
      if(kv[0]==='state'){st.value=v;}else if(kv[0]==='task'){tk.value=v;}
    }
  }
  st.addEventListener('change',apply);tk.addEventListener('change',apply);
  fromHash();apply();
  document.getElementById('filters').hidden=false;
})();
"""


def _badge(state: State) -> str:
    return f'<span class="badge" style="background:{STATE_COLORS[state]}">{esc(state.value)}</span>'


def _mem_link(mid: str) -> str:
    return f'<a class="id" href="#{esc(mid)}">{esc(mid)}</a>'


def _stats_table(row: MemoryRow) -> str:
    o = row.overall
    pct = max(0.0, min(1.0, o.contribution_rate)) * 100
    out = [
        f'<div class="small">rate <b>{o.contribution_rate:.2f}</b><span class="bar"><i style="width:{pct:.0f}%">'
        f"</i></span> ±{o.posterior_std:.2f}</div>",
        '<table class="mini"><tr><th>class</th><th>shown</th><th>cred.</th><th>blamed</th><th>rate</th></tr>',
    ]
    classes = [ALL_TASKS, *sorted(t for t in row.stats if t != ALL_TASKS)]
    for t in classes:
        s = row.stats.get(t, TaskStats(task=t))
        label = "all" if t == ALL_TASKS else esc(t)
        out.append(
            f"<tr><td>{label}</td><td>{s.shown}</td><td>{s.credited}</td><td>{s.blamed}</td>"
            f"<td>{s.contribution_rate:.2f}</td></tr>"
        )
    out.append("</table>")
    if o.retrieved:
        out.append(f'<div class="muted small">retrieved {o.retrieved}×, credit Σ {o.credit_sum:.2f}</div>')
    return "".join(out)


def _timeline(events: Sequence[Event]) -> str:
    if not events:
        return '<span class="muted">no events</span>'
    items = []
    for ev in events:
        move = (
            esc(ev.to_state.value) if ev.from_state is None else f"{esc(ev.from_state.value)}→{esc(ev.to_state.value)}"
        )
        items.append(
            f'<li><span class="muted">{esc(fmt_time(ev.at))}</span> <b>{esc(ev.kind)}</b> {move}'
            f"{' — ' + esc(ev.reason) if ev.reason else ''}</li>"
        )
    return '<ol class="tl">' + "".join(items) + "</ol>"


def _memory_row(row: MemoryRow) -> str:
    m = row.memory
    text = f'<div class="text">{esc(m.text)}</div>'
    if m.original_text != m.text:
        text += f'<div class="orig"><b>original:</b> {esc(m.original_text)}</div>'
    key = (
        f"{esc(m.entity or '—')} · {esc(m.attribute or '—')}"
        if (m.entity is not None or m.attribute is not None)
        else '<span class="muted">—</span>'
    )
    tasks = ", ".join(esc(t) for t in m.tasks) or '<span class="muted">none</span>'
    valid = f"{esc(fmt_time(m.valid_from))} → {esc(fmt_time(m.valid_to)) if m.valid_to is not None else 'now'}"
    links = []
    if m.superseded_by:
        links.append(f"superseded by {_mem_link(m.superseded_by)}")
    if row.supersedes:
        links.append("supersedes " + ", ".join(_mem_link(s) for s in row.supersedes))
    sup = "<br>".join(links) or '<span class="muted">—</span>'
    data_tasks = esc(json.dumps(row.task_classes))
    return (
        f'<tr class="mem" id="{esc(m.id)}" data-state="{esc(m.state.value)}" data-tasks="{data_tasks}">'
        f'<td><div class="id">{esc(m.id)}</div>{_badge(m.state)}</td>'
        f"<td>{text}</td>"
        f'<td class="small">key: {key}<br>role: <b>{esc(m.role)}</b><br>tasks: {tasks}<br>'
        f"valid: {valid}<br>tokens: {m.token_cost} · conf. {m.confidence:g}</td>"
        f"<td>{_stats_table(row)}</td>"
        f'<td class="small">{sup}</td>'
        f"<td>{_timeline(row.events)}</td></tr>"
    )


def script_hash() -> str:
    """The CSP source for the page's only script."""
    return "sha256-" + base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode()


DEFAULT_MAX_ROWS = 2000


def render_dashboard(
    snap: LedgerSnapshot, *, title: str = "remem memory dashboard", csp: bool = True, max_rows: int | None = None
) -> str:
    """The whole page as one HTML string.

    Cards and plots cover the whole ledger; the memory table shows the ``max_rows`` most recently added
    memories (None or 0: all), because a 100k-memory table makes a page browsers struggle to open.
    """
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 0):
        raise UserInputError(f"max_rows must be a non-negative integer, got {max_rows!r}")
    shown = snap.rows[-max_rows:] if max_rows else snap.rows
    by_state = {s: 0 for s in STATE_ORDER}
    for r in snap.rows:
        by_state[r.memory.state] += 1
    cards = [f'<div class="card"><b>{len(snap.rows)}</b><span>memories</span></div>']
    for s in STATE_ORDER:
        cards.append(
            f'<div class="card" style="border-left:4px solid {STATE_COLORS[s]}"><b>{by_state[s]}</b>'
            f"<span>{esc(s.value)}</span></div>"
        )
    for k in ("events", "searches", "feedbacks", "tokens_active"):
        cards.append(f'<div class="card"><b>{esc(snap.counts.get(k, 0))}</b><span>{esc(k)}</span></div>')
    state_opts = "".join(f'<option value="{esc(s.value)}">{esc(s.value)} ({by_state[s]})</option>' for s in STATE_ORDER)
    task_opts = "".join(f'<option value="{esc(t)}">{esc(t)}</option>' for t in snap.task_classes)
    head_csp = (
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        f"style-src 'unsafe-inline'; img-src data:; script-src '{script_hash()}'\">"
        if csp
        else ""
    )
    meta = " · ".join(f"{esc(k)}: <code>{esc(v)}</code>" for k, v in snap.meta.items() if v is not None)
    rows = "".join(_memory_row(r) for r in shown)
    cut = (
        f'<p class="muted">The table shows the {len(shown)} most recently added of {len(snap.rows)} memories '
        "(<code>remem dashboard --max-rows 0</code> shows all); cards and plots cover every memory.</p>"
        if len(shown) < len(snap.rows)
        else ""
    )
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">{head_csp}'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{esc(title)}</h1>"
        f'<div class="sub">store <code>{esc(snap.folder)}</code> · {meta} · generated '
        f"{esc(datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC'))}</div>"
        f'<div class="cards">{"".join(cards)}</div>'
        '<div class="plots">'
        '<div class="plotbox"><h3>Memories per state over time (events log)</h3>'
        f"{svg_state_timeline(snap.events)}</div>"
        f'<div class="plotbox"><h3>Credit distribution</h3>{svg_credit_histogram(snap.rows)}</div>'
        "</div>"
        f"<h2>Memories ({len(snap.rows)})</h2>{cut}"
        '<div id="filters" hidden>'
        f'<label>state <select id="f-state"><option value="">all</option>{state_opts}</select></label>'
        f'<label>task class <select id="f-task"><option value="">all</option>{task_opts}</select></label>'
        '<span id="f-count" class="muted"></span></div>'
        '<table class="mems"><thead><tr><th>id / state</th><th>text</th><th>entity · attribute / role</th>'
        "<th>credit (overall, per task class)</th><th>supersession</th><th>lifecycle timeline</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        f"<script>{_JS}</script></body></html>\n"
    )


def _short_name(location: str) -> str:
    """The folder name of a SQLite store, the database name of a PostgreSQL URL."""
    return location.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or location


def write_dashboard(
    store_path: str | Path,
    out: str | Path,
    *,
    title: str | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    scope: str | None = None,
) -> Path:
    """Render the dashboard of the store at ``store_path`` into ``out`` (read only; no embedder needed).

    ``out``'s folder must exist: a typo in it is refused (UserInputError) rather than created.
    """
    from remem_agent.store.factory import open_store

    target = Path(out).expanduser()
    if target.is_dir():
        raise UserInputError(f"output {str(target)!r} is a folder; give a file name (e.g. {target / 'memory.html'})")
    if not target.parent.is_dir():
        raise UserInputError(f"output folder {str(target.parent)!r} does not exist; create it first")
    store = open_store(store_path if isinstance(store_path, Path) else str(store_path), create=False)
    try:
        snap = load_snapshot(store, None if scope is None else check_scope(scope, "--scope"))
    finally:
        store.close()
    page = render_dashboard(snap, title=title or f"remem dashboard — {_short_name(snap.folder)}", max_rows=max_rows)
    target.write_text(page, encoding="utf-8")
    return target
