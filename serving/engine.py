"""The engine: one asyncio-facing request queue and ONE decoding worker thread.

Requests are split into *rows* (one per prompt x ``n``). The worker takes waiting requests in
arrival order, groups those whose decoding settings are identical (the whole
:class:`DiffusionGenerationConfig`: strategy, canvas, block length, cache, thresholds, temperature,
...), and runs one ``model.generate`` over up to ``max_batch_size`` rows. A :class:`BatchStreamer`
turns each row's newly committed tokens into text events for the request's ``asyncio.Queue`` and
cancels rows that are done from the server's point of view (stop string, ``max_tokens``) or whose
client went away. Events cross threads through an outbox that the event loop drains, with at most
one wake-up pending: the loop shares the GIL with the worker, so every wake-up it handles delays
the next decoding step (hence also ``stream_interval_ms``).

Rows leave as soon as they finish (the decoding loop retires finished and cancelled rows at once,
so they stop costing compute) and **join a running call** where the decoding loop supports it
(continuous batching, ``dllm.decoding.joining``: the semi-AR strategies at every block boundary, D2F
before every forward): the loop polls ``_Streamer.admit_rows``, which hands over waiting requests
with the same config, in arrival order, while the head of the queue is such a request and the
rows fit in ``max_batch_size`` (an incompatible request at the head stops joining, so the call
drains and that request runs next: nothing starves). In D2F calls a request joins only while the
running rows' forward windows span at most ``join_max_spread_blocks`` blocks
(``dllm.decoding.joining.may_join``): staggered rows make every forward cover the union of their windows.
Joining is opt-in (``join=True``, ``dllm serve --join``): with short answers on CPU it measured slower than
batching between calls (docs/serving.md). Other strategies (LoPA, d3LLM) take new
rows between ``generate`` calls only. At temperature 0 a joined row gives the same text as when it runs
alone. A request's rows always run in the same batch. A request that samples (temperature > 0)
with a ``seed`` runs in a batch of its own (nothing joins it), so its output depends only on the
request, not on its neighbours.

Per row the request's queue gets ``delta`` events (new text), one ``finish`` event as soon as the
row ends, and one ``stats`` event with its forward count (when the decoder reports it: today at the
end of the ``generate`` call).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm.decoding.config import DiffusionGenerationConfig
from dllm.decoding.streaming import BatchStreamer
from dllm.decoding.textstream import RowText

from .errors import BatchClock, ServingError, internal, queue_full, shutting_down

log = logging.getLogger("dllm.serving")


@dataclass
class Event:
    kind: str  # "delta" (new text) | "finish" (the row ended) | "stats" (its forward count) | "error"
    index: int = 0
    text: str = ""
    finish_reason: str | None = None
    info: dict = field(default_factory=dict)
    error: ServingError | None = None


class Row:
    def __init__(self, request: EngineRequest, index: int, prompt_ids: list[int], text: RowText) -> None:
        self.request = request
        self.index = index
        self.prompt_ids = prompt_ids
        self.text = text
        self.finish_reason: str | None = None
        self.eos = False
        self.num_forwards: int | None = None
        self.finish_sent = False
        self.reported = False

    @property
    def completion_tokens(self) -> int:
        return self.text.n_tokens + (1 if self.eos else 0)


class EngineRequest:
    """A submitted request: its rows, its decoding config and the queue its events arrive on."""

    def __init__(self, engine: Engine, prompts: list[list[int]], n: int, cfg: DiffusionGenerationConfig,
                 max_tokens: int, stop: tuple[str, ...], isolated: bool, bind_loop: bool = True) -> None:
        self.engine = engine
        self.cfg = cfg
        self.key: Any = (cfg, id(self)) if isolated else (cfg, None)
        # bind_loop=False: a request whose events leave through a pipe (serving.engine_process)
        self.loop = asyncio.get_running_loop() if bind_loop else None
        self.queue: asyncio.Queue[Event] | None = asyncio.Queue() if bind_loop else None
        self.rows = [Row(self, p_i * n + j, prompt, RowText(engine.detok_tokenizer, max_tokens=max_tokens, stop=stop))
                     for p_i, prompt in enumerate(prompts) for j in range(n)]
        self.cancelled = False
        self.submitted = time.perf_counter()
        self.arrival = 0.0  # time.monotonic() when queued

    # -- loop side ---------------------------------------------------------------------------
    def cancel(self) -> None:
        """The client went away (or the response is complete): stop any work left."""
        if not self.cancelled:
            self.cancelled = True
            self.engine._forget(self)

    async def events(self, until: str = "stats"):
        """Events until every row has sent ``until`` (``"finish"`` or ``"stats"``), or an error.

        A row's ``finish`` comes as soon as it ends; its ``stats`` (forward count) may come only
        when its ``generate`` call returns.
        """
        async for batch in self.event_batches(until):
            for ev in batch:
                yield ev

    async def event_batches(self, until: str = "stats"):
        """Like :meth:`events`, but everything already queued comes at once (one list per wake-up).

        When the event loop falls behind the decoder, a streaming response then sends several
        steps' text in one write instead of one write per step.
        """
        remaining = len(self.rows)
        while remaining:
            batch = [await self.queue.get()]
            while not self.queue.empty():
                batch.append(self.queue.get_nowait())
            for i, ev in enumerate(batch):
                if ev.kind == until:
                    remaining -= 1
                elif ev.kind == "error":
                    yield batch[: i + 1]
                    return
            yield batch

    # -- worker side -------------------------------------------------------------------------
    def _emit(self, ev: Event) -> None:
        self.engine._post([(self, ev)])


class _Streamer(BatchStreamer):
    """The decoding loop's view of a batch (see ``dllm.decoding.streaming.BatchStreamer``)."""

    def __init__(self, engine: Engine, rows: list[Row], requests: list[EngineRequest]) -> None:
        self.engine = engine
        self.rows = rows  # by row index in the generate call; rows that join are appended
        self.requests = list(requests)  # every request of the call, joined ones included
        self.key = requests[0].key
        self.joins_rows = engine.join and self.key[1] is None  # isolated (seeded sampling) calls take nobody
        self.join_max_spread_blocks = engine.join_max_spread_blocks
        self.touched = False
        self._buffer: list[tuple[EngineRequest, Event]] = []
        self._urgent = False  # a row's first text or its end is buffered: send it soon
        self._last_flush = time.perf_counter()

    def put_row(self, row: int, token_ids: list[int]) -> None:
        self.touched = True
        r = self.rows[row]
        if r.finish_reason is not None:
            return
        first = r.text.sent == 0
        text = r.text.add(token_ids)
        if text:
            self._buffer.append((r.request, Event("delta", r.index, text)))
            self._urgent |= first
        if r.text.finished is not None:  # stop string or max_tokens: the server ends this row
            r.finish_reason = r.text.finished
            self._urgent = True

    def end_row(self, row: int, finish_reason: str, **stats: Any) -> None:
        self.touched = True
        r = self.rows[row]
        # A row the decoder cut at its step limit (max_steps) was cut short like one at max_tokens:
        # the OpenAI API knows "length", not the decoder's "step_limit".
        finish_reason = "length" if finish_reason == "step_limit" else finish_reason
        if r.finish_reason is None:
            text = r.text.finish(finish_reason)
            if text:
                self._buffer.append((r.request, Event("delta", r.index, text)))
            r.finish_reason = r.text.finished
            # The decoder says "stop" only for EOS here (the server gives it no stop strings).
            r.eos = finish_reason == "stop" and not r.text.stop_hit
        self.engine._finish(r, self._buffer)
        self._urgent = True
        if "num_forwards" in stats:  # decoders that report per-row stats at once
            r.num_forwards = int(stats["num_forwards"])
            self.engine._report(r, self._buffer)  # buffered: it must follow the row's last delta and finish

    def cancelled_rows(self) -> set[int]:
        # Called once per commit, right after the step's put_row calls. The text goes to the event
        # loop after every step, or every stream_interval when steps are faster (a quarter of it for a
        # row's first text or its end): the loop shares the GIL with this thread, so each wake-up it
        # handles delays the next step.
        elapsed = time.perf_counter() - self._last_flush
        interval = self.engine.stream_interval
        if elapsed >= interval or (self._urgent and elapsed >= interval / 4):
            self.flush()
        stopping = self.engine._stopping
        return {i for i, r in enumerate(self.rows)
                if stopping or r.request.cancelled or r.finish_reason is not None}

    def admit_rows(self, first_row: int, live_rows: int) -> list[list[int]]:
        """Continuous batching: waiting requests that join this call now (see ``Engine._admit``)."""
        if first_row != len(self.rows):  # the decoder numbers rows as we do; never guess otherwise
            log.error("admit_rows: decoder row %d != engine row %d; not joining", first_row, len(self.rows))
            return []
        joined = self.engine._admit(self.key, live_rows)
        prompts = []
        for req in joined:
            self.requests.append(req)
            for r in req.rows:
                self.rows.append(r)
                prompts.append(r.prompt_ids)
        if joined:
            m = self.engine.metrics
            if m is not None:
                m.joined_rows.inc(len(prompts))
                m.running_rows.set(live_rows + len(prompts))
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%d rows (%d requests) joined a running call of %d rows", len(prompts), len(joined),
                          live_rows)
        return prompts

    def flush(self) -> None:
        self._urgent = False
        self._last_flush = time.perf_counter()
        if self._buffer:
            items, self._buffer = self._buffer, []
            self.engine._post(items)


