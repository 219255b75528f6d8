"""Enforce: parse the model's reply and validate it against the extended answer schema.

A reply is accepted only when it parses as one JSON object, validates against the schema (which
includes the bounded ``citations`` of served ids) and was not truncated. Otherwise the errors are
returned so the middleware can re-ask with them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


@dataclass(frozen=True)
class Checked:
    """The outcome of checking one reply."""

    value: dict[str, Any] | None
    citations: tuple[str, ...] = ()
    errors: tuple[str, ...] = field(default_factory=tuple)
    kind: str = "ok"  # ok | invalid_json | schema | unknown_citation | truncated

    @property
    def ok(self) -> bool:
        return not self.errors


def _extract_json(text: str) -> Any:
    m = _FENCE.match(text)
    body = m.group(1) if m else text.strip()
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        # tolerate prose around one object: take the outermost {...}
        start, end = body.find("{"), body.rfind("}")
        if start != -1 and end > start:
            return json.loads(body[start : end + 1])
        raise


def _without_repeated_citations(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop repeats of a cited id (keeping the first), so ``uniqueItems`` does not reject the answer.

    Citing a memory twice says nothing more than citing it once, and llama.cpp's grammar cannot
    enforce ``uniqueItems``: small models sometimes repeat an id, which cost whole answers before.
    """
    cites = obj.get("citations")
    if not isinstance(cites, list):
        return obj
    seen: set[str] = set()
    kept: list[Any] = []
    for c in cites:
        if isinstance(c, str):
            if c in seen:
                continue
            seen.add(c)
        kept.append(c)
    return obj if len(kept) == len(cites) else {**obj, "citations": kept}


def check_reply(text: str, schema: Mapping[str, Any], served_ids: Sequence[str], *, truncated: bool) -> Checked:
    """Check one reply; ``served_ids`` are the citable keys (``MemoryAgent`` passes its per-ask aliases)."""
    if truncated:
        return Checked(None, (), ("the reply was cut off (maximum length reached); answer more briefly",), "truncated")
    try:
        obj = _extract_json(text)
    except (json.JSONDecodeError, ValueError) as exc:
        return Checked(None, (), (f"not valid JSON: {exc}",), "invalid_json")
    if not isinstance(obj, dict):
        return Checked(None, (), (f"expected a JSON object, got {type(obj).__name__}",), "schema")
    served = set(served_ids)
    obj = _without_repeated_citations(obj)
    cites = obj.get("citations")
    unknown = [c for c in cites if isinstance(c, str) and c not in served] if isinstance(cites, list) else []
    if unknown:
        return Checked(
            None,
            (),
            (f"citations {unknown} are not labels of the memories provided: {list(dict.fromkeys(served_ids))}",),
            "unknown_citation",
        )
    errors = [
        f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in sorted(Draft202012Validator(dict(schema)).iter_errors(obj), key=lambda e: list(e.absolute_path))
    ]
    if errors:
        return Checked(None, (), tuple(errors), "schema")
    value = {k: v for k, v in obj.items() if k != "citations"}
    return Checked(value, tuple(obj.get("citations", [])), ())
