"""The engine with scripted sessions: grouping, early finish, cancellation, isolation, errors."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
import torch

from dllm.generation import DiffusionGenerationConfig, GenerationConfigError
from dllm.serving.engine import Engine
from dllm.serving.errors import ServingError
from dllm.serving.testing import WORDS
from dllm.tokenization import build_tokenizer

TOK = build_tokenizer([WORDS])
WORD = TOK.convert_tokens_to_ids("▁cat")
CFG = DiffusionGenerationConfig(max_new_tokens=16, block_length=8)


class Scripted:
    """A fake session factory: each row commits one token per step and ends at its scripted step."""

    def __init__(self, ends: dict[int, int] | None = None, steps: int = 12, delay: float = 0.01, fail=None,
                 end_reason: str = "stop"):
        self.ends = ends or {}
        self.end_reason = end_reason
        self.steps = steps
        self.delay = delay
        self.fail = fail
        self.calls: list[int] = []  # rows of each session, at its first step
        self.values: list[dict] = []  # the per-row options of each session
        self.cancel_seen: list[set[int]] = []

    def __call__(self, cfg, *, streamer, criteria, joinable, branches):
        return _Session(self, streamer, criteria)


class _Session:
    joinable = admits_now = False

    def __init__(self, script: Scripted, streamer, criteria) -> None:
        self.script, self.streamer, self.criteria = script, streamer, criteria
        self.steps = script.steps  # fixed when the session starts
        self.n, self.step_no, self.done = 0, 0, False
        self.cancelled: set[int] = set()
        self.values: dict[str, list] = {}

    def add_rows(self, prompts, **values):
        first, self.n = self.n, self.n + len(prompts)
        for k, v in values.items():
            self.values.setdefault(k, []).extend(v)
        return range(first, self.n)

    def cancel(self, row):
        self.cancelled.add(row)

    @property
    def live(self):
        return len(self.alive) if self.step_no else self.n

    def finished(self):
        return self.done

    def step(self):
        s = self.script
        if self.step_no == 0:
            s.calls.append(self.n)
            s.values.append(self.values)
            if s.fail is not None:
                raise s.fail
            self.alive, self.nfe, self.reason = set(range(self.n)), [0] * self.n, ["length"] * self.n
        if self.done or not self.alive:
            self.done = True
            return False
        self.step_no += 1
        for r in sorted(self.alive):
            self.nfe[r] += 1
            self.streamer.put_row(r, [WORD])
        stopped = {r for c in self.criteria for r in c(sorted(self.alive))}
        cancelled = self.cancelled & self.alive
        s.cancel_seen.append(cancelled)
        for r in sorted(self.alive):
            if r in cancelled:
                self.reason[r] = "cancelled"
            elif r in stopped:
                self.reason[r] = "stop"
            elif s.ends.get(r) == self.step_no:
                self.reason[r] = s.end_reason
            elif self.step_no >= self.steps:
                self.reason[r] = "length"
            else:
                continue
            self.alive.discard(r)
            self.streamer.end_row(r, self.reason[r], num_forwards=self.nfe[r])
        time.sleep(s.delay)
        return True

    def output(self):
        return SimpleNamespace(num_forwards=torch.tensor(self.nfe), finish_reason=self.reason, timings={})


def _engine(fake, start: bool = True, **kw) -> Engine:
    """``start=False``: the caller submits first and starts the worker after, so that which requests share
    a call does not depend on how fast a loaded machine runs the submits (batch_wait is 5 ms)."""
    kw.setdefault("batch_wait_ms", 5)
    e = Engine(None, TOK, session_factory=fake, **kw)
    if start:
        e.start()
    return e


async def _drain(req, until="stats"):
    out = []
    async for ev in req.events(until=until):
        out.append((ev.kind, ev.index, time.perf_counter()))
    return out


def test_same_settings_share_a_call_and_rows_finish_early():
    async def main():
        fake = Scripted(ends={0: 2}, steps=30, delay=0.01)
        e = _engine(fake, start=False)
        try:
            a = e.submit([[5, 6]], n=1, cfg=CFG, max_tokens=64)
            b = e.submit([[7]], n=1, cfg=CFG, max_tokens=64)
            e.start()
            (ea, eb) = await asyncio.gather(_drain(a, until="finish"), _drain(b))
        finally:
            e.stop()
        assert fake.calls == [2]
        t_a_finish = next(t for k, _, t in ea if k == "finish")
        t_b_finish = next(t for k, _, t in eb if k == "finish")
        assert t_b_finish - t_a_finish > 0.15  # a's row left long before the call ended
        kinds = [k for k, _, _ in eb]
        assert kinds[-2:] == ["finish", "stats"] and kinds.count("delta") >= 1

    asyncio.run(main())


def test_different_settings_and_seeded_sampling_run_apart():
    async def main():
        fake = Scripted(steps=3, delay=0)
        e = _engine(fake, start=False, max_batch_size=8)
        try:
            sampled = CFG.replace(temperature=0.7)
            reqs = [e.submit([[5]], n=2, cfg=CFG, max_tokens=8),
                    e.submit([[6]], n=1, cfg=CFG.replace(threshold=0.5), max_tokens=8),  # a per-row option
                    e.submit([[7]], n=1, cfg=CFG, max_tokens=4),
                    e.submit([[7]], n=1, cfg=CFG.replace(block_length=4), max_tokens=4),
                    e.submit([[8]], n=1, cfg=sampled.replace(seed=1), max_tokens=8, isolated=True),
                    e.submit([[9]], n=1, cfg=sampled.replace(seed=1), max_tokens=8, isolated=True),
                    e.submit([[9]], n=1, cfg=sampled, max_tokens=8)]  # unseeded: temperature is per row
            e.start()
            await asyncio.gather(*[_drain(r) for r in reqs])
        finally:
            e.stop()
        assert sorted(fake.calls) == [1, 1, 1, 5]  # {req0 x2, req1, req2, req6}, {req3}, {req4}, {req5}
        shared = next(v for n, v in zip(fake.calls, fake.values) if n == 5)
        assert shared == {"threshold": [CFG.threshold, CFG.threshold, 0.5, CFG.threshold, CFG.threshold],
                          "temperature": [CFG.temperature] * 4 + [0.7]}

    asyncio.run(main())


def test_caps_stop_strings_and_cancellation_end_rows_in_the_loop():
    async def main():
        fake = Scripted(steps=40, delay=0.005)
        e = _engine(fake)
        try:
            capped = e.submit([[5]], n=1, cfg=CFG, max_tokens=3)
            stopped = e.submit([[5]], n=1, cfg=CFG, max_tokens=64, stop=(" cat cat",))
            gone = e.submit([[5]], n=1, cfg=CFG, max_tokens=64)
            events = asyncio.gather(_drain(capped), _drain(stopped))
            await asyncio.sleep(0.05)
            gone.cancel()
            await events
        finally:
            e.stop()
        reasons = {r.index: r.finish_reason for r in capped.rows}
        assert reasons == {0: "length"} and capped.rows[0].text.text == "cat cat cat"
        assert stopped.rows[0].finish_reason == "stop" and stopped.rows[0].text.text == "cat"
        assert gone.rows[0].finish_reason == "cancelled"
        assert any(2 in c for c in fake.cancel_seen)  # the session was told to drop the abandoned row

    asyncio.run(main())


def test_a_row_at_the_step_limit_finishes_as_length():
    """The decoder's "step_limit" (a row that stopped committing real tokens) is "length" in the OpenAI API."""
    async def main():
        fake = Scripted(ends={0: 2}, steps=5, delay=0, end_reason="step_limit")
        e = _engine(fake)
        try:
            req = e.submit([[5]], n=1, cfg=CFG, max_tokens=64)
            await _drain(req)
        finally:
            e.stop()
        assert req.rows[0].finish_reason == "length"

    asyncio.run(main())