class Engine:
    """Owns the model; ``submit`` from the event loop, decoding happens on the worker thread."""

    def __init__(self, model, tokenizer, *, max_batch_size: int = 8, max_queue: int = 256,
                 batch_wait_ms: float = 10.0, stream_interval_ms: float = 20.0, join: bool = False,
                 join_max_spread_blocks: float | None = None, metrics=None, generate_fn=None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        # The worker decodes with its own copy: a Rust tokenizer must not be used by two threads at once.
        self.detok_tokenizer = copy.deepcopy(tokenizer)
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.batch_wait = batch_wait_ms / 1000.0
        self.max_wait = 10 * self.batch_wait
        self.stream_interval = stream_interval_ms / 1000.0
        self.join = join  # continuous batching: waiting requests join the running call
        self.join_max_spread_blocks = join_max_spread_blocks  # D2F admission bound (decoding.joining.may_join)
        self.metrics = metrics
        self.generate_fn = generate_fn or model.generate
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self._pending: list[EngineRequest] = []
        self._cond = threading.Condition()
        self._last_arrival = 0.0
        self._batch_end = 0.0  # when the last generate call returned
        self._expect = 0  # requests in the last batch: closed-loop clients come back with as many
        # worker -> event loop: events wait in the outbox; one wake-up drains everything posted until then
        self._outbox: collections.deque[tuple[EngineRequest, Event]] = collections.deque()
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._draining = False  # shutdown began: finish the running call, admit nothing (drain)
        self.clock = BatchClock()  # batch durations, for a full queue's Retry-After
        self._thread: threading.Thread | None = None
        self.batches = 0
        self._running: list[EngineRequest] | None = None  # requests of the running call, joined ones included

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._worker, name="dllm-decode", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        for req in pending:
            req._emit(Event("error", error=shutting_down()))
        if self._thread is not None:
            self._thread.join(timeout)

    def drain(self) -> None:
        """Shutdown begins: new requests get 503 ``shutting_down`` and so do the queued ones, now; the
        running call finishes (its rows keep streaming), and no request joins it."""
        with self._cond:
            self._draining = True
            pending, self._pending = self._pending, []
            self._set_depth()
        for req in pending:
            req._emit(Event("error", error=shutting_down()))

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    @property
    def alive(self) -> bool:
        """False once the worker thread has died (``/health`` then answers 503)."""
        return self._thread is None or self._thread.is_alive()

    # -- loop side ---------------------------------------------------------------------------
    def submit(self, prompts: list[list[int]], *, n: int, cfg: DiffusionGenerationConfig, max_tokens: int,
               stop: tuple[str, ...] = (), isolated: bool = False) -> EngineRequest:
        req = EngineRequest(self, prompts, n, cfg, max_tokens, stop, isolated)
        self._loop = req.loop
        with self._cond:
            if self._stopping or self._draining:
                raise shutting_down()
            if len(self._pending) >= self.max_queue:
                queued = sum(len(r.rows) for r in self._pending)
                raise queue_full(self.clock.retry_after(queued, self.max_batch_size))
            self._pending.append(req)
            self._last_arrival = req.arrival = time.monotonic()
            self._set_depth()
            self._cond.notify()
        return req

    def _post(self, items: list[tuple[EngineRequest, Event]]) -> None:
        """Hand events to the event loop (any thread); at most one wake-up is pending at a time."""
        self._outbox.extend(items)
        if not self._wake_pending and self._loop is not None:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                self._wake_pending = False

    def _drain(self) -> None:
        self._wake_pending = False  # before draining: anything posted from now on wakes the loop again
        while self._outbox:
            req, ev = self._outbox.popleft()
            req.queue.put_nowait(ev)

    def _forget(self, req: EngineRequest) -> None:
        with self._cond:
            if req in self._pending:
                self._pending.remove(req)
                self._set_depth()

    def _set_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._pending))

    # -- worker side -------------------------------------------------------------------------
    def _next_batch(self) -> list[EngineRequest] | None:
        with self._cond:
            while not self._pending and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            # Collect before starting a batch that is not full. Two signals say more work is coming:
            # requests are still arriving (a gap of batch_wait ends that), and the clients served by the
            # batch that just ended (closed-loop clients send their next request at once): wait until as
            # many requests are pending as that batch had. Both waits end max_wait after they began.
            start = max(self._batch_end, self._pending[0].arrival)
            cap = start + self.max_wait
            while not self._stopping:
                pending_rows = sum(len(r.rows) for r in self._pending)
                if pending_rows >= self.max_batch_size:
                    break
                now = time.monotonic()
                waits = [self._last_arrival + self.batch_wait]
                if len(self._pending) < self._expect:
                    waits.append(cap)
                left = min(max(waits), cap) - now
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._stopping or not self._pending:
                return None
            head = self._pending[0]
            batch, rows = [head], len(head.rows)
            if head.key[1] is None:
                for req in self._pending[1:]:
                    if req.key == head.key and rows + len(req.rows) <= self.max_batch_size:
                        batch.append(req)
                        rows += len(req.rows)
                        if rows == self.max_batch_size:
                            break
            for req in batch:
                self._pending.remove(req)
            self._set_depth()
            self._expect = len(batch)
            if log.isEnabledFor(logging.DEBUG):
                now = time.perf_counter()
                log.debug("batch of %d rows (%d requests; %d left waiting); arrivals %s ms ago", rows, len(batch),
                          len(self._pending), [round((now - r.submitted) * 1000, 1) for r in batch])
            return batch

    def _admit(self, key, live_rows: int) -> list[EngineRequest]:
        """Waiting requests that join a running call with batch key ``key`` (worker thread).

        From the head of the queue, in arrival order, while the head has the same key (same config,
        not isolated) and its rows fit beside ``live_rows`` in ``max_batch_size`` (a request larger
        than that joins only an empty call, as it would start one). The first request that does not
        qualify ends the scan, so a request with other settings waits only for the call to drain.
        """
        if not self.join or key[1] is not None:  # joining is off, or an isolated (seeded sampling) call
            return []
        out: list[EngineRequest] = []
        with self._cond:
            if self._stopping or self._draining:
                return []
            while self._pending:
                req = self._pending[0]
                n = len(req.rows)
                if req.key != key or (live_rows + n > self.max_batch_size and live_rows > 0):
                    break
                self._pending.pop(0)
                out.append(req)
                live_rows += n
            if out:
                self._set_depth()
        return out

    def _worker(self) -> None:
        while not self._stopping:
            batch = self._next_batch()
            if batch:
                try:
                    self._run(batch)
                except Exception:  # never let the worker die; the requests get an error
                    log.exception("decoding batch failed")
                    self._fail(self._running or batch, internal("decoding failed; see the server log"))
                self._running = None
                with self._cond:
                    self._batch_end = time.monotonic()

    def _run(self, batch: list[EngineRequest], retry_alone: bool = True) -> None:
        rows = [row for req in batch for row in req.rows]
        cfg = batch[0].cfg
        width = max(len(r.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, width - len(r.prompt_ids):] = 1
        streamer = _Streamer(self, rows, batch)
        rows = streamer.rows  # grows when requests join the running call
        self._running = streamer.requests
        m = self.metrics
        if m is not None:
            m.running_rows.set(len(rows))
            m.active_branches.set(len(rows) * (cfg.lopa_branches + 1) if cfg.strategy == "lopa" else 0)
        self.batches += 1
        t0 = time.perf_counter()
        try:
            out = self.generate_fn(ids, attention_mask=mask, generation_config=cfg, streamer=streamer,
                                   tokenizer=self.detok_tokenizer)
        except Exception as err:
            streamer.flush()
            batch = streamer.requests  # joined requests included
            if not streamer.touched and retry_alone and len(batch) > 1:
                log.warning("batch of %d requests failed before decoding (%s); running them one by one", len(batch), err)
                for req in batch:
                    self._run([req], retry_alone=False)
                return
            error = _as_error(err)
            if error.status < 500:
                log.warning("rejected a batch at decoding time: %s", err)
            else:
                log.exception("decoding failed")
            self._fail(batch, error)
            return
        finally:
            if m is not None:
                m.batch_size.observe(len(rows))
                m.running_rows.set(0)
                m.active_branches.set(0)
                m.generate_seconds.observe(time.perf_counter() - t0)
            self.clock.add(time.perf_counter() - t0)
        if m is not None:
            m.forward_seconds.inc(float(out.timings.get("forward_seconds", 0.0)))
        streamer.flush()
        for i, r in enumerate(rows):
            if r.finish_reason is None:  # every row is ended by the decoder; be safe anyway
                streamer.end_row(i, out.finish_reason[i])
            self._finish(r)
            if r.num_forwards is None:
                r.num_forwards = int(out.num_forwards[i])
            self._report(r)

    def _finish(self, r: Row, buffer: list | None = None) -> None:
        """The row ended: its text is complete (its forward count may come later, see ``_report``)."""
        if r.finish_sent:
            return
        r.finish_sent = True
        if r.finish_reason == "cancelled" and not r.request.cancelled:  # the server is stopping, not the client
            ev = Event("error", error=ServingError(503, "the server is shutting down", type="server_error",
                                                   code="shutting_down", retry=True))
        else:
            ev = Event("finish", r.index, finish_reason=r.finish_reason,
                       info={"completion_tokens": r.completion_tokens})
        if buffer is not None:
            buffer.append((r.request, ev))
        else:
            r.request._emit(ev)
        if self.metrics is not None:
            if r.finish_reason == "cancelled":
                self.metrics.cancelled_rows.inc()
            else:
                self.metrics.generation_tokens.inc(r.completion_tokens)

    def _report(self, r: Row, buffer: list | None = None) -> None:
        """The row's forward count is known: send its stats."""
        if r.reported:
            return
        r.reported = True
        nfe = r.num_forwards or 0
        tokens = r.completion_tokens
        info = {"num_forwards": nfe, "completion_tokens": tokens, "tpf": (tokens / nfe) if nfe else 0.0}
        if self.metrics is not None and r.finish_reason != "cancelled":
            self.metrics.forwards.observe(nfe)
            if nfe:
                self.metrics.tpf.observe(tokens / nfe)
        ev = Event("stats", r.index, finish_reason=r.finish_reason, info=info)
        if buffer is not None:
            buffer.append((r.request, ev))
        else:
            r.request._emit(ev)

    def _fail(self, batch: list[EngineRequest], error: ServingError) -> None:
        for req in batch:
            req._emit(Event("error", error=error))


def _as_error(err: Exception) -> ServingError:
    from dllm.decoding.config import GenerationConfigError
    from dllm.decoding.registry import StrategyError

    if isinstance(err, (GenerationConfigError, StrategyError)):
        return ServingError(400, str(err))
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return ServingError(500, "out of memory while decoding this request; send a shorter prompt, fewer "
                                 "tokens or a smaller n", type="server_error", code="out_of_memory")
    return internal(f"decoding failed: {type(err).__name__}")
