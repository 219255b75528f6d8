"""Every shell block of README.md and docs/ runs, or is checked against the code it names.

How each command of a ```bash block is treated (tests/test_readme.py does the same for the Python blocks):

* ``remem serve &`` followed by ``curl`` lines (the gateway's walkthrough): run as written in a fresh folder, the
  server's readiness awaited, the answer-id placeholder ``a_...`` filled in with the id the walkthrough's chat
  call returned; every reply is JSON without an error.
* ``remem doctor``: runs. Other ``remem``/``remem-mcp`` commands and ``python -m MODULE`` (benchmarks that run for
  hours): the module imports and its ``--help`` names every ``--flag`` the line gives.
* ``pip install``: not run here (CI runs the README's set-up as written, .ci/run): every extra it names is one
  pyproject.toml defines, every ``-r`` file exists, and a pin of a package pyproject.toml pins is that pin.
* ``ruff``, ``mypy`` and ``python -m pytest``: CI runs them as written.
* A block preceded by ``<!-- not-run: REASON -->`` (another program's command line) is only listed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*$")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CI_RUNS = ("ruff", "mypy")


@dataclass(frozen=True)
class ShellBlock:
    file: str
    line: int
    lines: tuple[str, ...]
    exempt: str | None

    @property
    def where(self) -> str:
        return f"{self.file} line {self.line}"


def shell_blocks() -> list[ShellBlock]:
    out = []
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("```"):
                end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
                if lines[i][3:].strip() in ("bash", "sh", "shell", "console"):
                    m = NOT_RUN.match(lines[i - 1]) if i else None
                    body = tuple(lines[i + 1 : end])
                    out.append(ShellBlock(doc.relative_to(ROOT).as_posix(), i + 1, body, m and m.group("reason")))
                i = end + 1
                continue
            i += 1
    return out


def commands(block: ShellBlock) -> list[list[str]]:
    """The block's commands as token lists: comments dropped, ``&&`` and a trailing ``&`` split off, leading
    ``NAME=value`` assignments removed."""
    out: list[list[str]] = []
    for line in block.lines:
        tokens = shlex.split(line, comments=True)
        current: list[str] = []
        for tok in [*tokens, "&&"]:
            if tok in ("&&", "&"):
                while current and re.match(r"^[A-Z_]+=", current[0]):
                    current.pop(0)
                if current:
                    out.append(current)
                current = []
            else:
                current.append(tok)
    return out


BLOCKS = shell_blocks()


def kind(cmd: list[str]) -> str:
    if cmd[:2] == ["pip", "install"]:
        return "pip"
    if cmd[:3] == ["python", "-m", "pytest"] or cmd[0] in CI_RUNS:
        return "ci"
    if cmd[:2] == ["python", "-m"]:
        return "module"
    if cmd[:2] == ["remem", "serve"] or cmd[0] == "curl":
        return "walkthrough"
    if cmd[:2] == ["remem", "doctor"]:
        return "doctor"
    if cmd[0] in ("remem", "remem-mcp"):
        return "cli"
    return "unknown"


def test_every_shell_command_is_one_this_file_knows_how_to_check() -> None:
    assert len(BLOCKS) >= 10
    for block in BLOCKS:
        if block.exempt is None:
            for cmd in commands(block):
                assert kind(cmd) != "unknown", f"{block.where}: no rule runs or checks {shlex.join(cmd)!r}"
    exempt = [b for b in BLOCKS if b.exempt]
    assert len(exempt) <= 1 and all(len(b.exempt or "") > 20 for b in exempt)


def _extras_of(spec: str) -> tuple[str, set[str]]:
    m = re.match(r"^(?P<name>[\w.-]+|\.)(\[(?P<extras>[\w,-]+)\])?(?P<rest>.*)$", spec)
    assert m, spec
    return m.group("name"), set((m.group("extras") or "").split(",")) - {""}


def _pins() -> dict[str, str]:
    deps = [*PYPROJECT["project"]["dependencies"]]
    for group in PYPROJECT["project"]["optional-dependencies"].values():
        deps += group
    pins = {}
    for dep in deps:
        m = re.match(r"^([\w.-]+)(\[[\w,-]+\])?==([\w.]+)", dep)
        if m:
            pins[m.group(1).lower()] = m.group(3)
    return pins


@pytest.mark.parametrize("block", [b for b in BLOCKS if any(kind(c) == "pip" for c in commands(b))], ids=str)
def test_pip_lines_name_what_the_project_defines(block: ShellBlock) -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    pins = _pins()
    for cmd in commands(block):
        if kind(cmd) != "pip":
            continue
        args = iter(cmd[2:])
        for arg in args:
            if arg == "-r":
                assert (ROOT / next(args)).is_file(), f"{block.where}: {shlex.join(cmd)}"
            elif arg == "-e":
                name, wanted = _extras_of(next(args))
                assert name == "." and wanted <= extras, f"{block.where}: unknown extras {wanted - extras}"
            elif not arg.startswith("-"):
                name, wanted = _extras_of(arg)
                if name == PYPROJECT["project"]["name"]:
                    assert wanted <= extras, f"{block.where}: unknown extras {wanted - extras}"
                elif "==" in arg:
                    package, version = arg.split("==", 1)
                    assert pins.get(package.lower(), version) == version, f"{block.where}: {arg} is not the pin"


def _help(cmd: list[str]) -> str:
    if cmd[0] == "python":
        argv = [sys.executable, "-m", cmd[2], "--help"]
    elif cmd[0] == "remem":
        argv = [sys.executable, "-m", "remem_agent.cli", *[c for c in cmd[1:2] if not c.startswith("-")], "--help"]
    else:
        argv = [sys.executable, "-m", "remem_agent.integrations.mcp_server", "--help"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env, check=False)
    assert done.returncode == 0, f"{shlex.join(argv)}: {done.stderr[-2000:]}"
    return done.stdout


CHECKED = [(b, c) for b in BLOCKS if b.exempt is None for c in commands(b) if kind(c) in ("module", "cli")]


@pytest.mark.parametrize(("block", "cmd"), CHECKED, ids=[f"{b.where}: {' '.join(c[:3])}" for b, c in CHECKED])
def test_module_and_cli_lines_name_flags_their_help_lists(block: ShellBlock, cmd: list[str]) -> None:
    text = _help(cmd)
    for flag in (c.split("=", 1)[0] for c in cmd if c.startswith("--")):
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), f"{block.where}: {flag} not in --help"


def test_remem_doctor_runs_as_the_readme_writes_it(tmp_path: Path) -> None:
    lines = [c for b in BLOCKS for c in commands(b) if kind(c) == "doctor"]
    assert lines, "the README shows remem doctor"
    for cmd in lines:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "remem_agent.cli", *cmd[1:]],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "all checks passed" in done.stdout


def test_the_gateway_walkthrough_runs_as_written(tmp_path: Path) -> None:
    walk = [b for b in BLOCKS if b.file == "docs/gateway.md" and any(kind(c) == "walkthrough" for c in commands(b))]
    assert len(walk) == 2
    serve = [c for b in walk for c in commands(b) if c[:2] == ["remem", "serve"]]
    curls = [line for b in walk for line in b.lines if line.lstrip().startswith("curl ")]
    assert serve == [["remem", "serve"]] and len(curls) == 4
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OLLAMA_", "REMEM_"))}
    env.update(HF_HUB_OFFLINE="1")
    server = subprocess.Popen(
        [sys.executable, "-m", "remem_agent.cli", "serve"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_ready("http://127.0.0.1:8765", server)
        answer_id = None
        for line in curls:
            if "a_..." in line:
                assert answer_id, "the walkthrough's chat call gave an answer id first"
                line = line.replace("a_...", answer_id)
            done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=600, cwd=tmp_path)
            assert done.returncode == 0, f"{line}: {done.stderr}"
            replies = [json.loads(x) for x in done.stdout.splitlines() if x.strip()]  # Ollama's chat streams NDJSON
            assert replies and all("error" not in r for r in replies), f"{line}: {done.stdout}"
            for reply in replies:
                answer_id = (reply.get("remem") or {}).get("answer_id") or answer_id
        assert (tmp_path / "remem_store").is_dir()  # the store the walkthrough names
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        finally:
            if server.stderr is not None:
                server.stderr.close()


def _wait_ready(base: str, server: subprocess.Popen[str], timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.poll() is not None:
            raise AssertionError(f"remem serve exited: {server.stderr.read() if server.stderr else ''}")
        try:
            if httpx.get(f"{base}/livez", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("remem serve did not become ready")
