"""The `remem` command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from remem_agent import ReMem
from remem_agent.cli import main
from remem_agent.demo import run_demo


def test_demo_learns_and_verifies(tmp_path: Path) -> None:
    lines: list[str] = []
    summary = run_demo(tmp_path / "demo", out=lines.append)
    assert summary["current_region"] == "Our server moved to west-2."
    assert summary["as_of_region"] == "Our server is in east-1."
    assert summary["east_state"] == "INVALIDATED"
    before, after = summary["before"], summary["after"]
    assert isinstance(before, list) and isinstance(after, list)
    # the look-alike started on top and the helpful note overtook it through feedback alone
    assert before[0] != after[0]
    assert summary["helpful_first_after"] is True
    assert summary["verify_ok"] is True
    assert any("verify(): ok" in line for line in lines)


def test_cli_demo_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    assert "Our server moved to west-2." in capsys.readouterr().out


def test_cli_verify_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with ReMem(tmp_path / "s") as mem:
        mem.add("a fact")
    assert main(["verify", str(tmp_path / "s")]) == 0
    assert capsys.readouterr().out.strip().endswith("ok")
    assert main(["stats", str(tmp_path / "s")]) == 0
    assert '"memories": 1' in capsys.readouterr().out


def test_cli_refuses_a_folder_that_is_not_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(tmp_path)]) == 2
    assert "not a remem store" in capsys.readouterr().err
