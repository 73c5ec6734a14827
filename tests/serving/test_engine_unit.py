"""The engine with a scripted ``generate``: grouping, early finish, cancellation, isolation, errors."""

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
    """A fake ``generate``: each row commits one token per step and ends at its scripted step."""

    def __init__(self, ends: dict[int, int] | None = None, steps: int = 12, delay: float = 0.01, fail=None,
                 end_reason: str = "stop"):
        self.ends = ends or {}
        self.end_reason = end_reason
        self.steps = steps
        self.delay = delay
        self.fail = fail
        self.calls: list[int] = []
        self.cancel_seen: list[set[int]] = []

    def __call__(self, ids, attention_mask=None, generation_config=None, streamer=None, tokenizer=None):
        rows = ids.shape[0]
        self.calls.append(rows)
        if self.fail is not None:
            raise self.fail
        live, nfe, reason = set(range(rows)), [0] * rows, ["length"] * rows
        for step in range(1, self.steps + 1):
            for r in sorted(live):
                nfe[r] += 1
                streamer.put_row(r, [WORD])
            cancelled = streamer.cancelled_rows() & live
            self.cancel_seen.append(cancelled)
            for r in sorted(live):
                if r in cancelled:
                    reason[r] = "cancelled"
                elif self.ends.get(r) == step:
                    reason[r] = self.end_reason
                else:
                    continue
                live.discard(r)
                streamer.end_row(r, reason[r])
            if not live:
                break
            time.sleep(self.delay)
        for r in sorted(live):
            streamer.end_row(r, "length")
        return SimpleNamespace(num_forwards=torch.tensor(nfe), finish_reason=reason)


def _engine(fake, **kw) -> Engine:
    kw.setdefault("batch_wait_ms", 5)
    e = Engine(None, TOK, generate_fn=fake, **kw)
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
        e = _engine(fake)
        try:
            a = e.submit([[5, 6]], n=1, cfg=CFG, max_tokens=64)
            b = e.submit([[7]], n=1, cfg=CFG, max_tokens=64)
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
        e = _engine(fake, max_batch_size=8)
        try:
            sampled = CFG.replace(temperature=0.7)
            reqs = [e.submit([[5]], n=2, cfg=CFG, max_tokens=8),
                    e.submit([[6]], n=1, cfg=CFG.replace(threshold=0.5), max_tokens=8),
                    e.submit([[7]], n=1, cfg=CFG, max_tokens=4),
                    e.submit([[8]], n=1, cfg=sampled.replace(seed=1), max_tokens=8, isolated=True),
                    e.submit([[9]], n=1, cfg=sampled.replace(seed=1), max_tokens=8, isolated=True)]
            await asyncio.gather(*[_drain(r) for r in reqs])
        finally:
            e.stop()
        assert sorted(fake.calls) == [1, 1, 1, 3]  # {req0 x2, req2}, {req1}, {req3}, {req4}

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
        assert any(2 in c for c in fake.cancel_seen)  # the loop was told to drop the abandoned row

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
            await asyncio.sleep(0.05)  # running
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
        assert bad.batches == 3  # the batch failed before decoding anything: retried one request at a time

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
