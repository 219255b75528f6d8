"""Who is calling, and which memory scope a request reads and writes.

* Keys: ``Authorization: Bearer KEY`` is required as soon as keys are configured; each key is granted a list
  of scope patterns (exact, or a prefix ending in ``*``). Keys are compared in constant time and only ever
  shown as :func:`key_id` (a short hash) in logs.
* Scope: :func:`request_scope` is the ONE place a request's scope is computed, from ``x-remem-user``,
  ``x-remem-agent`` or the OpenAI body field ``user``: ``user:alice``, ``user:alice/agent:ops``,
  ``agent:ops``; with neither, the key's single exact scope if it has exactly one, else ``default``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

from remem_agent.errors import UserInputError

DEFAULT_SCOPE = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")
_SEGMENT = re.compile(r"^[a-z]{1,16}:[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")


def valid_scope(scope: str) -> bool:
    if scope == DEFAULT_SCOPE:
        return True
    parts = scope.split("/")
    return 0 < len(parts) <= 4 and all(_SEGMENT.match(p) for p in parts)


def check_pattern(pattern: str, where: str) -> str:
    """A scope pattern of an API-key file: ``*``, a scope, or a scope prefix followed by ``*``."""
    if pattern == "*" or valid_scope(pattern):
        return pattern
    if pattern.endswith("*") and re.match(r"^[a-z]{1,16}:[A-Za-z0-9._@+:/-]*\*$", pattern):
        return pattern
    raise UserInputError(f"{where}: {pattern!r} is not a scope pattern (like 'user:alice', 'user:alice/*' or '*')")


def key_id(key: str) -> str:
    """A key as it may appear in logs: the first 12 hex digits of its SHA-256."""
    return "k_" + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: its key's id (None without keys) and the scope patterns it was granted."""

    key_id: str | None
    patterns: tuple[str, ...]

    def may(self, scope: str) -> bool:
        return any(p == scope or (p.endswith("*") and scope.startswith(p[:-1])) for p in self.patterns)


ANYONE = Caller(None, ("*",))  # no keys configured (loopback only): every scope


class ApiKeys:
    """The configured keys. ``authenticate`` returns the :class:`Caller`, or None for a missing/unknown key."""

    def __init__(self, keys: Mapping[str, tuple[str, ...]]) -> None:
        self._keys = [(k.encode(), key_id(k), tuple(v)) for k, v in keys.items()]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def secrets(self) -> tuple[str, ...]:
        """The keys themselves, for the trace writer's redaction (never for printing)."""
        return tuple(k.decode() for k, _, _ in self._keys)

    def authenticate(self, authorization: str | None) -> Caller | None:
        if not self._keys:
            return ANYONE
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        given = token.strip().encode()
        found: Caller | None = None
        for key, kid, patterns in self._keys:  # no early exit: the time does not depend on which key matched
            if hmac.compare_digest(key, given):
                found = Caller(kid, patterns)
        return found


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise UserInputError(
            f"{what} must be 1-64 characters: letters, digits and . _ @ + - (starting with a letter or digit)"
        )
    return value


def request_scope(headers: Mapping[str, str], body_user: object, caller: Caller) -> str:
    """The memory scope of one request (see the module doc). Bad names are a ``UserInputError`` (400)."""
    user = headers.get("x-remem-user") or (body_user if body_user not in (None, "") else None)
    agent = headers.get("x-remem-agent") or None
    if user is not None:
        scope = f"user:{_name(user, 'the user (x-remem-user or the body field user)')}"
        if agent is not None:
            scope += f"/agent:{_name(agent, 'x-remem-agent')}"
        return scope
    if agent is not None:
        return f"agent:{_name(agent, 'x-remem-agent')}"
    exact = [p for p in caller.patterns if not p.endswith("*")]
    return exact[0] if len(exact) == 1 and len(caller.patterns) == 1 else DEFAULT_SCOPE