def test_queue_full_and_errors():
    async def main():
        fake = Scripted(steps=50, delay=0.01)
        e = _engine(fake, max_batch_size=1, max_queue=1)
        try:
            first = e.submit([[5]], n=1, cfg=CFG, max_tokens=64)
            while e.queue_depth:  # until it runs (a fixed sleep can be outrun on a loaded machine)
                await asyncio.sleep(0.01)
            e.submit([[5]], n=1, cfg=CFG, max_tokens=64)  # waiting
            with pytest.raises(ServingError) as info:
                e.submit([[5]], n=1, cfg=CFG, max_tokens=64)
            assert info.value.status == 503 and info.value.headers["Retry-After"] == "1"
            first.cancel()
        finally:
            e.stop()

        bad = _engine(Scripted(fail=GenerationConfigError("threshold must be in [0, 1]")))
        try:
            a = bad.submit([[5]], n=1, cfg=CFG, max_tokens=8)
            b = bad.submit([[6]], n=1, cfg=CFG, max_tokens=8)
            for req in (a, b):
                evs = [ev async for ev in req.events()]
                assert evs[-1].kind == "error" and evs[-1].error.status == 400
        finally:
            bad.stop()
        assert bad.batches == 3  # the session failed before decoding anything: retried one request at a time

    asyncio.run(main())


def test_retry_after_follows_the_queue_and_the_batch_time():
    from dllm.serving.errors import BatchClock

    clock = BatchClock()
    assert clock.retry_after(queued_rows=100, max_batch_size=8) == 1  # nothing measured yet
    clock.add(2.0)
    assert clock.retry_after(queued_rows=16, max_batch_size=8) == 4  # two batches of 2 s ahead
    assert clock.retry_after(queued_rows=1, max_batch_size=8) == 1
    assert clock.retry_after(queued_rows=10_000, max_batch_size=8) == 60  # capped
    clock.add(1.0)
    assert clock.seconds == pytest.approx(1.8)


def test_a_small_request_is_not_stuck_behind_a_long_one():
    """Sessions take turns step by step: a short request's first token, while a long request with other
    settings decodes, comes within one step of the long one after its first token when alone."""
    step = 0.05

    async def ttft(e, cfg):
        t0 = time.perf_counter()
        events = await _drain(e.submit([[5]], n=1, cfg=cfg, max_tokens=64))
        return next(t for k, _, t in events if k == "delta") - t0

    async def main():
        fake = Scripted(steps=200, delay=step)
        e = _engine(fake, max_batch_size=8)
        try:
            small = CFG.replace(block_length=4)
            fake.steps = 3
            alone = await ttft(e, small)
            fake.steps = 200
            long = e.submit([[6]], n=1, cfg=CFG, max_tokens=64)
            await asyncio.sleep(3 * step)  # the long session is running
            fake.steps = 3
            beside = await ttft(e, small)
            assert any(long in run.requests and not run.batch.finished() for run in e._running)  # still decoding
            long.cancel()
        finally:
            e.stop()
        return alone, beside

    alone, beside = asyncio.run(main())
    assert beside <= alone + step + 0.1, (alone, beside)  # without turns it would wait ~200 steps (10 s)
