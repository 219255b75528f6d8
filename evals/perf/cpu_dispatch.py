"""Portable llama.cpp build vs runtime CPU dispatch: compile time on this host, and whether each build runs.

The README builds llama-cpp-python with ``GGML_NATIVE=OFF`` (one AVX2 CPU backend, linked in). llama.cpp can
instead compile one CPU backend per CPU generation and pick one at run time (``GGML_BACKEND_DL=ON
GGML_CPU_ALL_VARIANTS=ON``), which would run faster on AVX-512/AMX hosts. This script measures, in one run and
the same way for both: the wall time of ``pip wheel`` for the pinned sdist with each ``CMAKE_ARGS`` (no pip
cache), then installs each wheel into its own fresh venv and asks a child process to load SmolLM2 and decode one
token (as ``remem doctor`` does), recording the outcome and, for the dispatch build, which backend libraries
the wheel ships.

    python -m evals.perf.cpu_dispatch      # -> results/perf/cpu_dispatch.json (about 25 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from evals.perf.install import cpu_flags
from evals.perf.measure import REPO_ROOT, loadavg, provenance

PIN = "llama-cpp-python==0.3.36"
BUILDS = {
    "portable": "-DGGML_NATIVE=OFF",
    "runtime_dispatch": "-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON",
}
PROBE = """
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, seed=0, verbose=False)
out = llm.create_completion("The capital of France is", max_tokens=1, temperature=0.0)
llm.close()
print(repr(out["choices"][0]["text"]))
"""


def build(sdist: Path, cmake_args: str, out_dir: Path, log: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in {"CMAKE_ARGS", "PIP_VERBOSE"}}
    env["CMAKE_ARGS"] = cmake_args
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        rc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(out_dir), str(sdist)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False,
        ).returncode  # fmt: skip
    seconds = time.perf_counter() - started
    wheel = next(out_dir.glob("llama_cpp_python-*.whl"), None)
    libs = sorted({Path(n).name for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")}) if wheel else []
    return {
        "cmake_args": cmake_args,
        "returncode": rc,
        "build_s": round(seconds, 1),
        "wheel_mib": round(wheel.stat().st_size / 2**20, 1) if wheel else None,
        "shared_libraries": libs,
        "wheel": str(wheel) if wheel else None,
    }


def runs(wheel: Path, venv: Path, model: Path) -> dict[str, Any]:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    inst = subprocess.run([py, "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True, check=False)
    if inst.returncode != 0:
        return {"installed": False, "error": inst.stderr[-2000:]}
    probe = subprocess.run(
        [py, "-c", PROBE, str(model)], capture_output=True, text=True, check=False, timeout=600, cwd=venv
    )
    return {
        "installed": True,
        "returncode": probe.returncode,
        "decoded": probe.stdout.strip() or None,
        "stderr_tail": probe.stderr.strip().splitlines()[-6:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO_ROOT / "results" / "perf" / "cpu_dispatch.json"))
    ap.add_argument("--sdist", help="a downloaded llama-cpp-python sdist (else pip downloads the pinned one)")
    args = ap.parse_args(argv)
    from remem_agent.adapters import gguf

    model = gguf.smollm2_path()
    load_start, t0 = loadavg(), time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="remem-dispatch-"))
    try:
        if args.sdist:
            sdist = Path(args.sdist)
        else:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-cache-dir",
                 "-d", str(work), PIN],
                check=True, capture_output=True,
            )  # fmt: skip
            sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        report: dict[str, Any] = {"package": PIN, "host_cpu_flags": cpu_flags(), "cores": os.cpu_count()}
        for name, cmake_args in BUILDS.items():
            out_dir = work / name
            out_dir.mkdir()
            result = build(sdist, cmake_args, out_dir, work / f"{name}.log")
            if result["returncode"] != 0:
                result["log_tail"] = (work / f"{name}.log").read_text(errors="replace").splitlines()[-15:]
            elif result["wheel"]:
                result["run"] = runs(Path(result["wheel"]), work / f"venv-{name}", model)
            result.pop("wheel")
            report[name] = result
            print(name, json.dumps(result, indent=2), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["provenance"] = provenance(load_start, t0)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
