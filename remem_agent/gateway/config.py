"""Gateway configuration: what to serve, where, for whom, within which limits.

:class:`GatewayConfig` is a frozen dataclass that round-trips through JSON (``to_env``/``from_env``), so
``remem serve --workers N`` hands the same configuration to every uvicorn worker process through one
environment variable. It never holds a secret: the upstream API key is read from the environment variable
named by ``upstream_api_key_env`` when the upstream adapter is built, and API keys are read from
``api_keys`` (a file path) by :func:`load_api_keys`.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from remem_agent.agent.trace_rotation import TraceRotation
from remem_agent.errors import UserInputError
from remem_agent.store.pruning import GrowthLimits

UpstreamKind = Literal["openai", "ollama"]
ENV_CONFIG = "REMEM_GATEWAY_CONFIG"
DEFAULT_PORT = 8765


class GatewayConfigError(UserInputError):
    """The gateway cannot start with this configuration (the message says what to change)."""


@dataclass(frozen=True)
class Limits:
    """Bounds on what one request may cost. ``max_concurrency`` requests run at once; up to ``max_queue``
    more wait; beyond that the gateway answers 429 with ``Retry-After: retry_after_s``."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 256
    max_stream_seconds: float = 300.0
    max_concurrency: int = 32
    max_queue: int = 64
    queue_timeout_s: float = 10.0
    retry_after_s: int = 1


@dataclass(frozen=True)
class GatewayConfig:
    """Everything ``remem serve`` needs. See ``remem serve --help`` for each option."""

    store: str = "remem_store"
    upstream: str | None = None  # base URL of an OpenAI-compatible API (with /v1) or an Ollama server
    upstream_kind: UpstreamKind = "openai"
    upstream_api_key_env: str = "OPENAI_API_KEY"  # the variable's *name*; its value is never stored here
    upstream_timeout_s: float = 60.0
    model: str = "qwen"  # local model when there is no upstream: qwen | smollm2 | a .gguf path
    models: tuple[str, ...] = ()  # model names served (empty: the upstream's own list, or the local model)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_keys: str | None = None  # path of a JSON/YAML mapping key -> [scopes]
    workers: int = 1
    # A name of remem_agent.embedders.registry (EMBEDDER_NAMES or an alias) for a new store; None: minilm when it
    # is installed, else hash. An existing store always keeps the embedder it was built with.
    embedder: str | None = None
    trace: str | None = None  # JSONL path; None: <store folder>/traces/gateway-<pid>.jsonl; "off": none
    k: int = 5
    token_budget: int | None = None
    strip_citations: bool = False
    # A user turn correcting the previous answer with a value ("No, it's Lisbon") is also stored as the fact that
    # replaces the one the answer cited, in the caller's scope (remem_agent/agent/corrections.py).
    capture_corrections: bool = False
    # The abstain gate (RememConfig(abstain="null")): a request for which the store holds nothing more similar
    # than unrelated text gets no memory block, and the reply says so (x-remem-abstained, remem.abstained).
    abstain: bool = False
    otel: bool = False  # OpenTelemetry spans per chat turn (extra otel; the global tracer provider)
    retry_attempts: int = 3
    retry_max_wait_s: float = 10.0
    # Responses protocol: how long a stored response can be continued (previous_response_id); 0: never stored
    response_retention_s: float = 30 * 86_400.0
    # Bounded growth (remem_agent/store/pruning.py): an answer with no verdict after answer_ttl_s expires (no
    # outcome); unjudged searches and settled or expired answers older than retention_s are deleted, learning
    # kept. Each worker sweeps every sweep_interval_s. None: never (the store then grows with every request).
    answer_ttl_s: float | None = 7 * 86_400.0
    retention_s: float | None = 30 * 86_400.0
    sweep_interval_s: float = 3_600.0
    # Trace files (remem_agent/agent/trace_rotation.py): archived at trace_max_bytes or trace_max_age_s, and
    # archives trimmed to trace_keep_bytes in all and trace_keep_days of age. None: no limit of that kind.
    trace_max_bytes: int | None = 64 * 1024 * 1024
    trace_max_age_s: float | None = 86_400.0
    trace_keep_bytes: int | None = 1024 * 1024 * 1024
    trace_keep_days: float | None = 30.0
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        try:
            GrowthLimits(answer_ttl_s=self.answer_ttl_s, retention_s=self.retention_s)
            self.trace_rotation()
        except UserInputError as exc:
            raise GatewayConfigError(str(exc)) from exc
        s = self.sweep_interval_s
        if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s) or s <= 0:
            raise GatewayConfigError(f"sweep_interval_s must be a positive number of seconds, got {s!r}")

    def growth_limits(self) -> GrowthLimits:
        return GrowthLimits(answer_ttl_s=self.answer_ttl_s, retention_s=self.retention_s)

    def trace_rotation(self) -> TraceRotation:
        return TraceRotation(
            max_bytes=self.trace_max_bytes,
            max_age_s=self.trace_max_age_s,
            keep_bytes=self.trace_keep_bytes,
            keep_days=self.trace_keep_days,
        )

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> GatewayConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise GatewayConfigError(f"unknown gateway settings: {unknown}")
        values = dict(data)
        if isinstance(values.get("limits"), Mapping):
            values["limits"] = Limits(**values["limits"])
        if "models" in values:
            values["models"] = tuple(values["models"] or ())
        return cls(**values)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewayConfig:
        raw = (os.environ if env is None else env).get(ENV_CONFIG)
        if not raw:
            raise GatewayConfigError(f"{ENV_CONFIG} is not set (remem serve sets it for its workers)")
        return cls.from_mapping(json.loads(raw))


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; anything else (0.0.0.0, a LAN address) is reachable."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(config: GatewayConfig, keys: Mapping[str, tuple[str, ...]] | None) -> None:
    """Refuse a reachable address without API keys: anyone on the network could read and write the memory."""
    if not is_loopback(config.host) and not keys:
        raise GatewayConfigError(
            f"refusing to listen on {config.host}: a non-loopback address needs API keys "
            "(--api-keys FILE, a JSON/YAML mapping key -> [scopes]); or bind 127.0.0.1"
        )


