"""Verify a packaged GGUF model end to end and record what was checked (the second model size).

    python -m evals.bench.check_gguf --model qwen2.5-coder-1.5b --out results/llm_study_1_5b/model_check.json

Checks, in order, each recorded in the JSON: the file is joined from its part packages and matches the
registry's sha256 (:func:`remem_agent.adapters.gguf.local_model`); the GGUF header (magic, version,
tensor and key counts); llama.cpp's metadata (architecture, name, size label, file type, context
length, read with ``vocab_only=True``); the parameter count llama.cpp reports for the loaded weights;
and one real ask through :class:`~remem_agent.adapters.llamacpp_chat.LlamaCppChat` (``n_threads=1``,
temperature 0, the answer schema) with the first question of a committed trace, whose truth is known.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from evals.harness.jsonio import write_json
from remem_agent.adapters.base import ChatRequest, Message
from remem_agent.adapters.gguf import LocalModelName, local_model
from remem_agent.adapters.llamacpp_chat import LlamaCppChat
from remem_agent.agent.trace import iter_traces
from remem_agent.errors import ModelError

# llama.cpp's llama_ftype numbers of the common quantisations (general.file_type)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 14: "Q4_K_S", 15: "Q4_K_M", 17: "Q5_K_M", 18: "Q6_K"}
META_KEYS = (
    "general.architecture",
    "general.name",
    "general.basename",
    "general.finetune",
    "general.size_label",
    "general.file_type",
    "general.quantization_version",
)
PROBE_TRACE = Path("traces/llm_aliases/contradiction_0_C.jsonl")


def header(path: Path) -> dict[str, Any]:
    """The fixed GGUF header: magic, version, tensor count, metadata key count."""
    with path.open("rb") as fh:
        raw = fh.read(24)
    if len(raw) < 24 or raw[:4] != b"GGUF":
        raise ModelError(f"{path} is not a GGUF file (first bytes {raw[:8]!r})")
    version, n_tensors, n_kv = struct.unpack("<IQQ", raw[4:24])
    return {"magic": "GGUF", "version": version, "n_tensors": n_tensors, "n_kv": n_kv}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def metadata(path: Path) -> dict[str, Any]:
    """llama.cpp's view of the file: selected metadata and the loaded model's parameter count."""
    from llama_cpp import Llama

    vocab = Llama(model_path=str(path), vocab_only=True, verbose=False)
    md = dict(vocab.metadata)
    arch = md.get("general.architecture", "")
    out: dict[str, Any] = {k: md.get(k) for k in META_KEYS}
    for k in ("context_length", "block_count", "embedding_length", "attention.head_count"):
        out[f"{arch}.{k}"] = md.get(f"{arch}.{k}")
    ftype = md.get("general.file_type")
    out["quantisation"] = FILE_TYPES.get(int(ftype)) if ftype is not None else None
    full = Llama(model_path=str(path), n_ctx=256, n_threads=1, verbose=False)
    out["n_params"] = int(full._model.n_params())
    out["n_ctx_train"] = int(full._model.n_ctx_train())
    return out


def probe_ask(path: Path, name: str, trace: Path = PROBE_TRACE) -> dict[str, Any]:
    """One real ask: the messages and schema of ``trace``'s first line, through LlamaCppChat."""
    rec = next(iter_traces(trace, strict=False))
    model = LlamaCppChat(path, n_threads=1, n_ctx=2048, name=name)
    req = ChatRequest(
        messages=tuple(Message(role=m["role"], content=m["content"]) for m in rec["messages"]),
        json_schema=rec["schema"],
        temperature=0.0,
        max_tokens=256,
        seed=0,
    )
    t = time.perf_counter()
    resp = asyncio.run(model.complete(req))
    wall = time.perf_counter() - t
    model.close()
    reply = json.loads(resp.text)
    keys = [k for k in rec["truth"]]
    return {
        "trace": str(trace),
        "question": rec["question"],
        "truth": rec["truth"],
        "reply": resp.text,
        "finish_reason": resp.finish_reason,
        "usage": resp.usage.to_dict(),
        "correct": all(str(reply.get(k, "")).strip().lower() == str(rec["truth"][k]).lower() for k in keys),
        "wall_s_n_threads_1": round(wall, 1),
        "model_name": model.name,
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m evals.bench.check_gguf", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="registry name (remem_agent.adapters.gguf)")
    ap.add_argument("--out", default="results/llm_study_1_5b/model_check.json")
    a = ap.parse_args(argv)
    path = local_model(cast(LocalModelName, a.model))  # joins and verifies the registry's sha256
    res = {
        "model": a.model,
        "file": path.name,
        "size": path.stat().st_size,
        "sha256": sha256(path),
        "header": header(path),
        "metadata": metadata(path),
        "ask": probe_ask(path, path.stem),
    }
    write_json(a.out, res)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
