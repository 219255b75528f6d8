"""OpenAIEmbedder against an in-process httpx.MockTransport: no network."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from remem_agent.embedders.base import Embedder
from remem_agent.embedders.openai_compat import OpenAIEmbedder
from remem_agent.errors import EmbeddingError, ModelError, UserInputError

API_KEY = "sk-test-SECRET-4f9c1b2e7d"
BASE = "http://embed.test/v1"
DIM = 8

Handler = Callable[[httpx.Request], httpx.Response]


def vector_for(text: str, dim: int = DIM) -> list[float]:
    """A deterministic, text-dependent, non-normalised vector."""
    rng = np.random.default_rng(abs(hash(text)) % (2**32))
    return [float(x) for x in rng.normal(size=dim) * 3.0]


def ok_response(request: httpx.Request, *, dim: int = DIM, shuffle: bool = True) -> httpx.Response:
    payload = json.loads(request.content)
    rows = [
        {"object": "embedding", "index": i, "embedding": vector_for(t, dim)} for i, t in enumerate(payload["input"])
    ]
    if shuffle:
        random.Random(7).shuffle(rows)
    return httpx.Response(200, json={"object": "list", "data": rows, "model": payload["model"]})


class Recorder:
    """A scripted server: each request is answered by the next handler (the last one repeats)."""

    def __init__(self, *handlers: Handler) -> None:
        self.handlers = list(handlers)
        self.requests: list[httpx.Request] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
            handler = self.handlers[min(len(self.requests) - 1, len(self.handlers) - 1)]
        return handler(request)


def make(recorder: Recorder, sleeps: list[float] | None = None, **kwargs: object) -> OpenAIEmbedder:
    sleeps = sleeps if sleeps is not None else []
    return OpenAIEmbedder(
        "text-embedding-test",
        base_url=BASE,
        api_key=API_KEY,
        transport=httpx.MockTransport(recorder),
        sleep=sleeps.append,
        **kwargs,  # type: ignore[arg-type]
    )


def test_is_an_embedder_and_sends_the_expected_request() -> None:
    rec = Recorder(ok_response)
    emb = make(rec, dim=DIM)
    assert isinstance(emb, Embedder)
    assert emb.name == "openai:text-embedding-test"
    emb.embed(["a", "b"])
    (req,) = rec.requests
    assert req.method == "POST"
    assert str(req.url) == f"{BASE}/embeddings"
    assert req.headers["authorization"] == f"Bearer {API_KEY}"
    body = json.loads(req.content)
    assert body["model"] == "text-embedding-test"
    assert body["input"] == ["a", "b"]
    assert "dimensions" not in body


def test_success_with_shuffled_indices_is_reordered_and_normalised() -> None:
    rec = Recorder(ok_response)
    emb = make(rec)
    texts = [f"text number {i}" for i in range(10)]
    out = emb.embed(texts)
    assert out.dtype == np.float32
    assert out.shape == (10, DIM)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)
    for row, text in zip(out, texts, strict=True):
        expected = np.asarray(vector_for(text), dtype=np.float32)
        np.testing.assert_allclose(row, expected / np.linalg.norm(expected), atol=1e-6)


def test_batches_requests_and_keeps_order() -> None:
    rec = Recorder(ok_response)
    emb = make(rec, batch_size=3)
    texts = [f"t{i}" for i in range(7)]
    out = emb.embed(texts)
    assert [len(json.loads(r.content)["input"]) for r in rec.requests] == [3, 3, 1]
    expected = np.asarray([vector_for(t) for t in texts], dtype=np.float32)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_dim_is_discovered_then_fixed() -> None:
    widths = iter([DIM, DIM + 1])

    def handler(request: httpx.Request) -> httpx.Response:
        return ok_response(request, dim=next(widths))

    emb = make(Recorder(handler))
    assert emb.embed(["x"]).shape == (1, DIM)
    assert emb.dim == DIM
    with pytest.raises(EmbeddingError):
        emb.embed(["y"])
    assert emb.dim == DIM


def test_dim_property_probes_when_unknown() -> None:
    rec = Recorder(ok_response)
    emb = make(rec)
    assert emb.dim == DIM
    assert len(rec.requests) == 1


def test_wrong_dim_against_declared_dim() -> None:
    emb = make(Recorder(lambda r: ok_response(r, dim=DIM + 2)), dim=DIM)
    with pytest.raises(EmbeddingError, match="width"):
        emb.embed(["a", "b"])


def test_429_with_retry_after_then_success() -> None:
    rec = Recorder(
        lambda r: httpx.Response(429, headers={"Retry-After": "3"}, json={"error": "slow down"}),
        ok_response,
    )
    sleeps: list[float] = []
    out = make(rec, sleeps).embed(["a"])
    assert out.shape == (1, DIM)
    assert len(rec.requests) == 2
    assert sleeps == [3.0]  # honoured Retry-After, not the (much shorter) backoff


def test_retry_after_is_capped() -> None:
    rec = Recorder(lambda r: httpx.Response(429, headers={"Retry-After": "3600"}), ok_response)
    sleeps: list[float] = []
    make(rec, sleeps, max_retry_after=5.0).embed(["a"])
    assert sleeps == [5.0]


def test_500_then_success_uses_bounded_jittered_backoff() -> None:
    rec = Recorder(
        lambda r: httpx.Response(500, text="boom"),
        lambda r: httpx.Response(503, text="busy"),
        ok_response,
    )
    sleeps: list[float] = []
    out = make(rec, sleeps, backoff_initial=0.5, backoff_max=20.0).embed(["a"])
    assert out.shape == (1, DIM)
    assert len(rec.requests) == 3
    assert len(sleeps) == 2
    assert 0.0 <= sleeps[0] <= 0.5
    assert 0.0 <= sleeps[1] <= 1.0


def test_timeout_then_success() -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    rec = Recorder(timeout, ok_response)
    sleeps: list[float] = []
    assert make(rec, sleeps).embed(["a"]).shape == (1, DIM)
    assert len(rec.requests) == 2
    assert len(sleeps) == 1


def test_connection_error_then_success() -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    rec = Recorder(refused, ok_response)
    assert make(rec).embed(["a"]).shape == (1, DIM)
    assert len(rec.requests) == 2


def test_retries_are_bounded() -> None:
    rec = Recorder(lambda r: httpx.Response(502, text="bad gateway"))
    sleeps: list[float] = []
    with pytest.raises(ModelError) as info:
        make(rec, sleeps, max_attempts=3).embed(["a"])
    assert len(rec.requests) == 3
    assert len(sleeps) == 2
    assert info.value.status == 502
    assert info.value.body == "bad gateway"


def test_401_fails_fast_with_status_and_body() -> None:
    body = {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}
    rec = Recorder(lambda r: httpx.Response(401, json=body), ok_response)
    sleeps: list[float] = []
    with pytest.raises(ModelError) as info:
        make(rec, sleeps).embed(["a"])
    assert len(rec.requests) == 1
    assert sleeps == []
    assert info.value.status == 401
    assert info.value.body is not None
    assert json.loads(info.value.body) == body


def test_400_fails_fast() -> None:
    rec = Recorder(lambda r: httpx.Response(400, text="bad input"))
    with pytest.raises(ModelError) as info:
        make(rec).embed(["a"])
    assert len(rec.requests) == 1
    assert info.value.status == 400


def test_nan_in_response_is_an_embedding_error() -> None:
    def nan(request: httpx.Request) -> httpx.Response:
        text = '{"data": [{"index": 0, "embedding": [NaN, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]}]}'
        return httpx.Response(200, content=text.encode(), headers={"content-type": "application/json"})

    with pytest.raises(EmbeddingError):
        make(Recorder(nan)).embed(["a"])


def test_ragged_or_non_numeric_rows_are_embedding_errors() -> None:
    def ragged(request: httpx.Request) -> httpx.Response:
        data = [{"index": 0, "embedding": [1.0] * DIM}, {"index": 1, "embedding": [1.0] * (DIM - 1)}]
        return httpx.Response(200, json={"data": data})

    def text_values(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": ["x"] * DIM}]})

    with pytest.raises(EmbeddingError):
        make(Recorder(ragged)).embed(["a", "b"])
    with pytest.raises(EmbeddingError):
        make(Recorder(text_values)).embed(["a"])


def test_wrong_number_of_rows_is_an_error() -> None:
    def short(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": [1.0] * DIM}]})

    with pytest.raises(EmbeddingError):
        make(Recorder(short)).embed(["a", "b"])


def test_invalid_json_is_a_model_error() -> None:
    with pytest.raises(ModelError):
        make(Recorder(lambda r: httpx.Response(200, text="<html>oops</html>"))).embed(["a"])


def test_api_key_never_appears_in_errors_or_repr() -> None:
    echo = {"error": f"Incorrect API key provided: {API_KEY}"}
    cases: list[Recorder] = [
        Recorder(lambda r: httpx.Response(401, json=echo)),
        Recorder(lambda r: httpx.Response(500, json=echo)),
        Recorder(lambda r: httpx.Response(429, json=echo)),
        Recorder(lambda r: httpx.Response(200, content=b'{"data": [{"index": 0, "embedding": [NaN]}]}')),
    ]
    for rec in cases:
        emb = make(rec, max_attempts=2)
        assert API_KEY not in repr(emb)
        with pytest.raises((ModelError, EmbeddingError)) as info:
            emb.embed(["a"])
        exc: BaseException | None = info.value
        while exc is not None:  # the whole chain, attributes included
            assert API_KEY not in str(exc)
            assert API_KEY not in repr(exc)
            assert API_KEY not in str(getattr(exc, "body", "") or "")
            exc = exc.__cause__ or exc.__context__


def test_api_key_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    rec = Recorder(lambda r: httpx.Response(503, text=f"down {API_KEY}"), ok_response)
    make(rec).embed(["a"])
    assert "retrying" in caplog.text
    assert API_KEY not in caplog.text


def test_env_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env.test/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-key")
    rec = Recorder(ok_response)
    emb = OpenAIEmbedder("m", transport=httpx.MockTransport(rec))
    emb.embed(["a"])
    assert str(rec.requests[0].url) == "http://env.test/v1/embeddings"
    assert rec.requests[0].headers["authorization"] == "Bearer sk-env-key"


def test_no_key_sends_no_authorization(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    rec = Recorder(ok_response)
    emb = OpenAIEmbedder("m", transport=httpx.MockTransport(rec))
    assert emb.base_url == "https://api.openai.com/v1"
    emb.embed(["a"])
    assert "authorization" not in rec.requests[0].headers


def test_request_dimensions_sends_dimensions() -> None:
    rec = Recorder(ok_response)
    make(rec, dim=DIM, request_dimensions=True).embed(["a"])
    assert json.loads(rec.requests[0].content)["dimensions"] == DIM


def test_input_validation() -> None:
    rec = Recorder(ok_response)
    emb = make(rec, dim=DIM)
    with pytest.raises(UserInputError):
        emb.embed("just a string")
    with pytest.raises(UserInputError):
        emb.embed(["ok", 3])  # type: ignore[list-item]
    assert emb.embed([]).shape == (0, DIM)
    assert rec.requests == []
    with pytest.raises(UserInputError):
        OpenAIEmbedder("m", dim=0)
    with pytest.raises(UserInputError):
        OpenAIEmbedder("m", batch_size=0)