def load_api_keys(path: str | os.PathLike[str] | None) -> dict[str, tuple[str, ...]]:
    """``{key: (scope pattern, ...)}`` from a JSON or YAML file; a pattern may end in ``*`` (prefix wildcard).

    Example (YAML)::

        sk-alice-1f3c...: ["user:alice", "user:alice/agent:*"]
        sk-admin-9a0b...: ["*"]
    """
    if path is None:
        return {}
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise GatewayConfigError(f"cannot read the API-key file {p}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise GatewayConfigError(f"the API-key file {p} is not valid JSON/YAML") from exc
    if not isinstance(data, Mapping) or not data:
        raise GatewayConfigError(f"the API-key file {p} must be a non-empty mapping key -> list of scopes")
    out: dict[str, tuple[str, ...]] = {}
    for n, (key, scopes) in enumerate(data.items(), 1):
        # Never put a key into a message: say which entry is wrong by its position.
        if not isinstance(key, str) or len(key) < 16 or any(c.isspace() for c in key):
            raise GatewayConfigError(f"{p}: key #{n} must be a string of at least 16 characters without blanks")
        if isinstance(scopes, str):
            scopes = [scopes]
        if not isinstance(scopes, list) or not scopes or not all(isinstance(s, str) and s for s in scopes):
            raise GatewayConfigError(f"{p}: key #{n} must map to a non-empty list of scope patterns")
        from remem_agent.gateway.auth import check_pattern

        out[key] = tuple(check_pattern(s, f"{p}: key #{n}") for s in scopes)
    return out
