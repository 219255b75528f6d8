"""Every ledger table of a store, row for row, as portable values: what two stores are compared by when they
must hold the same ledger (the batched-insert and key-prefetch tests)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from remem_agent import ReMem
from remem_agent.store.copy import TABLES, export_rows


def plain(value: Any) -> Any:
    """A column value both backends give alike: vectors as float32 bytes, floats by repr, JSON sorted."""
    if isinstance(value, np.ndarray):
        return value.astype(np.float32).tobytes().hex()
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)  # jsonb does not keep the order of a mapping's keys
    return value


def dump_ledger(mem: ReMem) -> dict[str, list[Any]]:
    """Every ledger table, row for row, as portable values (the export of `remem migrate`)."""
    with mem.store.read() as tx:
        return {t: [tuple(plain(v) for v in r) for rows in export_rows(tx, t) for r in rows] for t in TABLES}
