"""Which modules of ``remem_agent`` one gateway chat request passes through, from the route to the model and back.

    python -m evals.analysis.call_path [--protocol openai|ollama] [--json]

One ``POST /v1/chat/completions`` (or ``/api/chat``) is sent to the gateway in process (ASGI), in front of a fake
model that answers at once, on a one-memory store, after one warm-up request. Every Python call into a module of
``remem_agent`` is recorded, on the event loop's thread and on the worker threads the request uses (a fresh
executor, so that they are profiled too); a call counts as a crossing when the nearest ``remem_agent`` frame
below it belongs to another module. The report lists each crossing (caller -> callee) once with how often it
happened, the modules entered, and their numbers: what a request costs a reader who follows it through the
code. Calls into the standard library and third-party packages are not counted.

The *spine* is the chain of ``remem_agent`` frames on the stack when the model is called: the path from the
gateway's outermost layer to the upstream call, which the reply retraces on its way back. Its crossings are the
module changes along that chain (each call into another module counted once). The stages the orchestrator
calls on the way (recall, prompt, enforce, learn, trace) return before the model call or after it, so they are
branches off the spine, listed with the crossings but not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from remem_agent import ReMem
from remem_agent.adapters import FunctionChatModel
from remem_agent.gateway import GatewayConfig, create_app

MODEL = "fake"
ANSWER = "It is in west-2 [M1]."
PACKAGE = "remem_agent"
QUESTION = "Where is our server hosted these days?"


def spine(frame: FrameType | None) -> list[str]:
    """The ``remem_agent`` modules on the stack at ``frame``, outermost first, each run of one module once."""
    names: list[str] = []
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if (name == PACKAGE or name.startswith(PACKAGE + ".")) and (not names or names[-1] != name):
            names.append(name)
        frame = frame.f_back
    return names[::-1]


def _module(frame: FrameType | None) -> str | None:
    """The ``remem_agent`` module of the nearest frame at or below ``frame`` (None: called from outside)."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            return name
        frame = frame.f_back
    return None


class Recorder:
    """A profile hook counting crossings between ``remem_agent`` modules."""

    def __init__(self) -> None:
        self.crossings: collections.Counter[tuple[str, str]] = collections.Counter()
        self.modules: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        callee = str(frame.f_globals.get("__name__", ""))
        if callee != PACKAGE and not callee.startswith(PACKAGE + "."):
            return
        caller = _module(frame.f_back) or "(outside)"
        with self._lock:
            self.modules[callee] += 1
            if caller != callee:
                self.crossings[(caller, callee)] += 1

    def report(self) -> dict[str, Any]:
        return {
            "crossings": [{"from": a, "to": b, "calls": n} for (a, b), n in sorted(self.crossings.items())],
            "distinct_crossings": len(self.crossings),
            "modules": sorted(self.modules),
            "distinct_modules": len(self.modules),
        }


async def _measure(protocol: str, folder: Path) -> dict[str, Any]:
    with ReMem(folder / "store") as mem:
        mem.add("Our server moved to west-2.", entity="server", attribute="region")
        spines: list[list[str]] = []

        def answer(_req: object) -> str:
            spines.append(spine(sys._getframe(1)))
            return ANSWER

        model = FunctionChatModel(answer, name=MODEL)
        app = create_app(GatewayConfig(models=(MODEL,), trace="off"), memory=mem, model=model)
        path = "/v1/chat/completions" if protocol == "openai" else "/api/chat"
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}]}
        if protocol == "ollama":
            body["stream"] = False
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            warm = await client.post(path, json=body)
            warm.raise_for_status()
            rec = Recorder()
            loop = asyncio.get_running_loop()
            sys.setprofile(rec)
            threading.setprofile(rec)  # threads started from now on: the executor below
            loop.set_default_executor(ThreadPoolExecutor(max_workers=4, thread_name_prefix="profiled"))
            try:
                reply = await client.post(path, json=body)
            finally:
                sys.setprofile(None)
                threading.setprofile(None)
            reply.raise_for_status()
        path_modules = spines[-1]
        return {
            "protocol": protocol,
            "path": path,
            "spine": path_modules,
            "spine_crossings": len(path_modules) - 1,
            **rec.report(),
        }


def measure(protocol: str = "openai") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="remem_call_path_") as folder:
        return asyncio.run(_measure(protocol, Path(folder)))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", choices=("openai", "ollama"), default="openai")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report = measure(args.protocol)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for c in report["crossings"]:
        print(f"{c['from']} -> {c['to']}  x{c['calls']}")
    print(f"{report['distinct_crossings']} distinct crossings between {report['distinct_modules']} modules")
    print("spine, from the gateway's outermost layer to the model call:")
    print("  " + "\n  -> ".join(report["spine"]))
    print(f"{report['spine_crossings']} crossings on the spine")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
