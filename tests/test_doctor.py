"""``remem doctor`` and the demo's model probe: real child processes, a real store, a real busy port, and a
llama_cpp that crashes natively (a stand-in package put first on the child's path whose ``Llama`` dies with
SIGSEGV or SIGILL, as a build with instructions the CPU mishandles does)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from remem_agent import ReMem
from remem_agent.doctor import (
    LLAMA_FIX,
    CheckResult,
    judge_build_flags,
    recorded_build_flags,
    report,
    run_probe,
)

CRASHING_LLAMA = """
import os, signal
__version__ = "0.3.36"
class Llama:
    def __init__(self, *args, **kwargs):
        os.kill(os.getpid(), signal.{sig})
"""


def _crashing_llama_cpp(folder: Path, sig: str = "SIGSEGV") -> dict[str, str]:
    """An environment whose ``import llama_cpp`` finds a package that kills its process with ``sig`` on load."""
    pkg = folder / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(CRASHING_LLAMA.format(sig=sig))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def _remem(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "remem_agent.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGILL"])
def test_a_crashing_model_is_a_failed_check_with_the_fix(tmp_path: Path, sig: str) -> None:
    env = _crashing_llama_cpp(tmp_path / "fake", sig)
    proc = _remem("doctor", "--model", "smollm2", "--port", str(_free_port()), env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAIL    local model      crashed with {sig} while loading or decoding with llama.cpp" in proc.stdout
    assert f"fix: {LLAMA_FIX}" in proc.stdout
    assert "something needs fixing" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr  # the doctor itself did not crash


def test_the_demo_reports_a_crashing_model_exits_non_zero_and_removes_its_folder(tmp_path: Path) -> None:
    env = _crashing_llama_cpp(tmp_path / "fake")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env["TMPDIR"] = str(tmp)
    proc = _remem("demo", "--model", "smollm2", "--embedder", "hash", env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the local model does not work here: crashed with SIGSEGV" in proc.stdout
    assert LLAMA_FIX in proc.stdout
    assert "verify(): ok" in proc.stdout  # the first three parts ran
    assert list(tmp.iterdir()) == []  # the temporary store is gone


def test_every_check_passes_on_a_healthy_installation(tmp_path: Path) -> None:
    """What CI installs (the README's commands): a portable build, a model that decodes, the embedder."""
    store = tmp_path / "store"
    with ReMem(store) as mem:
        mem.add("Our server is in east-1.", entity="server", attribute="region")
    proc = _remem("doctor", "--model", "smollm2", "--store", str(store), "--port", str(_free_port()),
                  "--require", "build,model,embedder", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["name"]: r for r in json.loads(proc.stdout)}
    assert {n: r["status"] for n, r in results.items()} == dict.fromkeys(results, "ok")
    assert "1 memories, verify() ok" in results["ledger"]["detail"]
    assert "GGML_NATIVE off" in results["build"]["detail"]


def test_the_installed_llama_cpp_was_compiled_portably() -> None:
    """From the flags its CMake package file recorded at build time, not from what this host supports."""
    flags = recorded_build_flags()
    assert flags is not None, "llama-cpp-python recorded no ggml-config.cmake"
    assert flags["GGML_NATIVE"] == "OFF", flags.get("GGML_NATIVE")
    assert judge_build_flags(flags)[0] == "ok"


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) disassembles the libraries")
def test_the_installed_llama_cpp_holds_no_avx512_or_amx_instruction() -> None:
    """The same claim read from the machine code itself: no instruction of the installed ggml, llama and mtmd
    libraries uses an AVX-512 (zmm) or AMX (tmm) register, so no host can be made to run one."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.origin is not None
    from evals.perf.install import vector_instructions

    found = vector_instructions(Path(spec.origin).parent / "lib")
    assert found and "libggml-cpu.so" in found, found
    assert all(n["zmm"] == 0 and n["tmm"] == 0 for n in found.values()), found
    assert found["libggml-cpu.so"]["ymm"] > 0  # AVX2 code is there: the scan reads real instructions


def test_build_flags_are_judged_by_what_was_compiled_in() -> None:
    portable = {"GGML_NATIVE": "OFF", "GGML_AVX2": "ON", "GGML_AVX512": "OFF", "GGML_AMX_INT8": "OFF"}
    assert judge_build_flags(portable)[0] == "ok"
    status, detail, fix = judge_build_flags({**portable, "GGML_NATIVE": "ON"})
    assert status == "fail" and "GGML_NATIVE" in detail and fix == LLAMA_FIX
    status, detail, _ = judge_build_flags({**portable, "GGML_AVX512": "ON", "GGML_AMX_INT8": "ON"})
    assert status == "fail" and "GGML_AVX512, GGML_AMX_INT8" in detail
    assert judge_build_flags({"GGML_NATIVE": "OFF", "GGML_CPU_ALL_VARIANTS": "ON", "GGML_AVX512": "ON"})[0] == "ok"


def test_a_busy_port_and_a_damaged_store_fail_with_their_fixes(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_probe("port", f"127.0.0.1:{port}")
    assert result.status == "fail" and f"127.0.0.1:{port} is not free" in result.detail
    assert result.fix is not None and result.fix.startswith("remem serve --port ")
    assert run_probe("port", f"127.0.0.1:{port}").status == "ok"  # released

    store = tmp_path / "store"
    with ReMem(store) as mem:
        mem.add("x is y.")
    (store / "ledger.db").write_bytes(b"not a database at all" * 100)
    result = run_probe("ledger", str(store))
    assert result.status == "fail" and "LedgerCorruptError" in result.detail
    assert run_probe("ledger", str(tmp_path / "none")).status == "skip"


def test_missing_parts_fail_only_when_required() -> None:
    results = [
        CheckResult(name="build", status="ok", detail="portable"),
        CheckResult(name="model", status="missing", detail="not installed", fix="pip install ..."),
    ]
    text, status = report(results)
    assert status == 0 and "MISSING" in text and "fix: pip install ..." in text
    text, status = report(results, require=["model"])
    assert status == 1 and "FAIL    local model" in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
