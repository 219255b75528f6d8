"""What a new user hits in the first minutes: the demo's trace location and citations, CLI checks.

The CLI is called in-process through ``remem_agent.cli.main``; argparse errors are ``SystemExit(2)``. The
pytest summary hook of tests/conftest.py is checked by running pytest on a tiny test file with it loaded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from remem_agent import ReMem
from remem_agent import demo as demo_mod
from remem_agent.adapters import ChatRequest, FunctionChatModel
from remem_agent.cli import main
from remem_agent.types import ROLES, State

MEMORY_ID = re.compile(r"\bm_[0-9a-f]{24}\b")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse refusing an argument
        code = int(exc.code or 0)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _citing_model(request: ChatRequest) -> str:
    """Answers with the region of the served fact it cites (found by its label in the prompt)."""
    prompt = "\n".join(m.content for m in request.messages)
    question = request.messages[-1].content
    want = "east-1" if "at the start" in question else "west-2"
    label = next(m.group(1) for m in re.finditer(r"\[(M\d+)\][^\n]*", prompt) if want in m.group(0))
    return json.dumps({"citations": [label], "region": want})


@pytest.fixture()
def scripted_demo_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Part 4 of the demo with a deterministic model instead of a local GGUF (fast, same code path)."""
    monkeypatch.setattr(
        demo_mod,
        "_local_model",
        lambda choice: (FunctionChatModel(_citing_model, name="fn"), "scripted test model", False),
    )


# -- 6. the demo's trace never lands in the current directory -------------------------------------------


def test_demo_trace_goes_into_the_store_folder_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripted_demo_model: None
) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    lines: list[str] = []
    summary = demo_mod.run_demo(tmp_path / "store", out=lines.append, model="auto")
    agent = summary["agent"]
    assert isinstance(agent, dict) and agent["ran"] is True
    trace = Path(str(agent["trace"]))
    assert trace == tmp_path / "store" / "traces" / "remem-demo.jsonl" and trace.exists()
    assert list(work.iterdir()) == []  # nothing written where the demo was run from
    assert any(str(trace) in line for line in lines)  # and it says where the trace is


def test_demo_with_a_temporary_store_says_the_trace_goes_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripted_demo_model: None
) -> None:
    monkeypatch.chdir(tmp_path)
    lines: list[str] = []
    summary = demo_mod.run_demo(out=lines.append)
    agent = summary["agent"]
    assert isinstance(agent, dict) and agent["ran"] is True
    assert list(tmp_path.iterdir()) == []
    assert any("--trace FILE" in line for line in lines)


def test_cli_demo_trace_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripted_demo_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "kept.jsonl"
    code, out, _ = _cli(capsys, "demo", "--trace", str(target))
    assert code == 0 and target.exists() and len(target.read_text().splitlines()) == 2
    assert f"in the trace: {target}" in out and "--trace FILE" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.jsonl"]
    code, _, err = _cli(capsys, "demo", "--trace", str(tmp_path / "missing" / "t.jsonl"))
    assert code == 2 and "existing folder" in err


# -- 7. part 4 shows the cited texts, not raw ids ---------------------------------------------------------


def test_demo_part4_prints_cited_texts(tmp_path: Path, scripted_demo_model: None) -> None:
    lines: list[str] = []
    demo_mod.run_demo(tmp_path / "store", out=lines.append)
    part4 = lines[next(i for i, line in enumerate(lines) if line.startswith("\n4.")) :]
    cites = [line for line in part4 if "cites:" in line]
    assert cites == [
        "      cites: ['Our server moved to west-2.']",
        "      cites: ['Our server is in east-1.']",
    ]
    assert not any(MEMORY_ID.search(line) for line in part4)


# -- 8. CLI arguments and output shapes -------------------------------------------------------------------


@pytest.mark.parametrize("rounds", ["0", "-1", "two"])
def test_demo_refuses_non_positive_rounds(rounds: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "demo", "--model", "none", "--rounds", rounds)
    assert code == 2 and out == "" and "--rounds" in err


