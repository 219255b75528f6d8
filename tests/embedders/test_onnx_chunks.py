"""OnnxEmbedder's batching plan (no model needed): length-sorted, near-equal chunks covering every index once."""

from __future__ import annotations

import random

from remem_agent.embedders.onnx import length_sorted_chunks


def test_chunks_cover_every_index_once_sorted_by_length_and_near_equal() -> None:
    rng = random.Random(3)
    for n in (1, 2, 15, 16, 17, 31, 100, 257):
        lengths = [rng.randint(1, 64) for _ in range(n)]
        for batch_size in (1, 3, 16, 32, 1000):
            chunks = length_sorted_chunks(lengths, batch_size)
            flat = [i for chunk in chunks for i in chunk]
            assert sorted(flat) == list(range(n))
            assert [lengths[i] for i in flat] == sorted(lengths)  # one ascending run across chunks
            sizes = [len(c) for c in chunks]
            assert max(sizes) <= batch_size and len(chunks) == -(-n // batch_size)
            assert max(sizes) - min(sizes) <= len(chunks)  # no small tail chunk: 100 at 32 is 25 x 4


def test_ties_keep_the_callers_order_and_empty_input_has_no_chunks() -> None:
    assert length_sorted_chunks([5, 3, 5, 3, 5], 16) == [[1, 3, 0, 2, 4]]
    assert length_sorted_chunks([2, 1, 2, 1], 2) == [[1, 3], [0, 2]]
    assert length_sorted_chunks([], 16) == []
    assert [len(c) for c in length_sorted_chunks([1] * 100, 32)] == [25, 25, 25, 25]
