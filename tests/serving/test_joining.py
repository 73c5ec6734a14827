"""Continuous batching in the server: a request that arrives mid-call joins the running batch."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import pytest

from dllm.serving.testing import TEST_MODEL as MODEL
from dllm.serving.testing import build_checkpoint


def _metric(url: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+-]+)$", httpx.get(url + "/metrics").text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


async def _stream(client, prompt: str, events: dict, tag: str, **extra) -> str:
    extra.setdefault("temperature", 0)
    stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                  stream=True, **extra)
    text = []
    async for chunk in stream:
        for ch in chunk.choices:
            if ch.delta.content:
                text.append(ch.delta.content)
                events.setdefault(f"{tag}_first", time.perf_counter())
            if ch.finish_reason:
                events[f"{tag}_finish"] = time.perf_counter()
    return "".join(text)


# EOS never stops a row in these checkpoints, so every request decodes its whole canvas.
@pytest.mark.parametrize("kind,body", [
    ("d2f", {"max_tokens": 96}),  # the server's default kind of model and strategy
    ("threshold", {"max_tokens": 96, "extra_body": {"threshold": 1.0, "cache": "dual"}}),
    ("lopa", {"max_tokens": 96, "extra_body": {"strategy": "lopa", "lopa_branches": 2}}),  # D2F base rule
    # d3LLM's delayed cache: each row refreshes on its own schedule (~1 token a forward)
    ("d3llm", {"max_tokens": 96, "extra_body": {"strategy": "d3llm", "cache": "prefix", "entropy_threshold": 0.0}}),
])
def test_request_arriving_mid_call_joins_it_and_streams_before_the_first_ends(serve, tmp_path_factory, kind, body):
    path = build_checkpoint(tmp_path_factory.mktemp(f"join-{kind}"), seed=5, block_causal=kind != "threshold",
                            stop_at_eos=False, max_new_tokens=32)
    with serve(path, max_batch_size=4, batch_wait_ms=5, join=True) as (url, app):
        engine = app.state.dllm.engine
        def client():  # one per event loop
            return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)

        prompts = ["the cat sat on the mat", "what is two plus three"]

        async def both():
            events: dict = {}
            async with client() as c:  # closed inside its loop: no "Event loop is closed" at GC time
                first = asyncio.create_task(_stream(c, prompts[0], events, "a", **body))
                while "a_first" not in events:  # the first request is decoding
                    await asyncio.sleep(0.002)
                second = asyncio.create_task(_stream(c, prompts[1], events, "b", **body))
                return await first, await second, events

        batches = engine.batches
        text_a, text_b, ev = asyncio.run(both())
        assert engine.batches - batches == 1  # one generate call served both: the second request joined it
        assert _metric(url, "dllm_joined_rows_total") == 1
        assert ev["b_first"] < ev["a_finish"], ev  # it streamed while the first request was still running

        async def alone(prompt):
            async with client() as c:
                return await _stream(c, prompt, {}, "x", **body)

        assert (text_a, text_b) == (asyncio.run(alone(prompts[0])), asyncio.run(alone(prompts[1])))
        assert text_a and text_b


def test_a_request_that_cannot_join_streams_from_a_batch_of_its_own(serve, tmp_path_factory):
    """A seeded sampling request decodes in a batch of its own (its answer depends only on the request); with
    --join a second one starts its own batch at once and the two are stepped in turn, so it streams before
    the first ends, with its own answer."""
    path = build_checkpoint(tmp_path_factory.mktemp("join-d3llm"), seed=5, block_causal=True, stop_at_eos=False,
                            max_new_tokens=32)
    body = {"max_tokens": 96, "temperature": 0.8, "seed": 7,
            "extra_body": {"strategy": "d3llm", "cache": "prefix", "entropy_threshold": 0.0}}  # ~1 token a forward
    with serve(path, max_batch_size=4, batch_wait_ms=5, join=True) as (url, app):
        engine = app.state.dllm.engine

        def client():
            return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)

        prompts = ["the cat sat on the mat", "what is two plus three"]

        async def both():
            events: dict = {}
            async with client() as c:
                first = asyncio.create_task(_stream(c, prompts[0], events, "a", **body))
                while "a_first" not in events:
                    await asyncio.sleep(0.002)
                second = asyncio.create_task(_stream(c, prompts[1], events, "b", **body))
                return await first, await second, events

        batches = engine.batches
        text_a, text_b, ev = asyncio.run(both())
        assert engine.batches - batches == 2 and _metric(url, "dllm_joined_rows_total") == 0
        assert ev["b_first"] < ev["a_finish"], ev

        async def alone(prompt):
            async with client() as c:
                return await _stream(c, prompt, {}, "x", **body)

        assert (text_a, text_b) == (asyncio.run(alone(prompts[0])), asyncio.run(alone(prompts[1])))


class _Open:
    """A running batch that takes every row (the scheduler's view of one)."""

    joinable, admits_now, live = True, True, 0

    def __init__(self, *a, **k):
        self.prompts = []

    def add_rows(self, prompts, **values):
        first = len(self.prompts)
        self.prompts += prompts
        return range(first, len(self.prompts))

    def finished(self):
        return False


def _admit(engine, at: float) -> None:
    with engine._cond:
        engine._admit(at)


def test_admission_joins_in_arrival_order_within_the_batch_size_and_starts_other_settings_apart():
    from dllm.generation import DiffusionGenerationConfig
    from dllm.serving.engine import Engine
    from dllm.serving.testing import WORDS
    from dllm.tokenization import build_tokenizer

    cfg = DiffusionGenerationConfig(max_new_tokens=16, block_length=8)
    other = cfg.replace(block_length=4)

    async def main():
        e = Engine(None, build_tokenizer([WORDS]), session_factory=lambda *a, **k: _Open(), max_batch_size=4,
                   join=True)  # not started: the test calls the scheduler
        running = e.submit([[4]], n=1, cfg=cfg, max_tokens=8)
        t0 = time.monotonic()
        _admit(e, t0 + 1)  # past every wait: the first session starts
        assert len(e._running) == 1
        a = e.submit([[5], [6]], n=1, cfg=cfg, max_tokens=8)  # 2 rows
        b = e.submit([[7]], n=1, cfg=cfg.replace(threshold=0.5), max_tokens=16)  # a per-row option: same session
        c = e.submit([[8]], n=1, cfg=other, max_tokens=8)
        d = e.submit([[9]], n=1, cfg=cfg, max_tokens=8)
        iso = e.submit([[3]], n=1, cfg=cfg, max_tokens=8, isolated=True)  # seeded sampling: a session of its own
        now = time.monotonic()
        _admit(e, now)
        run = e._running[0]
        assert run.requests == [running, a, b] and run.batch.prompts == [[4], [5], [6], [7]]  # 1 + 2 + 1 rows
        assert e._pending == [c, d, iso]  # c waits batch_wait for company, and nothing overtakes it
        _admit(e, now + e.batch_wait + 1e-3)
        assert [r.requests for r in e._running[1:]] == [[c], [iso]]
        assert e._pending == [d]  # d has the settings of a full running batch: it waits for that batch...
        _admit(e, now + 100 * e.max_wait)
        assert e._pending == [d]  # ... however long it runs
        with e._cond:
            e._running.remove(run)  # it ends
        _admit(e, now + 100 * e.max_wait)
        assert [r.requests for r in e._running[2:]] == [[d]]
        assert e.queue_depth == 0

    asyncio.run(main())


class _Closed(_Open):
    """A running batch of a strategy that takes no rows mid-call (classifier-free guidance)."""

    joinable = admits_now = False


class _InsideABlock(_Open):
    """A running batch that takes rows only at its next block boundary, not at its next step."""

    admits_now = False


def test_with_joining_on_a_request_starts_its_own_batch_rather_than_wait_for_a_block_boundary():
    """--join: a request joins a running batch of its settings only where that batch decodes it from its next
    step; inside a block of a loop that admits rows at block boundaries it starts a batch of its own at
    once (it streams after one step), and once the batch is at a join point the next one joins it."""
    from dllm.generation import DiffusionGenerationConfig
    from dllm.serving.engine import Engine
    from dllm.serving.testing import WORDS
    from dllm.tokenization import build_tokenizer

    cfg = DiffusionGenerationConfig(strategy="threshold", cache="dual", max_new_tokens=16, block_length=8)

    async def main():
        made = []

        def factory(*a, **k):
            made.append(_InsideABlock())
            return made[-1]

        e = Engine(None, build_tokenizer([WORDS]), session_factory=factory, max_batch_size=8, join=True)
        first = e.submit([[4]], n=1, cfg=cfg, max_tokens=8)
        now = time.monotonic()
        _admit(e, now + 1)
        second = e.submit([[5]], n=1, cfg=cfg, max_tokens=8)
        _admit(e, now + 2)
        assert [r.requests for r in e._running] == [[first], [second]] and e._pending == []
        made[0].admits_now = True  # the first batch reached a block boundary
        third = e.submit([[6]], n=1, cfg=cfg, max_tokens=8)
        _admit(e, now + 3)
        assert [r.requests for r in e._running] == [[first, third], [second]]

    asyncio.run(main())


def test_with_joining_on_settings_that_cannot_join_start_a_batch_of_their_own_at_once():
    """A request whose running same-settings batch cannot take it does not wait for that batch to end
    (--join: latency first); with joining off it does (same-settings work stays in one batch)."""
    from dllm.generation import DiffusionGenerationConfig
    from dllm.serving.engine import Engine
    from dllm.serving.testing import WORDS
    from dllm.tokenization import build_tokenizer

    cfg = DiffusionGenerationConfig(strategy="lopa", max_new_tokens=16, block_length=8)

    async def main(join: bool):
        e = Engine(None, build_tokenizer([WORDS]), session_factory=lambda *a, **k: _Closed(), max_batch_size=4,
                   join=join)  # not started: the test calls the scheduler
        first = e.submit([[4]], n=1, cfg=cfg, max_tokens=8)
        _admit(e, time.monotonic() + 1)
        late = e.submit([[5]], n=1, cfg=cfg, max_tokens=8)
        now = time.monotonic()
        _admit(e, now + e.batch_wait + 1e-3)  # past its wait for company
        return [r.requests for r in e._running], e._pending, first, late

    running, pending, first, late = asyncio.run(main(join=True))
    assert running == [[first], [late]] and pending == []  # stepped in turn from now on
    running, pending, first, late = asyncio.run(main(join=False))
    assert running == [[first]] and pending == [late]


def test_lopa_on_branch_ranks_joins_only_while_no_other_lopa_settings_wait():
    """With a branch executor the ranks serve one LoPA batch at a time. Same-settings LoPA requests join the
    running one, but not once an older LoPA request of other settings waits: the running batch then drains
    and the waiting one starts, instead of waiting as long as joiners keep coming."""
    from dllm.generation import DiffusionGenerationConfig
    from dllm.serving.engine import Engine
    from dllm.serving.testing import WORDS
    from dllm.tokenization import build_tokenizer

    a_cfg = DiffusionGenerationConfig(strategy="lopa", lopa_branches=2, max_new_tokens=16, block_length=8)
    b_cfg = a_cfg.replace(lopa_branches=3)

    async def main():
        e = Engine(None, build_tokenizer([WORDS]), session_factory=lambda *a, **k: _Open(), max_batch_size=8,
                   join=True, branch_executor=object())  # not started: the test calls the scheduler
        first = e.submit([[4]], n=1, cfg=a_cfg, max_tokens=8)
        now = time.monotonic()
        _admit(e, now + 1)
        joiner = e.submit([[5]], n=1, cfg=a_cfg, max_tokens=8)
        _admit(e, now + 2)
        assert [r.requests for r in e._running] == [[first, joiner]]  # joined the running LoPA batch
        other = e.submit([[6]], n=1, cfg=b_cfg, max_tokens=8)
        late = e.submit([[7]], n=1, cfg=a_cfg, max_tokens=8)
        _admit(e, now + 100)
        assert [r.requests for r in e._running] == [[first, joiner]] and e._pending == [other, late]
        with e._cond:
            e._running.clear()  # the LoPA batch ends
        _admit(e, now + 200)
        assert [r.requests for r in e._running] == [[other]] and e._pending == [late]

    asyncio.run(main())


def test_no_join_engine_admits_nothing_and_passes_the_spread_bound_to_the_session():
    from dllm.generation import DiffusionGenerationConfig
    from dllm.serving.engine import Engine
    from dllm.serving.settings import ServerSettings
    from dllm.serving.testing import WORDS
    from dllm.testing import tiny_llada
    from dllm.tokenization import build_tokenizer

    cfg = DiffusionGenerationConfig(max_new_tokens=16, block_length=8)

    async def main():
        tok = build_tokenizer([WORDS])
        off = Engine(None, tok, session_factory=lambda *a, **k: _Open(), join=False)  # not started
        off.submit([[4]], n=1, cfg=cfg, max_tokens=8)
        _admit(off, time.monotonic() + 1)
        waiting = off.submit([[5]], n=1, cfg=cfg, max_tokens=8)
        _admit(off, time.monotonic())
        assert off._pending == [waiting] and off._running[0].batch.prompts == [[4]]  # it runs apart later
        on = Engine(tiny_llada(), tok, join=True, join_max_spread_blocks=2.0)
        session = on._new_session(cfg.replace(strategy="threshold"), streamer=None, criteria=[], joinable=True,
                                  branches=False)
        assert session.joinable and session.join_max_spread_blocks == 2.0  # read by decoding.joining.may_join

    asyncio.run(main())
    assert not ServerSettings().join and ServerSettings().join_max_spread == 2.0  # joining is opt-in
    with pytest.raises(ValueError, match="join_max_spread"):
        ServerSettings(join_max_spread=0.5)


def test_server_with_joining_off_never_joins_and_gives_the_same_texts(serve, tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("nojoin"), seed=5, block_causal=True, stop_at_eos=False,
                            max_new_tokens=32)
    prompts = ["the cat sat on the mat", "what is two plus three", "red blue green", "one two three four"]
    texts = {}
    for join in (True, False):
        with serve(path, max_batch_size=2, batch_wait_ms=1, join=join) as (url, _app):
            async def staggered():
                async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
                    tasks = []
                    for p in prompts:  # arrivals spread over the first call
                        tasks.append(asyncio.create_task(_stream(c, p, {}, p, max_tokens=96)))
                        await asyncio.sleep(0.01)
                    return await asyncio.gather(*tasks)

            texts[join] = asyncio.run(staggered())
            if not join:
                assert _metric(url, "dllm_joined_rows_total") == 0
    assert texts[True] == texts[False] and all(texts[False])