def test_run_demo_refuses_non_positive_rounds(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rounds"):
        demo_mod.run_demo(tmp_path / "s", rounds=0, model="none", out=lambda _: None)
    assert not (tmp_path / "s").exists()


def test_dashboard_refuses_a_missing_output_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add("a fact")
    missing = tmp_path / "nonexistent" / "dir"
    code, out, err = _cli(capsys, "dashboard", str(tmp_path / "s"), "-o", str(missing / "x.html"))
    assert code == 2 and out == "" and "does not exist" in err and str(missing) in err
    assert not (tmp_path / "nonexistent").exists()
    code, _, err = _cli(capsys, "dashboard", str(tmp_path / "s"), "-o", str(tmp_path))
    assert code == 2 and "is a folder" in err
    code, out, _ = _cli(capsys, "dashboard", str(tmp_path / "s"), "-o", str(tmp_path / "ok.html"))
    assert code == 0 and (tmp_path / "ok.html").exists()


def test_cli_stats_has_the_shape_of_remem_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add("Our server is in east-1.", entity="server", attribute="region", timestamp="2026-01-05")
        mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp="2026-03-01")
        expected = mem.stats()
    code, out, _ = _cli(capsys, "stats", str(tmp_path / "s"))
    got = json.loads(out)
    assert code == 0
    assert list(got) == [
        "memories",
        "by_state",
        "by_role",
        "events",
        "searches",
        "feedbacks",
        "tokens_active",
        "embedder",
        "dim",
        "schema_version",
        "kept",
        "disk_bytes",
        "reranker",
        "traces",
    ]
    assert got["kept"] == expected.kept and got["disk_bytes"] > 0 and got["traces"] == {"files": 0, "bytes": 0}
    assert got["dim"] == expected.dim and isinstance(got["dim"], int)
    assert got["by_state"] == dict(expected.by_state) and list(got["by_state"]) == [s.value for s in State]
    assert got["by_state"]["LOW_VALUE"] == 0  # zero counts are kept
    assert got["by_role"] == dict(expected.by_role) and list(got["by_role"]) == list(ROLES)
    assert got["embedder"] == expected.embedder and got["schema_version"] == expected.schema_version
    assert (got["memories"], got["events"], got["tokens_active"]) == (
        expected.memories,
        expected.events,
        expected.tokens_active,
    )


def test_ledger_history_prints_reasons_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ReMem(tmp_path / "s") as mem:
        old = mem.add("Our server is in east-1.", entity="server", attribute="region", timestamp="2026-01-05")
        mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp="2026-03-01")
        reasons = [e.reason for e in mem.inspect(old).history]
    long_reason = max(reasons, key=len)
    assert len(long_reason) > 70  # longer than the column used to allow
    code, out, _ = _cli(capsys, "ledger", str(tmp_path / "s"), "--history", old)
    assert code == 0 and "…" not in out
    flat = " ".join(out.split())
    for reason in reasons:
        assert " ".join(reason.split()) in flat
    assert max(len(line) for line in out.splitlines()) <= 160  # wrapped, not one endless line


# -- 5. skipped browser tests are loud in the pytest summary ---------------------------------------------


def _pytest_with_our_conftest(tmp_path: Path, body: str) -> str:
    (tmp_path / "test_sample.py").write_text(body, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_summary_says_loudly_when_chromium_tests_were_skipped(tmp_path: Path) -> None:
    out = _pytest_with_our_conftest(
        tmp_path,
        "import pytest\n\n"
        "@pytest.mark.skipif(True, reason='chromium not installed')\n"
        "def test_in_browser():\n    pass\n\n"
        "def test_other():\n    pass\n",
    )
    assert "dashboard browser tests NOT run" in out and "1 headless-Chromium dashboard test(s) were skipped" in out


def test_summary_is_quiet_when_nothing_was_skipped_for_chromium(tmp_path: Path) -> None:
    out = _pytest_with_our_conftest(
        tmp_path, "import pytest\n\n@pytest.mark.skip(reason='other')\ndef test_x():\n    pass\n"
    )
    assert "NOT run" not in out and "1 skipped" in out


# -- 9. no PytestDeprecationWarning from pytest-asyncio ----------------------------------------------------


def test_pytest_config_sets_the_asyncio_fixture_loop_scope() -> None:
    """pytest-asyncio 0.24-0.26 warn on every run while this key is unset (1.x no longer does)."""
    import tomllib

    config = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["pytest"]["ini_options"]["asyncio_default_fixture_loop_scope"] == "function"
