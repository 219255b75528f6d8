"""Trace: one JSON line per ``ask`` or chat call (and one per late outcome), for failure analysis.

Two versions live side by side and :func:`load_traces` reads both: version 1 lines come from
``MemoryAgent.ask`` (``TRACE_SCHEMA``); version 2 lines have a ``kind``: ``"chat"`` for one call of
``MemoryAgent.chat``/``chat_stream`` (``CHAT_TRACE_SCHEMA``), ``"outcome"`` for a verdict that arrived
after the reply (``OUTCOME_TRACE_SCHEMA``: explicit, inferred from the next user turn, or a judge's) and
``"capture"`` for facts captured from a user turn in the background (``CAPTURE_TRACE_SCHEMA``).

Version 1 line schema (``TRACE_SCHEMA`` below is the machine-checkable form)::

    {"v": 1, "ts": ISO-8601, "run": str, "answer_id": str, "task_id": str|null, "task": str|null,
     "question": str, "system": str|null,
     "model": {"adapter": str, "name": str, "params": {"temperature": .., "max_tokens": .., "seed": ..}},
     "search_id": str|null,
     "served": [{"id", "rank", "score", "similarity", "state", "text"}],
     "aliases": {alias: id},                       # optional: the per-ask citation labels shown to the
                                                   # model ("M1" -> served id); absent in older traces
     "schema": {...the extended answer schema...},  # its citations enum holds the aliases (or old: ids)
     "messages": [{"role", "content"}],            # exactly what was sent first
     "attempts": [{"raw": str|null, "finish_reason": str|null, "errors": [str], "kind": str,
                   "latency_ms": float, "usage": {...}, "retries": [{"attempt", "status", "error", "wait_s"}]}],
     "answer": {...}|null, "citations": [str],     # memory ids (aliases already mapped back)
     "error": str|null,
     "outcome": {"success", "source", "score", "weight"}|null, "truth": any,
     "credit": {id: credit}, "blame": {id: blame},
     "latency_ms": {"recall": .., "model": .., "learn": .., "total": ..}}

API keys and authorization headers never appear: secrets are redacted before writing.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from jsonschema import Draft202012Validator

from remem_agent import trace_io
from remem_agent.agent import trace_rotation
from remem_agent.agent.trace_rotation import TraceRotation
from remem_agent.errors import UserInputError

TRACE_VERSION = 1

TRACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "v",
        "ts",
        "run",
        "answer_id",
        "task",
        "question",
        "model",
        "served",
        "messages",
        "attempts",
        "answer",
        "citations",
        "outcome",
        "latency_ms",
    ],
    "properties": {
        "v": {"const": TRACE_VERSION},
        "ts": {"type": "string"},
        "run": {"type": "string"},
        "answer_id": {"type": "string"},
        "task_id": {"type": ["string", "null"]},
        "task": {"type": ["string", "null"]},
        "question": {"type": "string"},
        "model": {"type": "object", "required": ["adapter", "name"]},
        "search_id": {"type": ["string", "null"]},
        "served": {
            "type": "array",
            "items": {"type": "object", "required": ["id", "rank", "score", "similarity", "state"]},
        },
        "aliases": {"type": "object", "additionalProperties": {"type": "string"}},
        "messages": {"type": "array", "items": {"type": "object", "required": ["role", "content"]}},
        "attempts": {
            "type": "array",
            "items": {"type": "object", "required": ["raw", "errors", "kind", "latency_ms"]},
        },
        "answer": {"type": ["object", "null"]},
        "citations": {"type": "array", "items": {"type": "string"}},
        "error": {"type": ["string", "null"]},
        "outcome": {"type": ["object", "null"]},
        "latency_ms": {"type": "object"},
    },
}
CHAT_TRACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "v", "kind", "ts", "run", "answer_id", "conversation_id", "turn", "model", "served", "aliases",
        "recalled", "messages", "reply", "citations", "error", "latency_ms",
    ],
    "properties": {
        "v": {"const": 2},
        "kind": {"const": "chat"},
        "ts": {"type": "string"},
        "run": {"type": "string"},
        "answer_id": {"type": "string"},
        "conversation_id": {"type": "string"},
        "turn": {"type": "integer"},  # index of the latest user message in the conversation
        "task": {"type": ["string", "null"]},
        "model": {"type": "object", "required": ["adapter", "name"]},
        "search_id": {"type": ["string", "null"]},
        "recall_query": {"type": ["string", "null"]},
        "recalled": {"type": "boolean"},  # False: a tool-loop call of a turn reuses the turn's recall
        "abstained": {"type": "boolean"},  # the abstain gate found nothing relevant: nothing was injected
        "served": {"type": "array", "items": {"type": "object", "required": ["id", "rank", "score", "state"]}},
        "aliases": {"type": "object", "additionalProperties": {"type": "string"}},
        "messages": {"type": "array", "items": {"type": "object", "required": ["role", "content"]}},
        "memory_block": {"type": ["string", "null"]},
        "tools": {"type": "array", "items": {"type": "string"}},
        "stream": {"type": "boolean"},
        "reply": {
            "type": "object",
            "required": ["text", "tool_calls", "finish_reason"],
            "properties": {"text": {"type": "string"}, "tool_calls": {"type": "array"}},
        },
        "citations": {"type": "array", "items": {"type": "string"}},
        "unknown_citations": {"type": "array", "items": {"type": "string"}},
        "used": {"type": "array", "items": {"type": "string"}},
        "error": {"type": ["string", "null"]},
        "latency_ms": {"type": "object"},
    },
}  # fmt: skip

OUTCOME_TRACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["v", "kind", "ts", "run", "answer_id", "search_id", "outcome"],
    "properties": {
        "v": {"const": 2},
        "kind": {"const": "outcome"},
        "ts": {"type": "string"},
        "run": {"type": "string"},
        "answer_id": {"type": "string"},
        "conversation_id": {"type": ["string", "null"]},
        "search_id": {"type": "string"},
        "outcome": {
            "type": "object",
            "required": ["success", "source", "weight"],
            "properties": {"source": {"enum": ["user", "inferred", "judge"]}},
        },
        "reason": {"type": ["string", "null"]},
        "heuristic": {"type": ["object", "null"]},  # what the next-turn rules said
        "judge": {"type": ["object", "null"]},  # what the judge said, when one is configured
        "credit": {"type": "object"},
        "blame": {"type": "object"},
        "after_s": {"type": ["number", "null"]},  # seconds from the reply to the verdict
    },
}

CAPTURE_TRACE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["v", "kind", "ts", "run", "answer_id", "conversation_id", "memories", "error"],
    "properties": {
        "v": {"const": 2},
        "kind": {"const": "capture"},
        "memories": {"type": "array", "items": {"type": "string"}},  # ids the captured facts were stored as
        "error": {"type": ["string", "null"]},
    },
}

_VALIDATOR = Draft202012Validator(TRACE_SCHEMA)
_VALIDATORS_V2 = {
    "chat": Draft202012Validator(CHAT_TRACE_SCHEMA),
    "outcome": Draft202012Validator(OUTCOME_TRACE_SCHEMA),
    "capture": Draft202012Validator(CAPTURE_TRACE_SCHEMA),
}


def _schema_errors(rec: Any) -> list[str]:
    """Why ``rec`` is not a valid trace line of any version (empty when it is one)."""
    if isinstance(rec, dict) and rec.get("v") == 2:
        validator = _VALIDATORS_V2.get(rec.get("kind"))  # type: ignore[arg-type]
        if validator is None:
            return [f"unknown v2 trace kind {rec.get('kind')!r}"]
        return [e.message for e in validator.iter_errors(rec)]
    return [e.message for e in _VALIDATOR.iter_errors(rec)]


@dataclass(kw_only=True)
class AttemptRecord:
    """One model call of an ask (the first, or a re-ask): what came back and how enforcement judged it.

    Mutable on purpose: the call stage fills it in as the call proceeds, so a call that raises still
    leaves a record of what happened (its retries, its latency) for the trace.
    """

    raw: str | None = None
    finish_reason: str | None = None
    errors: list[str] = field(default_factory=list)
    kind: str = "model_error"  # ok | invalid_json | schema | unknown_citation | truncated | model_error
    latency_ms: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict)
    retries: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "raw": self.raw,
            "finish_reason": self.finish_reason,
            "errors": list(self.errors),
            "kind": self.kind,
            "latency_ms": self.latency_ms,
            "usage": dict(self.usage),
            "retries": list(self.retries),
        }


@dataclass(frozen=True, kw_only=True)
class TraceRecord:
    """One trace line of ``MemoryAgent.ask``, typed; :meth:`to_dict` gives the v1 line ``TRACE_SCHEMA`` checks."""

    ts: str
    run: str
    answer_id: str
    task_id: str | None
    task: str | None
    question: str
    system: str | None
    model: Mapping[str, Any]
    search_id: str | None
    served: Sequence[Mapping[str, Any]]
    aliases: Mapping[str, str]
    schema: Mapping[str, Any]
    messages: Sequence[Mapping[str, Any]]
    attempts: Sequence[AttemptRecord]
    answer: Mapping[str, Any] | None = None
    citations: Sequence[str] = ()
    error: str | None = None
    outcome: Mapping[str, Any] | None = None
    truth: Any = None
    credit: Mapping[str, float] = field(default_factory=dict)
    blame: Mapping[str, float] = field(default_factory=dict)
    latency_ms: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": TRACE_VERSION,
            "ts": self.ts,
            "run": self.run,
            "answer_id": self.answer_id,
            "task_id": self.task_id,
            "task": self.task,
            "question": self.question,
            "system": self.system,
            "model": dict(self.model),
            "search_id": self.search_id,
            "served": [dict(s) for s in self.served],
            "aliases": dict(self.aliases),
            "schema": dict(self.schema),
            "messages": [dict(m) for m in self.messages],
            "attempts": [a.to_dict() for a in self.attempts],
            "answer": None if self.answer is None else dict(self.answer),
            "citations": list(self.citations),
            "error": self.error,
            "outcome": None if self.outcome is None else dict(self.outcome),
            "truth": self.truth,
            "credit": dict(self.credit),
            "blame": dict(self.blame),
            "latency_ms": dict(self.latency_ms),
        }


_SECRET_KEYS = re.compile(r"(authorization|api[_-]?key|x-api-key|password|secret|bearer)", re.IGNORECASE)
_SECRET_VALUES = [
    re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"),  # OpenAI and most OpenAI-compatible services
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._\-]{8,}"),
    re.compile(r"\b(?:gsk|xai|ghp|gho|github_pat|hf|glpat|pplx)_[A-Za-z0-9_\-]{16,}"),  # Groq, xAI, GitHub, HF, ...
    re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"),  # Slack
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}"),  # Google API key
]
# Every pattern above in one alternation: a string it does not match is matched by none of them (each
# alternative is a pattern itself), so the patterns only run, in order, on strings that may hold a secret.
_ANY_SECRET_VALUE = re.compile(
    "|".join(
        f"(?i:{p.pattern.removeprefix('(?i)')})" if p.flags & re.IGNORECASE else f"(?:{p.pattern})"
        for p in _SECRET_VALUES
    )
)


# What a JSON line must contain for ``redact`` to change anything in it (a superset, checked on the line as
# json.dumps(ensure_ascii=False) writes it, which escapes only quotes, backslashes and control characters):
# * a key or value the case-insensitive _SECRET_KEYS or the bearer pattern matches holds one of these words,
#   lower-cased, once the four non-ASCII letters that re.IGNORECASE equates with ASCII ones are mapped to them;
# * a value the other _SECRET_VALUES match starts with one of these literals (their characters are never escaped);
# * a given secret S inside a string reads as _json_escaped(S) in the line, an escaped S as its escape again.
_SUSPECT_WORDS = ("authorization", "apikey", "api_key", "api-key", "password", "secret", "bearer")
_SUSPECT_TOKENS = (
    "sk-", "gsk_", "xai_", "ghp_", "gho_", "github_pat_", "hf_", "glpat_", "pplx_", "xox", "AKIA", "AIza"
)  # fmt: skip
_IGNORECASE_ASCII = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})


def _may_hold_secret(line: str, secrets: Sequence[str]) -> bool:
    """False only when ``redact(record, secrets)`` would leave the record whose JSON line this is unchanged."""
    if any(t in line for t in _SUSPECT_TOKENS):
        return True
    if "\\\\" in line or _URL_ESCAPE.search(line):  # a string holds a backslash or a %XX: it may decode
        return True
    low = (line if line.isascii() else line.translate(_IGNORECASE_ASCII)).lower()
    if any(w in low for w in _SUSPECT_WORDS):
        return True
    return any(_json_escaped(s) in line or _json_escaped(_json_escaped(s)) in line for s in secrets)


def _plain(obj: object) -> object:
    """json.dumps's ``default`` for a record not passed through ``redact``: what ``redact`` would have made of
    ``obj`` before json.dumps(default=str) saw it (a Mapping that is no dict becomes one; the rest ``str``)."""
    return dict(obj) if isinstance(obj, Mapping) else str(obj)


@runtime_checkable
class HasSecrets(Protocol):
    """An adapter that knows its credentials, so traces can redact them by value (whatever their shape)."""

    @property
    def secrets(self) -> tuple[str, ...]: ...


def redact(obj: Any, secrets: tuple[str, ...] = ()) -> Any:
    """Copy ``obj`` with secret-looking keys and values replaced by "[REDACTED]"."""
    if isinstance(obj, Mapping):
        return {k: ("[REDACTED]" if _secret_key(k) else redact(v, secrets)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        s = obj
        if "\\" in s or "%" in s:  # an escaped secret is still one: match the decoded text, write it redacted
            decoded = _decoded(s)
            if decoded != s and _holds_secret(decoded, secrets):
                s = decoded
        for secret in secrets:
            if secret:  # as is, and as it reads inside JSON text (a model's raw reply, an echoed body)
                s = s.replace(secret, "[REDACTED]").replace(_json_escaped(secret), "[REDACTED]")
        if _ANY_SECRET_VALUE.search(s):  # one scan; most strings hold none, then no pattern runs
            for pat in _SECRET_VALUES:
                s = pat.sub("[REDACTED]", s)
        return s
    return obj


_JSON_ESCAPE = re.compile(r'\\(?:u([0-9a-fA-F]{4})|(["\\/bfnrt]))')
_JSON_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_URL_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_DECODE_ROUNDS = 3  # an escape of an escape of an escape: deeper nesting is not an echo of a key any more


def _unescape(m: re.Match[str]) -> str:
    return chr(int(m.group(1), 16)) if m.group(1) else _JSON_SIMPLE[m.group(2)]


def _decoded(text: str) -> str:
    """``text`` with its JSON escapes (``\\u0073``, ``\\"``) and URL encoding (``%73``) undone, a few rounds
    deep, so that a secret a server echoed in an encoded form is matched as what it is. Escaped surrogate pairs
    are joined; a lone surrogate becomes U+FFFD (the result is written to a UTF-8 file)."""
    out = text
    for _ in range(_DECODE_ROUNDS):
        before = out
        if "\\" in out:
            out = _JSON_ESCAPE.sub(_unescape, out)
        if "%" in out:
            out = urllib.parse.unquote(out, errors="replace")
        if out == before:
            break
    if out == text:
        return text
    return out.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _holds_secret(text: str, secrets: tuple[str, ...]) -> bool:
    """Whether ``text`` holds one of ``secrets`` or a value a secret pattern matches."""
    return any(secret and secret in text for secret in secrets) or bool(_ANY_SECRET_VALUE.search(text))


@functools.lru_cache(maxsize=4096)
def _secret_key(key: object) -> bool:
    """Whether a mapping key names a secret (trace records reuse a few hundred keys: decided once each)."""
    return bool(_SECRET_KEYS.search(str(key)))


@functools.lru_cache(maxsize=256)
def _json_escaped(secret: str) -> str:
    """``secret`` as it reads inside a JSON string (computed once per secret, not once per traced string)."""
    return json.dumps(secret, ensure_ascii=False)[1:-1]


class TraceWriter:
    """Appends trace lines to a JSONL file; safe for concurrent asks (one lock, one write per line).

    With ``rotation`` the file is archived by size and age and old archives are trimmed
    (:mod:`.trace_rotation`); without it the file grows as long as the writer writes."""

    def __init__(
        self, path: str | Path, *, secrets: tuple[str, ...] = (), rotation: TraceRotation | None = None
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._secrets = secrets
        self.rotation = rotation
        self._size, self._started = self._live_file()

    def _live_file(self) -> tuple[int, float]:
        """The live file's size and when it was started (its creation, or now for a new one)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return 0, time.time()
        return st.st_size, min(st.st_mtime, time.time())

    def add_secrets(self, secrets: Sequence[str]) -> None:
        """Also redact these values (a model's API key, say) from every later line."""
        self._secrets = tuple(dict.fromkeys([*self._secrets, *(s for s in secrets if s and len(s) >= 4)]))

    def line(self, record: Mapping[str, Any]) -> str:
        """The redacted JSON line of ``record`` (without its newline).

        Most records hold nothing to redact: their line is written as json.dumps makes it, once a scan of
        that line (:func:`_may_hold_secret`) rules out every key and value ``redact`` would replace; only
        the others are copied through ``redact`` first (walking a record with the value patterns on every
        string cost ~0.3 ms, ten times its encoding).
        """
        try:
            line: str | None = json.dumps(record, ensure_ascii=False, default=_plain)
        except (TypeError, ValueError):  # e.g. a key json cannot encode: the long way says what is wrong
            line = None
        if line is None or _may_hold_secret(line, self._secrets):
            line = json.dumps(redact(record, self._secrets), ensure_ascii=False, default=str)
        for secret in self._secrets:  # also as it appears once JSON-escaped (a key echoed inside a JSON string)
            line = line.replace(_json_escaped(secret), "[REDACTED]")
        return line

    def write_sync(self, record: Mapping[str, Any]) -> None:
        data = (self.line(record) + "\n").encode("utf-8")
        archived: Path | None = None
        with self._lock:  # one append per line (O_APPEND, under the file's lock: ``trace_io``)
            trace_io.append_line(self.path, data)
            self._size += len(data)
            if self.rotation is not None and self._due(self.rotation):
                archived = self._rotate_locked()
        if archived is not None and self.rotation is not None:  # compressed and trimmed outside the lock
            trace_rotation.compress(archived)
            trace_rotation.trim(self.path.parent, self.rotation)

    def _due(self, rotation: TraceRotation) -> bool:
        if rotation.max_bytes is not None and self._size >= rotation.max_bytes:
            return True
        return rotation.max_age_s is not None and time.time() - self._started >= rotation.max_age_s

    def _rotate_locked(self) -> Path | None:
        """Move the live file aside (the next line starts a new one); the archive's path, None if gone."""
        now = time.time()
        target = trace_rotation.archive_name(self.path, now)
        self._size, self._started = 0, now
        try:
            os.replace(self.path, target)
        except FileNotFoundError:  # removed by someone else: the next line starts a new file anyway
            return None
        return target

    async def write(self, record: Mapping[str, Any]) -> None:
        await asyncio.to_thread(self.write_sync, record)


def trace_kind(rec: Mapping[str, Any]) -> str:
    """``"ask"`` for a version 1 line, else the line's ``kind`` (``chat``, ``outcome``, ``capture``)."""
    return "ask" if rec.get("v") == 1 else str(rec.get("kind"))


def iter_traces(path: str | Path, *, strict: bool = True, kind: str | None = None) -> Iterator[dict[str, Any]]:
    """Yield trace records (only those of ``kind`` when given); with ``strict`` a malformed line raises
    UserInputError naming the line.

    A gzip-compressed trace (``NAME.jsonl.gz``) reads the same; so does ``NAME.jsonl`` when only its ``.gz``
    exists (archived traces are kept compressed)."""
    file = Path(path)
    if not file.exists() and Path(f"{file}.gz").exists():
        file = Path(f"{file}.gz")
    with gzip.open(file, "rt", encoding="utf-8") if file.suffix == ".gz" else file.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                if strict:
                    raise UserInputError(f"{path}:{n}: not JSON: {exc}") from exc
                continue
            errs = _schema_errors(rec)
            if errs:
                if strict:
                    raise UserInputError(f"{path}:{n}: not a trace line: {errs[0]}")
                continue
            if kind is None or trace_kind(rec) == kind:
                yield rec


def load_traces(path: str | Path, *, strict: bool = True, kind: str | None = None) -> list[dict[str, Any]]:
    return list(iter_traces(path, strict=strict, kind=kind))


def trace_stem(path: str | Path) -> str:
    """A trace file's name without ``.jsonl`` or ``.jsonl.gz`` (``contradiction_0_C``)."""
    return Path(str(path).removesuffix(".gz")).stem


def trace_files(folder: str | Path) -> list[Path]:
    """The trace files of ``folder`` (``*.jsonl`` and compressed ``*.jsonl.gz``), sorted by name."""
    root = Path(folder)
    return trace_io.files_of([root]) if root.is_dir() else []
