"""The engine: a request queue, a scheduler and ONE decoding worker thread that steps decoding batches.

Requests are split into *rows* (one per prompt x ``n``). Each engine step is **schedule -> run ->
postprocess**:

* **schedule** (``_schedule``): waiting requests join a running batch of the same settings where the
  strategy can take rows mid-call and joining is on (continuous batching, ``dllm.decoding.joining``), or
  start a new :class:`~dllm.decoding.decode_session.DecodeSession` with the other waiting requests of the same
  settings (up to ``max_batch_size`` rows), while fewer than ``max_batches`` run. "Same settings" is the
  whole :class:`DiffusionGenerationConfig` except the options a strategy lets each row set
  (``Strategy.row_options``: ``threshold``, ``skip_threshold``, ...) and those it does not read, so requests
  that differ only there share every forward; on a block-causal model without a cache, ``threshold``
  requests batch with ``d2f`` ones (:mod:`dllm.decoding.batching`). A batch that is not full waits for more requests until none arrived for
  ``batch_wait`` (or, after a batch, for as many requests as it had, up to ``10 x batch_wait``); a
  request whose settings match a running batch (that it cannot join) starts with the next batch of
  those settings, when the running one ends, while requests of other settings may start meanwhile:
  same-settings work is not split into small batches. With joining on (``join``), a request joins a
  running batch of its settings only where that batch decodes it from its next step
  (``DecodeSession.admits_now``: every step for most strategies, block boundaries for ``vanilla``, Dream's
  schedules, ``sdar``, ``fast_dllm_v2`` and LoPA on the threshold rule); otherwise
  (and for strategies that never join: classifier-free guidance, LoPA on a third-party branch executor)
  it starts a batch of its own at once, so every request streams after at most one step of each
  running batch. A request that samples (temperature > 0) with a ``seed`` runs in a
  batch of its own, so its output depends only on the request.
* **run**: one ``step()`` of the next batch in turn (round robin): one forward and its commits. A
  large request therefore holds the decoder for one step at a time, and a small request that arrives
  meanwhile streams its first text after at most one step of every running batch (time slicing).
* **postprocess**: the step's text goes to the responses (after every step, or every
  ``stream_interval`` when steps are faster); rows whose client went away are cancelled in their
  batch; finished batches report their timings.

The decoder calls back only to hand over output (:class:`_Streamer`: ``put_row``/``end_row``) and to ask
the server's own stopping criterion (a row that hit its ``max_tokens`` or a stop string in the text).
Events cross threads through an outbox that the event loop drains, with at most one wake-up pending:
the loop shares the GIL with the worker, so every wake-up it handles delays the next step.

Per row the request's queue gets ``delta`` events (new text), one ``finish`` event as soon as the row
ends, and one ``stats`` event with its forward count right after it.
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

from dllm.decoding.batching import batch_form
from dllm.decoding.config import DiffusionGenerationConfig
from dllm.decoding.decode_session import DecodeSession
from dllm.decoding.registry import get_strategy
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
        # The config its batch decodes with (another strategy's where its rows decode exactly as that one's:
        # threshold rows run as d2f rows on a block-causal model), its row options' values, and the key of
        # the settings it must share with the other requests of a batch (dllm.decoding.batching).
        form = batch_form(engine.model, cfg)
        self.cfg = form.cfg
        self.row_values = form.row_values
        self.key: Any = (form.key, id(self)) if isolated else (form.key, None)
        self.branches = get_strategy(form.cfg.strategy).branches
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

        A row's ``finish`` comes as soon as it ends, its ``stats`` (forward count) right after.
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
    """A batch's output: text events per row, buffered until the step's postprocess flushes them."""

    def __init__(self, engine: Engine, rows: list[Row]) -> None:
        self.engine = engine
        self.rows = rows  # by row index in the batch; rows that join are appended
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
        if r.text.finished is not None:  # stop string or max_tokens: the server ends this row (``stops``)
            r.finish_reason = r.text.finished
            self._urgent = True

    def end_row(self, row: int, finish_reason: str, num_forwards: int | None = None) -> None:
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
        if num_forwards is not None:
            r.num_forwards = int(num_forwards)
            self.engine._report(r, self._buffer)  # buffered: it must follow the row's last delta and finish

    def stops(self, rows: list[int]) -> list[int]:
        """The server's stopping criterion: rows it ended itself (``max_tokens``, a stop string in the text)."""
        return [i for i in rows if self.rows[i].finish_reason is not None]

    def maybe_flush(self) -> None:
        # The text goes to the event loop after every step, or every stream_interval when steps are faster
        # (a quarter of it for a row's first text or its end): the loop shares the GIL with this thread,
        # so each wake-up it handles delays the next step.
        elapsed = time.perf_counter() - self._last_flush
        interval = self.engine.stream_interval
        if elapsed >= interval or (self._urgent and elapsed >= interval / 4):
            self.flush()

    def flush(self) -> None:
        self._urgent = False
        self._last_flush = time.perf_counter()
        if self._buffer:
            items, self._buffer = self._buffer, []
            self.engine._post(items)


