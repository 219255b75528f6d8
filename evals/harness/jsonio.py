"""JSON output of every evaluation script: strict JSON, with ``null`` where a number is undefined.

Python's ``json`` writes ``NaN`` and ``Infinity`` for non-finite floats, which is not JSON (a strict parser,
``jq`` or JavaScript rejects the file). Estimates over one sample have no interval (``nan``), and a rate
over no tasks has no value; :func:`finite` turns such numbers into ``None`` before encoding, and the
encoder runs with ``allow_nan=False`` so that nothing non-finite slips through.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def finite(obj: object) -> object:
    """``obj`` with every non-finite float (also numpy floats) replaced by None, in dicts, lists and tuples."""
    if isinstance(obj, float | np.floating):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(
    obj: object,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    separators: tuple[str, str] | None = None,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """``json.dumps`` of :func:`finite` (obj), strict: a non-finite number left anywhere raises ValueError."""
    return json.dumps(
        finite(obj), indent=indent, sort_keys=sort_keys, separators=separators, default=default, allow_nan=False
    )


def write_json(
    path: str | Path,
    obj: object,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
    newline: bool = True,
    atomic: bool = False,
) -> Path:
    """Write ``obj`` as strict JSON (see :func:`dumps`) to ``path``, creating its folder.

    ``newline`` ends the file with a line break; ``atomic`` writes a sibling ``.tmp`` file and renames it,
    so a killed run never leaves a half-written result.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps(obj, indent=indent, sort_keys=sort_keys, default=default) + ("\n" if newline else "")
    if not atomic:
        path.write_text(text, encoding="utf-8")
        return path
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
