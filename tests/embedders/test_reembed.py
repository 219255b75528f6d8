"""``remem reembed``: a store moves to another embedder with its whole history, on real SQLite files and the
real ONNX MiniLM; and ``ReMem(path)`` without an embedder reopens a store with the one it was built with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remem_agent import ReMem
from remem_agent.cli import main
from remem_agent.embedders.onnx import ONNX_MINILM_NAME, onnx_available
from remem_agent.errors import UserInputError
from remem_agent.store.copy import copy_store

pytestmark = pytest.mark.skipif(not onnx_available(), reason="the onnx extra and its model package")

DAY = 86_400.0


def _hash_store(folder: Path) -> dict[str, str]:
    with ReMem(folder) as mem:
        assert mem.embedder.name.startswith("hash-")
        ids = {
            "east": mem.add("Our server is in east-1.", entity="server", attribute="region", timestamp=0),
            "west": mem.add("Our server moved to west-2.", entity="server", attribute="region", timestamp=7 * DAY),
            "lunch": mem.add("The team lunch is on Friday.", role="note", timestamp=0),
        }
        res = mem.search("Where is our server?", now=8 * DAY)
        mem.feedback(res.search_id, success=True, used_ids=[ids["west"]])
    return ids


def test_a_hash_store_moved_to_onnx_keeps_its_history_and_answers_as_of_alike(tmp_path: Path) -> None:
    src, dst = tmp_path / "hash", tmp_path / "onnx"
    ids = _hash_store(src)
    with ReMem(src) as before:
        old_as_of = before.search("Where is our server?", as_of=3 * DAY).items[0].id
        old_info = before.inspect(ids["east"])
        old_stats = before.stats()
    assert main(["reembed", str(src), str(dst), "--embedder", "onnx"]) == 0

    with ReMem(dst) as moved:  # no embedder given: the one the store records now
        assert moved.embedder.name == ONNX_MINILM_NAME and moved.dim == 384
        assert moved.verify().ok
        stats = moved.stats()
        assert (stats.memories, stats.events, stats.searches, stats.feedbacks) == (
            old_stats.memories,
            old_stats.events,
            old_stats.searches,
            old_stats.feedbacks,
        )
        assert moved.search("Where is our server?", as_of=3 * DAY).items[0].id == old_as_of == ids["east"]
        assert moved.search("Where is our server?", now=9 * DAY).items[0].id == ids["west"]
        info = moved.inspect(ids["east"])
        assert info.history == old_info.history and info.credits == old_info.credits
        assert info.memory.superseded_by == ids["west"] and info.memory.valid_to == old_info.memory.valid_to
        assert json.loads(moved.store.get_meta("reembedded_from") or "{}") == {
            "embedder": old_stats.embedder,
            "dim": old_stats.dim,
        }
    with ReMem(src) as untouched:  # the source is only read
        assert untouched.embedder.name == old_stats.embedder and untouched.verify().ok


def test_a_store_refuses_another_embedder_and_names_the_way_to_move_it(tmp_path: Path) -> None:
    _hash_store(tmp_path / "s")
    with pytest.raises(UserInputError, match="remem reembed"):
        ReMem(tmp_path / "s", embedder="onnx")
    with ReMem(tmp_path / "s", embedder="hash") as mem:  # the same one, by name
        assert mem.stats().memories == 3


def test_reembed_refuses_a_target_that_is_not_empty_and_writes_nothing(tmp_path: Path) -> None:
    _hash_store(tmp_path / "a")
    _hash_store(tmp_path / "b")
    with ReMem(tmp_path / "b") as b:
        before = b.stats()
    from remem_agent.embedders.registry import make_embedder

    with pytest.raises(UserInputError, match="not empty"):
        copy_store(tmp_path / "a", tmp_path / "b", embedder=make_embedder("onnx"))
    with ReMem(tmp_path / "b") as b:
        assert b.stats() == before
    with pytest.raises(SystemExit):  # an unknown embedder name is refused by the command line itself
        main(["reembed", str(tmp_path / "a"), str(tmp_path / "c"), "--embedder", "word2vec"])
    assert not (tmp_path / "c").exists()


def test_a_new_store_gets_the_hash_embedder_unless_told_otherwise(tmp_path: Path) -> None:
    with ReMem(tmp_path / "plain") as mem:
        assert mem.embedder.name.startswith("hash-")
    with ReMem(tmp_path / "real", new_store_embedder="minilm") as mem:
        assert mem.embedder.name == ONNX_MINILM_NAME
        mem.add("x is y.")
    with ReMem(tmp_path / "real") as again:  # reopened with what it recorded, not the hash default
        assert again.embedder.name == ONNX_MINILM_NAME
    with pytest.raises(UserInputError, match="unknown embedder"):
        ReMem(tmp_path / "bad", embedder="word2vec")
