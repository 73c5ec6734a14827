"""Batching under load: concurrent streams equal sequential runs, disconnects free their slot, 503 when full."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import pytest

from dllm.serving.testing import TEST_MODEL as MODEL
from dllm.serving.testing import build_checkpoint

PROMPTS = [f"{a} {b} {c}" for a in ("the", "a", "what", "how") for b in ("cat", "dog", "sum", "list")
           for c in ("sat", "ran")]  # 32 prompts of varying tokens


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


async def _stream_one(client: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> tuple[str, str]:
    stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                  max_tokens=max_tokens, temperature=0, stream=True)
    text, reason = [], None
    async for chunk in stream:
        for ch in chunk.choices:
            text.append(ch.delta.content or "")
            reason = ch.finish_reason or reason
    return "".join(text), reason


@pytest.fixture(scope="module", params=["in-process", "engine-process"])
def server(serve, checkpoint, request):
    with serve(checkpoint, engine_process=request.param == "engine-process", max_batch_size=8,
               batch_wait_ms=5) as (url, app):
        yield url, app


def test_32_concurrent_streams_equal_sequential_runs(server):
    url, app = server
    sync = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    sequential = []
    for i, p in enumerate(PROMPTS):
        r = sync.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}],
                                         max_tokens=8 + 8 * (i % 3), temperature=0)
        sequential.append((r.choices[0].message.content, r.choices[0].finish_reason))
    batches_before = app.state.dllm.engine.batches

    async def run_all():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
            return await asyncio.gather(*[_stream_one(client, p, 8 + 8 * (i % 3)) for i, p in enumerate(PROMPTS)])

    concurrent = asyncio.run(run_all())
    assert concurrent == sequential
    # rows were batched: far fewer generate calls than requests (3 max_tokens groups, batches of <= 8)
    batches = app.state.dllm.engine.batches - batches_before
    assert batches < len(PROMPTS) // 2, batches
    assert _metric(url, "dllm_batch_size_sum") > _metric(url, "dllm_batch_size_count")


@pytest.mark.parametrize("engine_process", [False, True], ids=["in-process", "engine-process"])
def test_full_queue_answers_503_with_retry_after(serve, checkpoint, engine_process):
    with serve(checkpoint, engine_process=engine_process, max_batch_size=1, max_queue=1) as (url, _app):
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 256, "threshold": 1.0}

        async def burst():
            async with httpx.AsyncClient(base_url=url, timeout=120) as c:
                return await asyncio.gather(*[c.post("/v1/completions", json=body) for _ in range(6)])

        responses = asyncio.run(burst())
        codes = sorted(r.status_code for r in responses)
        assert 200 in codes and 503 in codes, codes
        full = next(r for r in responses if r.status_code == 503)
        assert full.headers["retry-after"] == "1" and full.json()["error"]["code"] == "queue_full"
        assert "x-should-retry" not in full.headers  # clients may retry this one


def test_client_disconnect_cancels_its_row_and_frees_the_slot(serve, tmp_path_factory):
    # EOS never stops a row in this checkpoint, so an unfinished request would run its whole canvas.
    path = build_checkpoint(tmp_path_factory.mktemp("noeos"), seed=5, stop_at_eos=False, max_new_tokens=32)
    with serve(path, max_batch_size=1, max_tokens_cap=1024) as (url, _app):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1024,
                "threshold": 1.0, "stream": True}
        t_full = None
        with httpx.Client(base_url=url, timeout=60) as c:
            # a short run of the same settings, to estimate the cost of a full one
            t0 = time.perf_counter()
            c.post("/v1/chat/completions", json={**body, "max_tokens": 64, "stream": False})
            t_full = (time.perf_counter() - t0) * 1024 / 64
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                seen = 0
                for line in lines:
                    if line.startswith("data:") and '"content":"' in line and '"content":""' not in line:
                        seen += 1
                        if seen >= 2:
                            break
                assert _metric(url, "dllm_running_rows") == 1
            t_cut = time.perf_counter()
        # the row is cancelled: the worker goes idle long before the full canvas could have been decoded
        while _metric(url, "dllm_running_rows") != 0:
            assert time.perf_counter() - t_cut < max(2.0, t_full / 4), "the cancelled row kept running"
            time.sleep(0.02)
        assert _metric(url, "dllm_cancelled_rows_total") == 1
        # the slot is free: a new request is served at once
        ok = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 8}, timeout=30)
        assert ok.status_code == 200

        # a non-streamed request whose client goes away is cancelled too
        async def impatient():
            async with httpx.AsyncClient(base_url=url, timeout=0.5) as c:
                with pytest.raises(httpx.ReadTimeout):
                    await c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1024,
                                                          "threshold": 1.0})

        asyncio.run(impatient())
        deadline = time.perf_counter() + max(3.0, t_full / 4)
        while _metric(url, "dllm_cancelled_rows_total") < 2:
            assert time.perf_counter() < deadline, "the abandoned non-streamed request was not cancelled"
            time.sleep(0.02)
