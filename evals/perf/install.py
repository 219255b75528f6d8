"""How long the README's first set-up command takes on a fresh clone, and how large the environment it makes is.

A fresh clone of the repository at HEAD and a fresh virtual environment in a temporary folder; the README's
first set-up command, read from the README (as ``.ci/run`` reads it), run in that clone with the venv first
on ``PATH`` and with pip's verbose output (``PIP_VERBOSE``, an environment variable: the command's text is the
README's), so that the llama-cpp-python compile can be timed inside the command from its own log lines. Also
records the CPU flags of the host (does it have AVX-512/AMX?), the build flags the installed llama-cpp-python
recorded (``remem doctor``'s build check), the venv's size and the model cache's (a fresh one, so the run
includes joining the Qwen model from its packages, as a new user's first demo does).

    python -m evals.perf.install                 # -> results/perf/install.json (about 6 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evals.perf.measure import REPO_ROOT, loadavg, provenance

BUILD_START = re.compile(r"Building wheel for llama-cpp-python|\*\*\* Configuring CMake")
BUILD_END = re.compile(r"Created wheel for llama-cpp-python")


def readme_setup_commands(readme: Path = REPO_ROOT / "README.md") -> list[str]:
    """The commands of the README's ``## Set-up`` bash block, one per line (comments left out)."""
    text = readme.read_text(encoding="utf-8")
    block = re.search(r"^## Set-up\n\n```bash\n(.*?)^```", text, re.S | re.M)
    if block is None:
        raise SystemExit("README.md has no ## Set-up bash block")
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def cpu_flags() -> list[str]:
    """The host's AVX-512 / AMX / AVX2 flags (from /proc/cpuinfo), to say what kind of CPU the run had."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    found = re.search(r"^flags\s*:(.*)$", text, re.M)
    flags = set(found.group(1).split()) if found else set()
    return sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in {"avx2", "avx", "fma", "f16c"})


def vector_instructions(lib_dir: Path) -> dict[str, dict[str, int]] | None:
    """Per shared library of the installed llama_cpp, how many disassembled instructions use AVX-512 (``%zmm``),
    AMX (``%tmm``) and AVX/AVX2 (``%ymm``) registers: a portable build has none of the first two, whatever the
    build host. None without ``objdump``."""
    if shutil.which("objdump") is None:
        return None
    out: dict[str, dict[str, int]] = {}
    for lib in sorted(lib_dir.glob("*.so")):
        text = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True, check=False
        ).stdout
        out[lib.name] = {reg: text.count(f"%{reg}") for reg in ("zmm", "tmm", "ymm")}
    return out


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def run(command: str, cwd: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run ``command`` with bash, streaming its output to ``log``; the compile's start and end from its lines."""
    started = time.perf_counter()
    build_start = build_end = None
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter() - started
            out.write(f"{now:9.2f} {line}")
            if build_start is None and BUILD_START.search(line):
                build_start = now
            if BUILD_END.search(line):
                build_end = now
        rc = proc.wait()
    total = time.perf_counter() - started
    build = None if build_start is None or build_end is None else build_end - build_start
    return {
        "returncode": rc,
        "total_s": round(total, 1),
        "llama_cpp_build_s": None if build is None else round(build, 1),
        "everything_else_s": None if build is None else round(total - build, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO_ROOT / "results" / "perf" / "install.json"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary clone and venv (printed)")
    args = ap.parse_args(argv)
    load_start, t0 = loadavg(), time.perf_counter()
    command = readme_setup_commands()[0]
    work = Path(tempfile.mkdtemp(prefix="remem-install-"))
    try:
        clone, venv = work / "clone", work / "venv"
        subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "CMAKE_ARGS"}}
        env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), PIP_VERBOSE="1")
        # A fresh model cache too: the first demo joins the Qwen GGUF from its packages into it, as a new user's.
        env.update(TMPDIR=str(work), REMEM_MODEL_CACHE=str(work / "model-cache"))
        result = run(command, clone, env, work / "command1.log")
        size = dir_size(venv)
        cache = dir_size(work / "model-cache") if (work / "model-cache").exists() else 0
        flags = subprocess.run(
            [str(venv / "bin" / "python"), "-c",
             "import json; from remem_agent.doctor import recorded_build_flags as f; print(json.dumps(f()))"],
            capture_output=True, text=True, cwd=clone, check=False,
        )  # fmt: skip
        build_flags = json.loads(flags.stdout) if flags.returncode == 0 and flags.stdout.strip() else None
        libs = next(venv.glob("lib/python*/site-packages/llama_cpp/lib"), None)
        instructions = vector_instructions(libs) if libs is not None else None
        log_tail = (work / "command1.log").read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    wanted = ("GGML_NATIVE", "GGML_AVX", "GGML_AVX2", "GGML_AVX512", "GGML_AMX_INT8", "GGML_CPU_ALL_VARIANTS")
    report = {
        "command": command,
        "pip": "the venv's own pip (python -m venv)",
        **result,
        "venv_bytes": size,
        "venv_mib": round(size / 2**20, 1),
        "model_cache_mib": round(cache / 2**20, 1),  # the joined Qwen GGUF, outside the venv
        "host_cpu_flags": cpu_flags(),
        "llama_cpp_build_flags": None if build_flags is None else {k: build_flags.get(k) for k in wanted},
        "llama_cpp_vector_register_uses": instructions,
        "demo_output_tail": log_tail,
        "provenance": provenance(load_start, t0),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in report.items() if k not in {"demo_output_tail", "provenance"}}, indent=2))
    return 0 if result["returncode"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
