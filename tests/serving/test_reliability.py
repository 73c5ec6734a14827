"""The server under careless or hostile input: every error in the OpenAI shape and counted, no 5xx from user
input, no connection reset, auth that neither locks everyone out nor lets anyone in, an event loop that
never stalls."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from dllm.serving.settings import ServerSettings
from dllm.serving.testing import TEST_MODEL as MODEL

SHAPE = {"message", "type", "param", "code"}


def _error(r: httpx.Response) -> dict:
    assert r.headers["content-type"].startswith("application/json"), r.text
    body = r.json()["error"]
    assert set(body) == SHAPE, body
    return body


@pytest.fixture(scope="module")
def live(serve, checkpoint):
    with serve(checkpoint, api_key="sekret-\u00e9t\u00e9", allowed_hosts=("127.0.0.1", "localhost")) as (url, app):
        yield url, app


def _auth(key: str = "sekret-\u00e9t\u00e9") -> dict:
    return {"authorization": b"Bearer " + key.encode("utf-8")}


def test_lone_surrogates_and_invalid_utf8_are_400(live):
    url, _ = live
    with httpx.Client(headers=_auth()) as c:
        r = c.post(url + "/v1/completions", content=b'{"model": "%s", "prompt": "hi \\ud800 there"}' % MODEL.encode(),
                   headers={"content-type": "application/json"})
        assert r.status_code == 400 and _error(r)["code"] == "invalid_text" and _error(r)["param"] == "prompt"
        chat = b'{"model": "%s", "messages": [{"role": "user", "content": "\\udfff"}]}' % MODEL.encode()
        r = c.post(url + "/v1/chat/completions", content=chat, headers={"content-type": "application/json"})
        assert r.status_code == 400 and _error(r)["param"] == "messages"
        r = c.post(url + "/v1/completions", content=b'{"model": "x", "prompt": "\xff\xfe"}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 400 and _error(r)["code"] == "invalid_json"


def test_malformed_http_gets_an_openai_shaped_400(live):
    url, _ = live
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"GARBAGE / HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert b'"code": "bad_http_request"' in body


def test_an_unhandled_error_is_a_counted_json_500_on_a_kept_connection(live, monkeypatch):
    url, app = live
    from dllm.serving import openai_serving

    def boom(state, req):
        raise RuntimeError("a bug")

    monkeypatch.setattr(openai_serving, "plan_completion", boom)
    metrics = app.state.dllm.metrics
    before = metrics.errors.labels("completions", "500")._value.get()
    with httpx.Client(headers=_auth()) as c:
        r = c.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 500 and _error(r)["type"] == "server_error"
        assert "a bug" not in r.text  # the log has the details, not the client
        again = c.get(url + "/v1/models")  # the same keep-alive connection still works
        assert again.status_code == 200 and r.extensions["network_stream"] is again.extensions["network_stream"]
    assert metrics.errors.labels("completions", "500")._value.get() == before + 1


def test_auth_covers_docs_openapi_and_metrics(live):
    url, _ = live
    for path in ("/v1/models", "/docs", "/openapi.json", "/metrics"):
        r = httpx.get(url + path)
        assert r.status_code == 401 and _error(r)["code"] == "invalid_api_key", path
        assert httpx.get(url + path, headers=_auth()).status_code == 200, path  # a non-ASCII key, sent as UTF-8
    assert httpx.get(url + "/v1/models", headers=_auth("sekret-ete")).status_code == 401
    for path in ("/health", "/ready"):
        assert httpx.get(url + path).status_code == 200


def test_public_flags_open_metrics_and_docs(serve, checkpoint):
    with serve(checkpoint, api_key="k", public_metrics=True, public_docs=True) as (url, _):
        assert httpx.get(url + "/metrics").status_code == 200 and httpx.get(url + "/openapi.json").status_code == 200
        assert httpx.get(url + "/v1/models").status_code == 401


@pytest.mark.parametrize("key", ["", "   ", " padded "])
def test_keys_that_cannot_work_are_refused_at_start_up(key):
    with pytest.raises(ValueError, match="api_key"):
        ServerSettings(api_key=key)


def test_other_hosts_are_refused(live):
    url, app = live
    r = httpx.get(url + "/health", headers={"host": "evil.example:80"})
    assert r.status_code == 400 and _error(r)["code"] == "invalid_host"
    assert httpx.get(url + "/health", headers={"host": "localhost:1234"}).status_code == 200


@pytest.mark.slow
def test_health_answers_fast_while_large_prompts_are_tokenized(live):
    """Chat templating and tokenization of large prompts run off the event loop."""
    url, _ = live
    big = "sort : " + " ".join(["Ann Bob Cal Dan"] * 12_000)  # about 240k characters, far over the prompt limit
    worst, done = [], threading.Event()

    async def burst():
        async with httpx.AsyncClient(headers=_auth(), timeout=60) as c:
            body = {"model": MODEL, "messages": [{"role": "user", "content": big}], "max_tokens": 4}
            return await asyncio.gather(*[c.post(url + "/v1/chat/completions", json=body) for _ in range(6)])

    def probe():
        with httpx.Client() as c:
            c.get(url + "/health")  # connect once: measure the loop, not the handshake
            while not done.is_set():
                t0 = time.perf_counter()
                assert c.get(url + "/health").status_code == 200
                worst.append(time.perf_counter() - t0)
                time.sleep(0.01)

    t = threading.Thread(target=probe)
    t.start()
    try:
        responses = asyncio.run(burst())
    finally:
        done.set()
        t.join()
    assert all(r.status_code == 413 for r in responses)  # each tokenized, then refused as too long
    assert len(worst) >= 5 and max(worst) < 0.1, max(worst)


def test_one_request_cannot_take_unbounded_work(serve, checkpoint):
    """n x LoPA branches x canvas is checked against --max-request-tokens before any work is queued."""
    with serve(checkpoint, max_request_tokens=4096) as (url, app):
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 64, "n": 16, "strategy": "lopa", "lopa_branches": 8,
                "block_length": 8}
        r = httpx.post(url + "/v1/completions", json=body)
        assert r.status_code == 400 and _error(r)["code"] == "request_too_costly" and _error(r)["param"] == "n"
        assert "--max-request-tokens" in _error(r)["message"] and "16 rows x 9 LoPA branches" in _error(r)["message"]
        assert app.state.dllm.engine.queue_depth == 0
        small = {**body, "n": 1, "lopa_branches": 2}
        assert httpx.post(url + "/v1/completions", json=small).status_code == 200
    with serve(checkpoint) as (url, app):
        assert app.state.dllm.bundle.max_request_tokens == 65_536  # the default (memory allows more here)


def test_64_clients_at_once_get_answers_or_retryable_503s_and_no_5xx(serve, checkpoint):
    """A burst larger than the queue: every response is a 200 or a 503 with Retry-After, in the OpenAI
    shape; none is another 5xx; the server keeps answering afterwards."""
    with serve(checkpoint, max_queue=16, max_batch_size=8) as (url, app):
        async def one(client, i):
            body = {"model": MODEL, "prompt": f"the cat {i}", "max_tokens": 8, "stream": bool(i % 2)}
            return await client.post("/v1/completions", json=body)

        async def burst():
            async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=70)) as c:
                return await asyncio.gather(*[one(c, i) for i in range(64)])

        responses = asyncio.run(burst())
        codes = [r.status_code for r in responses]
        assert set(codes) <= {200, 503} and codes.count(200) >= 16, codes
        for r in responses:
            if r.status_code == 503:
                assert _error(r)["code"] and 1 <= int(r.headers["retry-after"]) <= 60
        assert httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4}).status_code == 200
        metrics = httpx.get(url + "/metrics").text
        assert not any(ln.startswith("dllm_request_errors_total") and 'status="5' in ln and 'status="503"' not in ln
                       and not ln.rstrip().endswith(" 0.0") for ln in metrics.splitlines())


def test_a_small_request_streams_while_a_maximal_one_decodes(serve, checkpoint):
    """Batches take turns: a small request with other settings gets its first text while a long request
    (one token per forward, hundreds of forwards) is still decoding, instead of after it."""
    with serve(checkpoint, max_batch_size=1, max_batches=2) as (url, app):
        big = {"model": MODEL, "prompt": "the cat", "max_tokens": 512, "temperature": 0, "strategy": "vanilla",
               "ignore_eos": True, "block_length": 512}
        small = {"model": MODEL, "prompt": "hi", "max_tokens": 8, "temperature": 0, "stream": True}
        engine = app.state.dllm.engine
        done = {}

        def run_big():
            t0 = time.perf_counter()
            httpx.post(url + "/v1/completions", json=big, timeout=300)
            done["big"] = time.perf_counter() - t0

        t = threading.Thread(target=run_big)
        t.start()
        deadline = time.monotonic() + 30
        while not engine._running:  # the big request is decoding
            assert time.monotonic() < deadline
            time.sleep(0.005)
        t0 = time.perf_counter()
        with httpx.stream("POST", url + "/v1/completions", json=small, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                    ttft = time.perf_counter() - t0
                    break
        assert "big" not in done, "the big request ended before the small one's first text"
        t.join()
    assert ttft < done["big"] / 4, (ttft, done["big"])
