"""evals.perf.peers gives a torch-based peer (mem0) the torch threads remem's own torch embedder uses."""

from __future__ import annotations

import pytest

from evals.perf.peers import pin_torch_threads


def test_the_peer_gets_remems_torch_default_and_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("REMEM_EMBED_THREADS", raising=False)
        assert pin_torch_threads() == 1 == torch.get_num_threads()
        monkeypatch.setenv("REMEM_EMBED_THREADS", "2")
        assert pin_torch_threads() == 2 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
