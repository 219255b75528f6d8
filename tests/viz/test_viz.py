"""The HTML dashboard (escaping, content, real headless Chromium) and the ``remem ledger`` command."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from remem_agent import ReMem
from remem_agent.cli import main
from remem_agent.learning.retention import compress_text
from remem_agent.store.lifecycle import LifecycleEvent
from remem_agent.tokens import count_tokens
from remem_agent.types import State
from remem_agent.viz.dashboard import LedgerSnapshot, load_snapshot, render_dashboard, state_series, write_dashboard

DAY = 86_400.0
T0 = 1_700_000_000.0
CHROMIUM = "/usr/bin/chromium"

ALERT = "<script>alert(1)</script>"
TITLE_PAYLOAD = "<script>document.title='PWNED'</script>"
IMG_PAYLOAD = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
ATTR_PAYLOAD = '"><b id="injected">x</b>'
LONG_TEXT = (
    "Release day notes: the production release channel has a new bot avatar, and the bot now posts "
    "a celebratory animated sticker after each successful release to the announcements channel."
)


@dataclass
class Built:
    path: Path
    ids: dict[str, str]


def build_store(path: Path) -> Built:
    """A real store: hostile texts, a superseded fact, a memory driven to COMPRESSED by feedback, credits."""
    ids: dict[str, str] = {}
    with ReMem(path) as mem:
        ids["alert"] = mem.add(ALERT, role="note", task="deploy", timestamp=T0)
        ids["title"] = mem.add(TITLE_PAYLOAD, role="note", timestamp=T0)
        ids["img"] = mem.add(IMG_PAYLOAD, role="note", timestamp=T0)
        ids["attr"] = mem.add(ATTR_PAYLOAD, entity=ATTR_PAYLOAD, attribute="x<y", role="preference", timestamp=T0)
        ids["east"] = mem.add("Our server is in east-1.", entity="server", attribute="region", timestamp=T0)
        ids["west"] = mem.add(
            "Our server moved to west-2.", entity="server", attribute="region", timestamp=T0 + 7 * DAY
        )
        ids["helpful"] = mem.add(
            "Before shipping, run the database migration script, then tag the build.", role="note", timestamp=T0
        )
        ids["lookalike"] = mem.add(LONG_TEXT, role="note", timestamp=T0)
        res = mem.search("Where is our server?", now=T0 + 8 * DAY, task="ops")
        mem.feedback(res.search_id, success=True, used_ids=[ids["west"]], cited_ids=[ids["west"]])
        for r in range(14):
            res = mem.search("What do I do on release day before shipping?", k=2, task="deploy", now=T0 + (9 + r) * DAY)
            served = res.ids
            used = [ids["helpful"]] if ids["helpful"] in served else []
            mem.feedback(res.search_id, success=bool(used), used_ids=used, cited_ids=used)
        # the look-alike never helped: retire it the way the retention policy does (demote, then compress)
        short = compress_text(LONG_TEXT)
        # (the retention policy may have demoted it already: the evidence-scaled floor serves it until it is judged)
        with mem.store.write() as tx:
            if tx.memory(ids["lookalike"]).state is State.ACTIVE:
                tx.transition(
                    ids["lookalike"], LifecycleEvent.DEMOTE, reason="shown 5x, never credited", at=T0 + 30 * DAY
                )
            if tx.memory(ids["lookalike"]).state is State.LOW_VALUE:
                tx.transition(
                    ids["lookalike"],
                    LifecycleEvent.COMPRESS,
                    reason="still useless after 10 exposures: serving a shorter text",
                    at=T0 + 31 * DAY,
                    updates={"text": short, "token_cost": count_tokens(short)},
                )
        assert mem.verify().ok
    return Built(path, ids)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_store(tmp_path_factory.mktemp("viz") / "store")


def test_fixture_store_has_the_interesting_states(built: Built) -> None:
    with ReMem(built.path) as mem:
        assert mem.get(built.ids["east"]).state.value == "INVALIDATED"
        assert mem.get(built.ids["east"]).superseded_by == built.ids["west"]
        look = mem.get(built.ids["lookalike"])
        assert look.state.value == "COMPRESSED", mem.inspect(built.ids["lookalike"]).history
        assert look.text != look.original_text
        assert mem.inspect(built.ids["helpful"]).overall.credited > 0


def test_dashboard_html_escapes_every_ledger_string(built: Built, tmp_path: Path) -> None:
    out = tmp_path / "memory.html"
    assert main(["dashboard", str(built.path), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    for payload in (ALERT, TITLE_PAYLOAD, IMG_PAYLOAD, ATTR_PAYLOAD):
        assert payload not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;script&gt;document.title=&#x27;PWNED&#x27;&lt;/script&gt;" in page
    assert (
        "&lt;img src=x onerror=&quot;document.body.setAttribute(&#x27;data-pwned&#x27;,&#x27;1&#x27;)&quot;&gt;"
    ) in page
    assert "&quot;&gt;&lt;b id=&quot;injected&quot;&gt;x&lt;/b&gt;" in page  # text and attribute-safe
    assert 'id="injected"' not in page
    # exactly one script element, ours, and it holds no ledger text
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", page, flags=re.S)
    assert len(scripts) == 1
    assert "server" not in scripts[0] and "PWNED" not in scripts[0]
    # no network: nothing loaded from elsewhere
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert "Content-Security-Policy" in page


def load_snapshot_of(path: Path) -> LedgerSnapshot:
    from remem_agent.cli import _open_store

    store = _open_store(str(path))
    try:
        return load_snapshot(store)
    finally:
        store.close()


def test_dashboard_shows_states_credit_supersession_and_timeline(built: Built) -> None:
    snap = load_snapshot_of(built.path)
    page = render_dashboard(snap)
    ids = built.ids
    for mid in ids.values():
        assert f'id="{mid}"' in page
    assert page.count('<tr class="mem"') == len(ids)
    # supersession links both ways, as anchors
    assert f'superseded by <a class="id" href="#{ids["west"]}">' in page
    assert f'supersedes <a class="id" href="#{ids["east"]}">' in page
    # compressed memory: served text and original text
    assert "<b>original:</b> " + LONG_TEXT in page
    # timeline with from->to and reasons
    assert "LOW_VALUE→COMPRESSED" in page and "ACTIVE→INVALIDATED" in page
    assert "serving a shorter text" in page
    # per task class credit rows and task filter options
    assert '<option value="deploy">deploy</option>' in page and '<option value="ops">ops</option>' in page
    assert "<td>deploy</td>" in page
    # plots are inline SVG
    assert page.count("<svg") == 2 and "credit distribution" in page
    # the state counts replayed from the events log end at the current counts
    final = state_series(snap.events)[-1][1]
    assert {s.value: n for s, n in final.items() if n} == snap.counts["by_state"]


def _chromium(args: list[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="remem-chromium-")
    try:
        return subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")
@pytest.mark.parametrize("csp", [True, False], ids=["with-csp", "escaping-only"])
def test_dashboard_in_headless_chromium_runs_no_injected_script(built: Built, tmp_path: Path, csp: bool) -> None:
    snap = load_snapshot_of(built.path)
    out = tmp_path / "memory.html"
    out.write_text(render_dashboard(snap, title="ledger view", csp=csp), encoding="utf-8")
    proc = _chromium(["--virtual-time-budget=3000", "--dump-dom", out.as_uri()])
    dom = proc.stdout
    assert proc.returncode == 0 and "</html>" in dom, proc.stderr[-2000:]
    # (a) it loaded and shows every memory, hostile texts as plain text
    assert dom.count('class="mem"') == len(built.ids)
    assert "Our server moved to west-2." in dom and "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert "&lt;img src=x onerror=" in dom
    # our own script ran: it revealed the filters and counted the rows
    assert f"{len(built.ids)} of {len(built.ids)} shown" in dom
    # (b) no injected script ran
    assert "data-pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]
    assert 'data-pwned="1"' not in dom
    assert "<title>ledger view</title>" in dom and "<title>PWNED" not in dom
    assert '<b id="injected">' not in dom  # text nodes serialize quotes raw; an element would be a tag


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")
def test_dashboard_filter_from_url_hash_hides_other_rows(built: Built, tmp_path: Path) -> None:
    out = write_dashboard(built.path, tmp_path / "memory.html")
    proc = _chromium(["--virtual-time-budget=3000", "--dump-dom", out.as_uri() + "#state=INVALIDATED"])
    rows = re.findall(r'<tr class="mem"[^>]*>', proc.stdout)
    assert len(rows) == len(built.ids)
    visible = [r for r in rows if " hidden" not in r]
    assert len(visible) == 1 and built.ids["east"] in visible[0]
    assert "1 of 8 shown" in proc.stdout


# -- remem ledger ----------------------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_ledger_list_table_and_filters(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "ledger", str(built.path), "--list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "STATE", "ROLE", "KEY", "SHOWN", "CREDITED", "RATE", "TEXT"]
    assert set(lines[1]) <= {"-", " "}
    # aligned: the STATE column starts at the same offset on every row
    col = lines[0].index("STATE")
    assert all(line[col - 2 : col] == "  " for line in lines[2:10])
    assert "8 memories" in out
    assert "…" in out  # the long text is truncated
    assert LONG_TEXT not in out

    code, out, _ = _run(capsys, "ledger", str(built.path), "--list", "--state", "invalidated")
    assert code == 0 and built.ids["east"] in out and built.ids["west"] not in out and "1 memory" in out
    code, out, _ = _run(capsys, "ledger", str(built.path), "--list", "--role", "preference")
    assert code == 0 and built.ids["attr"] in out and "1 memory" in out
    code, out, _ = _run(capsys, "ledger", str(built.path), "--list", "--task", "ops")
    assert code == 0 and built.ids["west"] in out and built.ids["helpful"] not in out


def test_ledger_list_json(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "ledger", str(built.path), "--list", "--json")
    assert code == 0
    rows = json.loads(out)
    assert {r["id"] for r in rows} == set(built.ids.values())
    by_id = {r["id"]: r for r in rows}
    assert by_id[built.ids["alert"]]["text"] == ALERT
    assert by_id[built.ids["helpful"]]["stats"]["deploy"]["credited"] > 0
    code, out, _ = _run(capsys, "ledger", str(built.path), "--list", "--state", "COMPRESSED", "--json")
    assert [r["id"] for r in json.loads(out)] == [built.ids["lookalike"]]


def test_ledger_show_and_history(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    look = built.ids["lookalike"]
    code, out, _ = _run(capsys, "ledger", str(built.path), "--show", look)
    assert code == 0
    assert re.search(r"^state +COMPRESSED$", out, flags=re.M)
    assert re.search(r"^original_text +" + re.escape(LONG_TEXT) + "$", out, flags=re.M)
    assert "TASK CLASS" in out and "(all)" in out and "deploy" in out
    assert "ACTIVE -> LOW_VALUE" in out and "LOW_VALUE -> COMPRESSED" in out

    code, out, _ = _run(capsys, "ledger", str(built.path), "--show", look, "--json")
    info = json.loads(out)
    assert info["state"] == "COMPRESSED" and info["original_text"] == LONG_TEXT
    assert [e["kind"] for e in info["history"]] == ["add", "demote", "compress"]
    assert info["stats"]["*"]["shown"] > 0 and len(info["credits"]) == info["stats"]["*"]["shown"]

    code, out, _ = _run(capsys, "ledger", str(built.path), "--show", built.ids["west"], "--json")
    assert json.loads(out)["supersedes"] == [built.ids["east"]]

    code, out, _ = _run(capsys, "ledger", str(built.path), "--history", built.ids["east"])
    assert code == 0
    assert out.splitlines()[0].split()[:4] == ["SEQ", "AT", "(UTC)", "EVENT"]
    assert "- -> ACTIVE" in out and "ACTIVE -> INVALIDATED" in out
    code, out, _ = _run(capsys, "ledger", str(built.path), "--history", built.ids["east"], "--json")
    events = json.loads(out)
    assert [(e["from_state"], e["to_state"]) for e in events] == [(None, "ACTIVE"), ("ACTIVE", "INVALIDATED")]
    assert events[1]["reason"]


def test_ledger_verify(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "ledger", str(built.path), "--verify")
    assert code == 0 and out.strip().endswith("ok")
    code, out, _ = _run(capsys, "ledger", str(built.path), "--verify", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] is True and report["problems"] == [] and report["counts"]["memories"] == 8


def test_ledger_errors(built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--show", "--history"):
        code, out, err = _run(capsys, "ledger", str(built.path), flag, "m_nope")
        assert code == 2 and out == "" and "m_nope" in err and err.startswith("remem: error:")
    code, _, err = _run(capsys, "ledger", str(tmp_path), "--list")
    assert code == 2 and "not a remem store" in err
    code, _, err = _run(capsys, "dashboard", str(tmp_path), "-o", str(tmp_path / "x.html"))
    assert code == 2 and "not a remem store" in err and not (tmp_path / "x.html").exists()
    code, _, err = _run(capsys, "ledger", str(built.path), "--list", "--state", "SLEEPING")
    assert code == 2 and "unknown state" in err
    code, _, err = _run(capsys, "ledger", str(built.path), "--list", "--role", "boss")
    assert code == 2 and "unknown role" in err
    code, _, err = _run(capsys, "ledger", str(built.path), "--verify", "--state", "ACTIVE")
    assert code == 2 and "go with --list" in err
    with pytest.raises(SystemExit) as exc:  # argparse: exactly one action is required
        main(["ledger", str(built.path)])
    assert exc.value.code == 2


def test_dashboard_table_keeps_the_most_recent_rows_when_capped(built: Built, tmp_path: Path) -> None:
    """A large store: the table is capped (newest kept), cards and counts still cover every memory."""
    from remem_agent.cli import main
    from remem_agent.errors import UserInputError

    out = tmp_path / "capped.html"
    assert main(["dashboard", str(built.path), "-o", str(out), "--max-rows", "3"]) == 0
    page = out.read_text(encoding="utf-8")
    total = len(built.ids)
    assert len(re.findall(r'<tr class="mem"', page)) == 3
    assert f"the 3 most recently added of {total} memories" in page
    assert f"<h2>Memories ({total})</h2>" in page
    with ReMem(built.path) as mem:
        newest = [m.id for m in mem.list()][-3:]
    for mid in newest:
        assert mid in page
    full = write_dashboard(built.path, tmp_path / "all.html", max_rows=0).read_text(encoding="utf-8")
    assert len(re.findall(r'<tr class="mem"', full)) == total and "most recently added" not in full
    with pytest.raises(UserInputError):
        render_dashboard(load_snapshot_of(built.path), max_rows=-1)