class _Running:
    """A running batch and the requests it serves."""

    def __init__(self, batch, streamer: _Streamer, key, requests: list[EngineRequest]) -> None:
        self.batch = batch
        self.streamer = streamer
        self.rows = streamer.rows
        self.key = key
        self.requests = list(requests)
        self.branches = requests[0].branches
        self.started = time.perf_counter()
        self.cancel_sent: set[int] = set()

    @property
    def open_rows(self) -> int:
        return sum(1 for r in self.rows if not r.finish_sent)


class Engine:
    """Owns the model; ``submit`` from the event loop, decoding happens on the worker thread."""

    def __init__(self, model, tokenizer, *, max_batch_size: int = 8, max_queue: int = 256,
                 batch_wait_ms: float = 10.0, stream_interval_ms: float = 20.0, join: bool = False,
                 join_max_spread_blocks: float | None = None, max_batches: int = 4, metrics=None,
                 branch_executor=None, session_factory=None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        # The worker decodes with its own copy: a Rust tokenizer must not be used by two threads at once.
        self.detok_tokenizer = copy.deepcopy(tokenizer)
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.batch_wait = batch_wait_ms / 1000.0
        self.max_wait = 10 * self.batch_wait
        self.stream_interval = stream_interval_ms / 1000.0
        self.join = join  # continuous batching: waiting requests join a running batch
        self.join_max_spread_blocks = join_max_spread_blocks  # D2F admission bound (decoding.joining.may_join)
        self.max_batches = max_batches
        self.metrics = metrics
        # LoPA branches on other processes (a BranchParallelExecutor's factory): one such batch at a time
        self.branch_executor = branch_executor
        self.session_factory = session_factory or self._new_session
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        self._pending: list[EngineRequest] = []
        self._cond = threading.Condition()
        self._last_arrival = 0.0
        self._batch_end = 0.0  # when the last batch finished
        self._expect = 0  # requests in the last batch started: closed-loop clients come back with as many
        # worker -> event loop: events wait in the outbox; one wake-up drains everything posted until then
        self._outbox: collections.deque[tuple[EngineRequest, Event]] = collections.deque()
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._draining = False  # shutdown began: running batches finish, nothing new is admitted
        self.clock = BatchClock()  # batch durations, for a full queue's Retry-After
        self._thread: threading.Thread | None = None
        self.batches = 0  # batches started
        self._running: list[_Running] = []
        self._turn = -1

    def _new_session(self, cfg, *, streamer, criteria, joinable, branches):
        return DecodeSession(self.model, cfg, tokenizer=self.detok_tokenizer, streamer=streamer, criteria=criteria,
                             joinable=joinable, join_max_spread_blocks=self.join_max_spread_blocks,
                             branch_executor=self.branch_executor if branches else None)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._worker, name="dllm-decode", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Queued requests get 503 now; running rows are cancelled at their next step (503 too)."""
        with self._cond:
            self._stopping = True
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        for req in pending:
            req._emit(Event("error", error=shutting_down()))
        if self._thread is not None:
            self._thread.join(timeout)

    def drain(self) -> None:
        """Shutdown begins: new requests get 503 ``shutting_down`` and so do the queued ones, now; running
        batches finish (their rows keep streaming), and nothing joins them."""
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
        self._enqueue(req)
        return req

    def _enqueue(self, req: EngineRequest) -> None:
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
            self._cond.notify()

    def _set_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._pending))

    def _started(self, reqs: list[EngineRequest]) -> None:
        """Requests that left the queue for a batch (the engine process reports them)."""

    # -- worker side: schedule ---------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            run = self._schedule()
            if run is None:
                return
            try:
                self._step(run)
            except Exception:  # never let the worker die; the batch's requests get an error
                log.exception("decoding step failed")
                self._end(run, error=internal("decoding failed; see the server log"))

    def _schedule(self) -> _Running | None:
        """Admit what can run now; the batch to step next, or None when the engine stops."""
        with self._cond:
            while True:
                if self._stopping and not self._running:
                    return None
                now = time.monotonic()
                wake = self._admit(now) if not (self._stopping or self._draining) else None
                if self._running:
                    self._turn = (self._turn + 1) % len(self._running)
                    return self._running[self._turn]
                self._cond.wait(None if wake is None else max(0.0, wake - now))

    def _admit(self, now: float) -> float | None:
        """Place waiting requests (called with the lock held). Returns when to look again, if something waits."""
        started: list[EngineRequest] = []
        if self.join:
            ranks_wanted = False  # an older LoPA request of other settings waits for the branch ranks
            for req in list(self._pending):
                shares_ranks = req.branches and self.branch_executor is not None
                if shares_ranks and ranks_wanted:
                    continue  # joining would keep the running LoPA batch alive and the ranks from the older one
                run = self._joinable(req)
                if run is not None:
                    self._pending.remove(req)
                    self._join(run, req)
                    started.append(req)
                elif shares_ranks:
                    ranks_wanted = True
        wake = None
        while self._pending and len(self._running) < self.max_batches:
            group, ready_at = self._next_group(now)
            if group is None:
                wake = ready_at
                break
            for req in group:
                self._pending.remove(req)
            self._start_session(group)
            started += group
        if started:
            self._set_depth()
            self._started(started)
        return wake

    def _joinable(self, req: EngineRequest) -> _Running | None:
        if req.key[1] is not None:
            return None
        for run in self._running:
            if (run.key == req.key and run.batch.admits_now and not run.batch.finished()
                    and run.open_rows + len(req.rows) <= self.max_batch_size):
                return run
        return None

    def _next_group(self, now: float) -> tuple[list[EngineRequest] | None, float | None]:
        """The oldest waiting request and those that batch with it, once the batch is ready to start;
        else (None, when it will be)."""
        for head in self._pending:
            if head.branches and self.branch_executor is not None and any(r.branches for r in self._running):
                continue  # the branch ranks serve one LoPA batch at a time
            group, rows = [head], len(head.rows)
            if head.key[1] is None:
                for req in self._pending:
                    if req is not head and req.key == head.key and rows + len(req.rows) <= self.max_batch_size:
                        group.append(req)
                        rows += len(req.rows)
            same = [run for run in self._running if run.key == head.key]
            if rows < self.max_batch_size and same and not (self.join and not any(r.batch.admits_now for r in same)):
                # a batch of its settings is running: it starts with the next one, when that ends (or joins
                # it, where joining is on), so same-settings work is not split into small batches; requests
                # of other settings may start meanwhile. With joining on, a request that no running batch of
                # its settings would decode from its next step (guidance; a loop inside a block it joins
                # only at the block's end) starts a batch of its own at once instead, stepped in turn with
                # the running one: latency first, as joining is
                continue
            ready_at = self._ready_at(head, rows)
            if ready_at <= now:
                return group, None
            return None, ready_at  # the oldest request that may start decides: nothing overtakes it
        return None, None

    def _ready_at(self, head: EngineRequest, rows: int) -> float:
        """When a batch headed by ``head`` with ``rows`` rows starts. Two signals say more work is coming:
        requests are still arriving (a gap of batch_wait ends that), and the clients served by the batch
        that just ended (closed-loop clients send their next request at once). Every wait ends max_wait
        after it began."""
        if rows >= self.max_batch_size:
            return 0.0
        cap = max(self._batch_end, head.arrival) + self.max_wait
        ready = self._last_arrival + self.batch_wait
        if not self._running and len(self._pending) < self._expect:
            ready = cap
        return min(ready, cap)

    def _start_session(self, group: list[EngineRequest]) -> None:
        head = group[0]
        rows = [row for req in group for row in req.rows]
        streamer = _Streamer(self, [])
        joinable = self.join and head.key[1] is None
        try:
            batch = self.session_factory(head.cfg, streamer=streamer, criteria=[streamer.stops], joinable=joinable,
                                           branches=head.branches)
        except Exception as err:  # a setting the decoder refuses for this model: a 400 for these requests
            self._fail(group, _as_error(err))
            return
        run = _Running(batch, streamer, head.key, group)
        try:
            self._add(run, rows, group)
        except Exception as err:
            self._fail(group, _as_error(err))
            return
        self._running.append(run)
        self.batches += 1
        self._expect = len(group)
        if log.isEnabledFor(logging.DEBUG):
            now = time.perf_counter()
            log.debug("batch of %d rows (%d requests; %d left waiting); arrivals %s ms ago", len(rows), len(group),
                      len(self._pending), [round((now - r.submitted) * 1000, 1) for r in group])

    def _add(self, run: _Running, rows: list[Row], reqs: list[EngineRequest]) -> None:
        values: dict[str, list] = {name: [] for name in reqs[0].row_values}
        for req in reqs:
            for name, value in req.row_values.items():
                values[name] += [value] * len(req.rows)
        indices = run.batch.add_rows([r.prompt_ids for r in rows], **values)
        if indices.start != len(run.rows):  # the batch numbers rows as we do; never guess otherwise
            raise RuntimeError(f"batch row {indices.start} != engine row {len(run.rows)}")
        run.rows.extend(rows)

    def _join(self, run: _Running, req: EngineRequest) -> None:
        self._add(run, req.rows, [req])
        run.requests.append(req)
        if self.metrics is not None:
            self.metrics.joined_rows.inc(len(req.rows))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%d rows joined a running batch of %d rows", len(req.rows), run.batch.live)

    # -- worker side: run and postprocess ----------------------------------------------------
    def _step(self, run: _Running) -> None:
        try:
            more = run.batch.step()
        except Exception as err:
            run.streamer.flush()
            if not run.streamer.touched and len(run.requests) > 1:
                log.warning("a batch of %d requests failed before decoding (%s); running them one by one",
                            len(run.requests), err)
                self._retry_alone(run)
                return
            error = _as_error(err)
            if error.status < 500:
                log.warning("rejected a request at decoding time: %s", err)
            else:
                log.exception("decoding failed")
            self._end(run, error=error)
            return
        for i, r in enumerate(run.rows):  # clients that went away, or the engine stopping: cancel the row
            if i not in run.cancel_sent and not r.finish_sent and (self._stopping or r.request.cancelled):
                run.batch.cancel(i)
                run.cancel_sent.add(i)
        if more and not run.batch.finished():
            run.streamer.maybe_flush()
            self._gauges()
        else:
            self._end(run)

    def _retry_alone(self, run: _Running) -> None:
        with self._cond:
            self._running.remove(run)
            for req in reversed(run.requests):  # at the head of the queue, each in a batch of its own
                for r in req.rows:
                    r.finish_sent = r.reported = False
                req.key = (req.key[0], id(req))
                self._pending.insert(0, req)
            self._set_depth()

    def _end(self, run: _Running, error: ServingError | None = None) -> None:
        """The batch finished (or failed): the last text, the rows' ends and stats, the timings."""
        seconds = time.perf_counter() - run.started
        with self._cond:
            if run in self._running:
                self._running.remove(run)
            self._batch_end = time.monotonic()
        self.clock.add(seconds)
        m = self.metrics
        if m is not None:  # before the last events go out: a client that saw its answer sees these too
            m.batch_size.observe(len(run.rows))
            m.generate_seconds.observe(seconds)
        if error is not None:
            run.streamer.flush()
            self._fail(run.requests, error)
        else:
            out = run.batch.output()
            if m is not None:
                m.forward_seconds.inc(float(out.timings.get("forward_seconds", 0.0)))
            for i, r in enumerate(run.rows):
                if r.finish_reason is None:  # every row is ended by the decoder; be safe anyway
                    run.streamer.end_row(i, out.finish_reason[i], num_forwards=int(out.num_forwards[i]))
                if r.num_forwards is None:
                    r.num_forwards = int(out.num_forwards[i])
                self._finish(r, run.streamer._buffer)
                self._report(r, run.streamer._buffer)
            self._gauges()
            run.streamer.flush()
        if error is not None:
            self._gauges()

    def _gauges(self) -> None:
        m = self.metrics
        if m is None:
            return
        live = [(run.batch.live, run) for run in list(self._running)]
        m.running_rows.set(sum(n for n, _ in live))
        m.active_branches.set(sum(n * (run.requests[0].cfg.lopa_branches + 1) for n, run in live if run.branches))

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
