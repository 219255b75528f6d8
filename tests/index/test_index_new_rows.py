"""``ReMem.add_many`` hands the rows it committed to the flat index itself instead of reading them back
(``Gather.ingest_new``). The index must end exactly as reading the ledger would build it (same rows in seq
order, vectors and scopes), and the shortcut must step aside whenever the index was behind the ledger
(another connection added rows) or the transaction's new seqs are not exactly its own inserts."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from remem_agent import MemoryInput, ReMem
from remem_agent.store.base import StoreCommon


def _index_state(mem: ReMem) -> tuple[list[str], np.ndarray, list[int]]:
    flat = mem._flat
    assert flat is not None
    n = len(flat)
    return list(flat._ids), flat._cols[:, :n].copy(), flat._group[:n].tolist()


def _facts(step: int) -> list[MemoryInput]:
    # keyed facts that supersede and restate each other, notes, and a second scope's rows
    return [
        MemoryInput(f"the region of svc{step % 3} is r{step}", entity=f"svc{step % 3}", attribute="region"),
        MemoryInput("the region of svc0 is r0", entity="svc0", attribute="region"),  # a restatement (no row)
        MemoryInput(f"note {step} about deploys", role="note"),
    ]


def test_the_index_equals_one_built_from_the_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "store"
    mem = ReMem(folder)
    reads: list[int] = []
    real = StoreCommon.scoped_embeddings_after

    def counting(self: StoreCommon, seq: int, dim: int) -> object:
        out = real(self, seq, dim)
        if self is mem.store:
            reads.append(len(out[1]))
        return out

    monkeypatch.setattr(StoreCommon, "scoped_embeddings_after", counting)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(6):
            mem.add_many(_facts(step))
            mem.add_many([f"bob's note {step}"], scope="bob")
    assert reads == []  # every batch was handed over, none read back

    other = ReMem(folder)  # another connection adds: this index is now behind the ledger
    other.add_many(["a row from elsewhere"])
    mem.add_many(["after the other connection"])
    assert reads == [2]  # the shortcut stepped aside: both rows were read from the ledger
    other.close()

    fresh = ReMem(folder)  # built entirely from the ledger
    fresh.search("deploys")
    got, want = _index_state(mem), _index_state(fresh)
    assert got[0] == want[0] and np.array_equal(got[1], want[1])
    codes_mem = {c: g for g, c in mem._flat._codes.items()}  # type: ignore[union-attr]
    codes_fresh = {c: g for g, c in fresh._flat._codes.items()}  # type: ignore[union-attr]
    assert [codes_mem[c] for c in got[2]] == [codes_fresh[c] for c in want[2]]
    assert mem._gather.seq == fresh._gather.seq == mem.store.max_seq()
    mem.close()
    fresh.close()
