"""The engine in its own process (``dllm.serving.engine_process``, ``dllm serve`` by default).

Same answers, usage and forward counts as the in-process engine; metrics cross the process
boundary; concurrent requests batch; disconnects cancel; a dead engine fails requests instead of
hanging them; queue limits and load failures answer as before.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import threading
import time

import httpx
import pytest

from dllm.serving.app import create_app
from dllm.serving.engine_process import MetricsRecorder, RemoteEngine, apply_metric_ops
from dllm.serving.errors import ServingError, queue_full
from dllm.serving.metrics import ServerMetrics
from dllm.serving.settings import ServerSettings
from dllm.serving.testing import TEST_MODEL as MODEL
from dllm.serving.testing import build_checkpoint, running_server

PROMPTS = ["the cat sat on the mat", "what is two plus three", "sort the list : red blue green", "hello world"]


def _wait_ready(url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(url + "/ready")
        if r.status_code == 200:
            return
        assert r.json()["status"] in ("loading", "engine_stopped", "restarting"), r.json()
        assert time.monotonic() < deadline, "the engine process did not load the model"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def noeos(tmp_path_factory):
    # EOS never stops a row in this checkpoint: a request runs its whole canvas unless cancelled
    return build_checkpoint(tmp_path_factory.mktemp("engine-process"), seed=5, stop_at_eos=False, max_new_tokens=32)


@pytest.fixture(scope="module")
def remote(noeos):
    settings = ServerSettings(model=str(noeos), served_model_name=MODEL, engine_process=True, num_threads=1,
                              max_tokens_cap=1024)
    app = create_app(settings)
    with running_server(app) as url:
        _wait_ready(url)
        yield url, app


@pytest.fixture(scope="module")
def local(serve, noeos):
    with serve(noeos, max_tokens_cap=1024) as (url, app):
        yield url, app


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def _stream_text(url: str, path: str, body: dict) -> tuple[list[str], dict]:
    texts: dict[int, str] = {}
    usage = None
    with httpx.stream("POST", url + path, json={**body, "stream": True, "stream_options": {"include_usage": True}},
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk
            for ch in chunk["choices"]:
                t = ch["delta"].get("content") if "delta" in ch else ch.get("text")
                if t:
                    texts[ch["index"]] = texts.get(ch["index"], "") + t
    return [texts.get(i, "") for i in range(max(texts, default=-1) + 1)], usage


def test_answers_usage_and_forwards_equal_the_in_process_engine(remote, local):
    for prompt in PROMPTS:
        for path, body in (("/v1/completions", {"prompt": prompt}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]})):
            body = {"model": MODEL, "max_tokens": 24, "temperature": 0, "n": 2, **body}
            a, b = _post(remote[0], path, body).json(), _post(local[0], path, body).json()
            assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
            assert a["dllm"]["num_forwards"] == b["dllm"]["num_forwards"] > 0
            streamed, usage = _stream_text(remote[0], path, body)
            key = "text" if path == "/v1/completions" else "message"
            want = [c["text"] if key == "text" else c["message"]["content"] for c in a["choices"]]
            assert streamed == want
            assert usage["usage"] == a["usage"] and usage["dllm"]["num_forwards"] == a["dllm"]["num_forwards"]
    # stop strings are matched in the engine process as well
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0}
    full = _post(remote[0], "/v1/completions", body).json()["choices"][0]["text"]
    words = full.split()
    if len(words) >= 2:
        stop = words[1]
        a = _post(remote[0], "/v1/completions", {**body, "stop": [stop]}).json()["choices"][0]
        b = _post(local[0], "/v1/completions", {**body, "stop": [stop]}).json()["choices"][0]
        assert a == b and stop not in a["text"] and a["finish_reason"] == "stop"


def test_typed_errors_and_health(remote):
    url = remote[0]
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    r = _post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 100000})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = _post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "strategy": "no-such-strategy"})
    assert r.status_code == 400 and "strategy" in r.json()["error"]["message"]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_concurrent_requests_batch_and_metrics_cross_the_process_boundary(remote):
    url, app = remote
    engine = app.state.dllm.engine
    assert isinstance(engine, RemoteEngine)
    calls0, rows0 = _metric(url, "dllm_batch_size_count"), _metric(url, "dllm_batch_size_sum")
    fwd0, batches0 = _metric(url, "dllm_forwards_per_request_count"), engine.batches
    results: dict[int, str] = {}

    def one(i: int) -> None:
        r = _post(url, "/v1/completions", {"model": MODEL, "prompt": PROMPTS[i % 4], "max_tokens": 32,
                                           "temperature": 0})
        results[i] = r.json()["choices"][0]["text"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 16
    assert all(results[i] == results[i % 4] for i in range(16))  # batching does not change greedy answers
    calls = _metric(url, "dllm_batch_size_count") - calls0
    rows = _metric(url, "dllm_batch_size_sum") - rows0
    assert rows == 16 and 1 <= calls < 16  # several requests shared a generate call
    assert engine.batches - batches0 == calls
    assert _metric(url, "dllm_forwards_per_request_count") - fwd0 == 16
    assert _metric(url, "dllm_queue_depth") == 0


def test_a_client_that_goes_away_is_cancelled_in_the_engine_process(remote):
    url = remote[0]
    before = _metric(url, "dllm_cancelled_rows_total")
    # about one token per forward over 1024 tokens: still running when the client leaves
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1024, "temperature": 0, "stream": True,
            "threshold": 1.0}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    deadline = time.monotonic() + 30
    while _metric(url, "dllm_cancelled_rows_total") <= before:
        assert time.monotonic() < deadline, "the engine process did not cancel the abandoned row"
        time.sleep(0.05)
    r = _post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200


@pytest.mark.slow
def test_a_dead_engine_process_is_restarted(checkpoint):
    """kill -9 of the engine process: readiness drops, requests get a retryable 503 (never a 500), and a new
    engine process serves again; the killed one is gone."""
    settings = ServerSettings(model=str(checkpoint), served_model_name=MODEL, engine_process=True, num_threads=1)
    app = create_app(settings)
    with running_server(app) as url:
        _wait_ready(url)
        engine = app.state.dllm.engine
        assert _post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}).status_code == 200
        os.kill(engine._proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while httpx.get(url + "/ready").status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = _post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4})
        assert r.status_code == 503 and r.json()["error"]["code"] in ("engine_restarting", "engine_stopped")
        assert "retry-after" in r.headers
        _wait_ready(url)
        assert app.state.dllm.restarts == 1 and app.state.dllm.engine is not engine
        assert _post(url, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4}).status_code == 200
        engine._proc.join(5)
        assert not engine._proc.is_alive()


def test_a_model_that_fails_to_load_in_the_engine_process(tmp_path):
    bad = tmp_path / "ckpt"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    settings = ServerSettings(model=str(bad), served_model_name="bad", engine_process=True, num_threads=1)
    with running_server(create_app(settings)) as url:
        deadline = time.monotonic() + 90
        while httpx.get(url + "/ready").json()["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        r = httpx.get(url + "/ready")
        assert r.status_code == 503 and r.json()["status"] == "failed" and r.json()["detail"]
        r = _post(url, "/v1/completions", {"model": "bad", "prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"


def test_queue_limit_is_counted_in_the_api_process():
    engine = RemoteEngine({}, max_queue=1, metrics=ServerMetrics())  # not started: messages go nowhere

    async def go():
        from dllm.decoding.config import DiffusionGenerationConfig

        cfg = DiffusionGenerationConfig()
        first = engine.submit([[1, 2]], n=1, cfg=cfg, max_tokens=4)
        with pytest.raises(ServingError) as err:
            engine.submit([[1, 2]], n=1, cfg=cfg, max_tokens=4)
        assert err.value.status == 503 and err.value.headers.get("Retry-After")
        assert engine.queue_depth == 1
        # the engine process took the first request into a batch: the queue has room again
        engine._conn = None
        with engine._lock:
            engine._state.waiting.discard(first.rid)
        second = engine.submit([[3]], n=2, cfg=cfg, max_tokens=4)
        assert engine.queue_depth == 1 and len(second.rows) == 2
        second.cancel()  # a cancelled request leaves the queue and is forgotten
        assert engine.queue_depth == 0 and second.rid not in engine._state.requests

    asyncio.run(go())


def test_events_reach_their_requests_and_finish_them():
    from dllm.serving.engine import Event

    engine = RemoteEngine({}, max_queue=8, metrics=ServerMetrics())

    async def go():
        from dllm.decoding.config import DiffusionGenerationConfig

        req = engine.submit([[1]], n=2, cfg=DiffusionGenerationConfig(), max_tokens=4)
        ops = [("batch_size", (), "observe", 2.0), ("generation_tokens", (), "inc", 3.0)]
        engine._on_events([(req.rid, Event("delta", 0, "a")), (req.rid, Event("finish", 0, finish_reason="stop")),
                           (req.rid, Event("stats", 0, info={"num_forwards": 2})),
                           (req.rid, Event("delta", 1, "b")), (req.rid, Event("finish", 1, finish_reason="length")),
                           (req.rid, Event("stats", 1, info={"num_forwards": 3})), (999, Event("delta", 0, "x"))], ops)
        got = [ev async for ev in req.events()]
        assert [(e.kind, e.index, e.text) for e in got if e.kind == "delta"] == [("delta", 0, "a"), ("delta", 1, "b")]
        assert req.done and req.rid not in engine._state.requests
        assert engine.batches == 1
        req.cancel()  # finished: nothing is sent

    asyncio.run(go())
    text = engine.metrics.render()[0].decode()
    assert "dllm_batch_size_count 1.0" in text and "dllm_generation_tokens_total 3.0" in text


def test_metric_operations_replay_on_the_registry():
    rec = MetricsRecorder()
    rec.batch_size.observe(4)
    rec.forwards.observe(3)
    rec.tpf.observe(1.5)
    rec.cancelled_rows.inc()
    rec.running_rows.set(4)
    rec.queue_depth.set(7)  # the API process counts its own queue
    rec.errors.labels("chat", "500").inc()
    ops = rec.take()
    assert rec.take() == [] and len(ops) == 7
    m = ServerMetrics()
    apply_metric_ops(m, pickle.loads(pickle.dumps(ops)))
    text = m.render()[0].decode()
    for line in ("dllm_batch_size_sum 4.0", "dllm_forwards_per_request_count 1.0", "dllm_cancelled_rows_total 1.0",
                 "dllm_running_rows 4.0", "dllm_queue_depth 0.0",
                 'dllm_request_errors_total{endpoint="chat",status="500"} 1.0'):
        assert line in text, line


def test_serving_errors_survive_pickling():
    err = pickle.loads(pickle.dumps(queue_full()))
    assert isinstance(err, ServingError) and err.status == 503 and err.retry and err.headers["Retry-After"]
    assert err.body() == queue_full().body()
