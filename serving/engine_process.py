"""The engine in its own process: the HTTP front end and the decoding loop stop sharing one GIL.

With the engine in the server process, the event loop (HTTP parsing, SSE chunks, JSON) and the
decoding worker take turns on one interpreter lock, and every small torch op the worker runs gives
the lock up and waits to get it back. On a small model that costs a large share of each step (the
server ran at ~0.85x offline batching on 2 CPU cores, docs/serving.md). vLLM's V1 engine moved its
engine core into a separate process for the same reason.

:class:`RemoteEngine` (API process) has the interface the routes use (``submit`` returning a
request with ``events``/``event_batches``/``cancel``, ``queue_depth``, ``alive``, ``stop``).
The engine process runs the unchanged :class:`~dllm.serving.engine.Engine` (scheduler, batching,
joining, streamer, detokenization, stop strings) on the model it loads itself, and talks to the API
process over one pipe:

* API -> engine: ``("submit", rid, prompts, n, cfg, max_tokens, stop, isolated)``, ``("cancel", rid)``, ``("stop",)``;
* engine -> API: ``("ready", ModelInfo)`` or ``("failed", message)`` once, then
  ``("events", [(rid, Event), ...], metric_ops)`` and ``("started", [rid, ...])``.

Metrics the engine updates (batch size, forwards, TPF, ...) travel with the events as recorded
operations and are applied to the API process's registry, so ``/metrics`` is unchanged. Queue
depth (for 503 + ``Retry-After``) is counted on the API side: submitted and not yet started.
If the engine process dies, every open request gets an error and ``/health`` answers 503.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from dllm.decoding.config import DiffusionGenerationConfig

from .engine import Engine, EngineRequest, Event
from .errors import BatchClock, ServingError, internal, queue_full, shutting_down
from .settings import apply_generation_defaults

log = logging.getLogger("dllm.serving")


# -- what the API process knows about the model ------------------------------------------------------
def memory_slot_budget(model, fraction: float = 0.25) -> int:
    """Canvas slots (rows x (prompt + canvas)) whose KV cache fits in ``fraction`` of the memory free now."""
    from dllm.decoding.budget import available_bytes, slot_bytes

    free = available_bytes(model.get_input_embeddings().weight.device)
    return int(fraction * free // slot_bytes(model)) if free else 1 << 40


@dataclass
class ModelInfo:
    """The model as the API process sees it: no weights, just what requests are checked against."""

    diffusion_generation_config: DiffusionGenerationConfig
    is_block_causal: bool
    config: Any  # the model's (picklable) PretrainedConfig
    vocab_rows: int
    mask_token_id: int
    slot_budget: int  # canvas slots whose KV cache fits in a quarter of the memory free at load time

    @classmethod
    def from_model(cls, model, tokenizer) -> ModelInfo:
        from dllm.special_ids import require_mask_token

        base = model.diffusion_generation_config
        mask = base.mask_token_id if base.mask_token_id is not None else require_mask_token(model, tokenizer)
        return cls(base, bool(model.is_block_causal), model.config,
                   int(model.get_input_embeddings().weight.shape[0]), int(mask), memory_slot_budget(model))


# -- engine process ----------------------------------------------------------------------------------
class _Series:
    """Records ``inc``/``set``/``observe`` on one metric (and its labels) for the API process."""

    __slots__ = ("_labels", "_name", "_rec")

    def __init__(self, rec: MetricsRecorder, name: str, labels: tuple = ()) -> None:
        self._rec, self._name, self._labels = rec, name, labels

    def labels(self, *labels) -> _Series:
        return _Series(self._rec, self._name, labels)

    def inc(self, value: float = 1.0) -> None:
        self._rec.record((self._name, self._labels, "inc", value))

    def set(self, value: float) -> None:
        self._rec.record((self._name, self._labels, "set", value))

    def observe(self, value: float) -> None:
        self._rec.record((self._name, self._labels, "observe", value))


class MetricsRecorder:
    """Stands in for :class:`~dllm.serving.metrics.ServerMetrics` in the engine process."""

    def __init__(self) -> None:
        self._ops: list = []
        self._lock = threading.Lock()  # the worker and the pipe reader both record

    def __getattr__(self, name: str) -> _Series:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Series(self, name)

    def record(self, op: tuple) -> None:
        with self._lock:
            self._ops.append(op)

    def take(self) -> list:
        with self._lock:
            ops, self._ops = self._ops, []
        return ops


def apply_metric_ops(metrics, ops: list) -> None:
    """Replay recorded operations on the real registry (the API process owns queue depth itself)."""
    for name, labels, method, value in ops:
        if name == "queue_depth":
            continue
        series = getattr(metrics, name, None)
        if series is None:
            continue
        if labels:
            series = series.labels(*labels)
        getattr(series, method)(value)


class _ChildRequest(EngineRequest):
    """A request inside the engine process: no event loop; events go to the pipe."""

    def __init__(self, engine: ChildEngine, rid: int, prompts, n, cfg, max_tokens, stop, isolated) -> None:
        super().__init__(engine, prompts, n, cfg, max_tokens, stop, isolated, bind_loop=False)
        self.rid = rid
        self.open_rows = len(self.rows)  # rows whose stats event has not been sent


class ChildEngine(Engine):
    """The unchanged scheduler and worker; ``_post`` writes to the pipe instead of the event loop."""

    def __init__(self, send, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._send = send
        self.requests: dict[int, _ChildRequest] = {}
        self._lock = threading.Lock()

    def submit_remote(self, rid: int, prompts, n, cfg, max_tokens, stop, isolated) -> None:
        req = _ChildRequest(self, rid, prompts, n, cfg, max_tokens, stop, isolated)
        with self._cond:
            if self._stopping:
                err = ServingError(503, "the server is shutting down", type="server_error", code="shutting_down",
                                   retry=True, headers={"Retry-After": "1"})
                self._post([(req, Event("error", error=err))])
                return
            if len(self._pending) >= self.max_queue:
                self._post([(req, Event("error", error=queue_full()))])
                return
            self.requests[rid] = req
            self._pending.append(req)
            self._last_arrival = req.arrival = time.monotonic()
            self._cond.notify()

    def cancel_remote(self, rid: int) -> None:
        req = self.requests.pop(rid, None)  # the API side listens no more
        if req is not None:
            req.cancel()

    def _post(self, items) -> None:
        out = []
        for req, ev in items:
            out.append((req.rid, ev))
            if ev.kind == "stats":
                req.open_rows -= 1
            if ev.kind == "error" or req.open_rows <= 0:
                self.requests.pop(req.rid, None)
        with self._lock:
            self._send(("events", out, self.metrics.take()))

    def _started(self, reqs) -> None:  # called by the scheduler, with its lock held
        if reqs:
            with self._lock:
                self._send(("started", [r.rid for r in reqs]))


def _exit_with_parent(poll_s: float = 0.5) -> None:
    """End this process when the API process is gone, even one killed with SIGKILL while the model loads
    (the pipe's EOF is seen only once serving starts): a daemon thread watches the parent pid."""
    import os
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="dllm-parent-watch", daemon=True).start()


def engine_main(conn, spec: dict) -> None:
    """Entry point of the engine process: load the model, report ``ready``, serve the pipe."""
    import signal

    # Ctrl-C and a job-wide SIGTERM reach the whole process group: the API process shuts this one
    # down in order ("stop", then a kill after a timeout); EOF on the pipe ends it if the API process dies.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent()
    executor = None
    try:
        import torch

        from dllm.loading import load_model, resolve_model_path
        from dllm.text import load_tokenizer_for

        if spec.get("num_threads"):
            torch.set_num_threads(int(spec["num_threads"]))
        path = resolve_model_path(spec["model"])
        if spec.get("branch_parallel", 1) > 1:
            from dllm.decoding.lopa.branch_parallel import BranchParallelExecutor

            executor = BranchParallelExecutor(path, world_size=spec["branch_parallel"], dtype=spec.get("dtype"),
                                              device=spec.get("device"), num_threads=spec.get("num_threads"))
            model = executor.model
        else:
            model = load_model(path, dtype=spec.get("dtype"), device=spec.get("device"))
        apply_generation_defaults(model, spec.get("generation_defaults") or {})
        tokenizer = load_tokenizer_for(path)
        info = ModelInfo.from_model(model, tokenizer)
    except BaseException as err:  # noqa: BLE001 - everything is reported to the API process
        if executor is not None:
            executor.close()
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        conn.close()
        return

    def send(msg) -> None:
        try:
            conn.send(msg)
        except (BrokenPipeError, OSError):  # the API process is gone; the reader below ends too
            pass

    engine = ChildEngine(send, model, tokenizer, metrics=MetricsRecorder(),
                         branch_executor=executor.branch_factory if executor is not None else None,
                         **spec["engine"])
    conn.send(("ready", info))
    engine.start()
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "submit":
                engine.submit_remote(*msg[1:])
            elif kind == "cancel":
                engine.cancel_remote(msg[1])
            elif kind == "stop":
                break
    finally:
        engine.stop()
        if executor is not None:
            executor.close()
        conn.close()


# -- API process -------------------------------------------------------------------------------------
class RemoteRequest(EngineRequest):
    """The API side of a request whose rows decode in the engine process."""

    def __init__(self, engine: RemoteEngine, rid: int, num_rows: int) -> None:
        self.engine = engine
        self.rid = rid
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.rows = [None] * num_rows  # event_batches counts rows
        self.cancelled = False
        self.done = False  # every row reported (or an error came): nothing left to cancel
        self.open_rows = num_rows
        self.submitted = time.perf_counter()

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.engine._cancel(self)


@dataclass
class _Outstanding:
    requests: dict = field(default_factory=dict)  # rid -> RemoteRequest, until done
    waiting: set = field(default_factory=set)  # rids submitted and not yet taken into a batch


class RemoteEngine:
    """Starts the engine process and stands in for :class:`~dllm.serving.engine.Engine` in the API process."""

    def __init__(self, spec: dict, *, max_queue: int, metrics=None) -> None:
        self.spec = spec
        self.max_queue = max_queue
        self.metrics = metrics
        self.batches = 0
        self.info: ModelInfo | None = None
        self._ids = itertools.count(1)
        self._state = _Outstanding()
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._proc = None
        self._conn = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self._draining = False
        self._dead: str | None = None
        self.clock = BatchClock()  # batch durations the engine process reports, for a full queue's Retry-After

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 900.0) -> ModelInfo:
        """Spawn the engine process and wait until its model is loaded (blocking; raises on failure)."""
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        # not a daemon: with --branch-parallel it spawns the LoPA ranks itself. It exits on "stop", on
        # EOF when this process dies, and at interpreter exit through the atexit hook below.
        self._proc = ctx.Process(target=engine_main, args=(child, self.spec), name="dllm-engine")
        self._proc.start()
        atexit.register(self.stop)
        child.close()
        self._conn = parent
        deadline = time.monotonic() + timeout
        try:
            while not parent.poll(0.2):
                if not self._proc.is_alive():
                    raise RuntimeError(f"the engine process exited while loading the model (exit code "
                                       f"{self._proc.exitcode})")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the engine process did not load the model in {timeout:.0f} s")
            kind, payload = parent.recv()
        except BaseException:  # a timeout, or a signal ending start-up: the half-loaded process goes too
            self._proc.kill()
            self._proc.join(5)
            self._stopping = True
            raise
        if kind != "ready":
            self._proc.join(10)
            self._stopping = True
            raise RuntimeError(f"the engine process could not load the model: {payload}")
        self.info = payload
        self._reader = threading.Thread(target=self._read, name="dllm-engine-reader", daemon=True)
        self._reader.start()
        return payload

    def stop(self, timeout: float = 10.0) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._send(("stop",))
        if self._proc is not None:
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
        if self._reader is not None:
            self._reader.join(timeout)
        self._fail_all(ServingError(503, "the server is shutting down", type="server_error", code="shutting_down",
                                    retry=True))

    def drain(self) -> None:
        """Shutdown begins (see Engine.drain): new and queued requests get 503, running ones finish."""
        with self._lock:
            self._draining = True
            queued = [self._state.requests.pop(rid) for rid in list(self._state.waiting) if rid in self._state.requests]
            self._state.waiting.clear()
            self._set_depth()
        for req in queued:
            req.done = True
            self._send(("cancel", req.rid))
            try:
                req.loop.call_soon_threadsafe(req.queue.put_nowait, Event("error", error=shutting_down()))
            except RuntimeError:
                pass

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc is not None and self._proc.is_alive()

    @property
    def queue_depth(self) -> int:
        return len(self._state.waiting)

    # -- loop side ---------------------------------------------------------------------------
    def submit(self, prompts: list[list[int]], *, n: int, cfg: DiffusionGenerationConfig, max_tokens: int,
               stop: tuple[str, ...] = (), isolated: bool = False) -> RemoteRequest:
        if self._stopping or self._draining:
            raise shutting_down()
        if self._dead is not None:
            raise internal(f"the decoding engine stopped: {self._dead}")
        with self._lock:
            if len(self._state.waiting) >= self.max_queue:
                queued = sum(len(self._state.requests[r].rows) for r in self._state.waiting if r in self._state.requests)
                raise queue_full(self.clock.retry_after(queued, self.spec.get("engine", {}).get("max_batch_size", 8)))
            req = RemoteRequest(self, next(self._ids), len(prompts) * n)
            self._state.requests[req.rid] = req
            self._state.waiting.add(req.rid)
            self._set_depth()
        self._send(("submit", req.rid, prompts, n, cfg, max_tokens, tuple(stop), isolated))
        return req

    def _cancel(self, req: RemoteRequest) -> None:
        with self._lock:
            if req.done:
                return
            req.done = True
            self._state.requests.pop(req.rid, None)
            self._state.waiting.discard(req.rid)
            self._set_depth()
        self._send(("cancel", req.rid))

    def _send(self, msg) -> None:
        if self._conn is None:
            return
        try:
            with self._send_lock:
                self._conn.send(msg)
        except (BrokenPipeError, OSError, EOFError):
            pass  # the reader notices the dead process and fails the open requests

    def _set_depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._state.waiting))

    # -- reader thread -----------------------------------------------------------------------
    def _read(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "events":
                self._on_events(msg[1], msg[2])
            elif kind == "started":
                with self._lock:
                    self._state.waiting.difference_update(msg[1])
                    self._set_depth()
        if not self._stopping:
            code = self._proc.exitcode if self._proc is not None else None
            self._dead = f"the engine process exited (exit code {code})"
            log.error("%s; failing the open requests", self._dead)
        # the requests that were decoding when the engine died: retryable (the server restarts the engine)
        self._fail_all(ServingError(503, "the decoding engine stopped; retry", type="server_error",
                                    code="engine_stopped", retry=True)
                       if not self._stopping else shutting_down())

    def _on_events(self, items: list, ops: list) -> None:
        if ops:
            self.batches += sum(1 for op in ops if op[0] == "batch_size")
            for name, _labels, method, value in ops:
                if name == "generate_seconds" and method == "observe":
                    self.clock.add(value)
            if self.metrics is not None:
                apply_metric_ops(self.metrics, ops)
        deliveries: dict[int, tuple[RemoteRequest, list[Event]]] = {}
        with self._lock:
            for rid, ev in items:
                req = self._state.requests.get(rid)
                if req is None:  # already failed or finished
                    continue
                deliveries.setdefault(rid, (req, []))[1].append(ev)
                if ev.kind == "stats":
                    req.open_rows -= 1
                if ev.kind == "error" or req.open_rows <= 0:
                    req.done = True
                    del self._state.requests[rid]
                    self._state.waiting.discard(rid)
        if not deliveries:
            return
        batch = list(deliveries.values())
        try:  # one wake-up of the event loop per message
            batch[0][0].loop.call_soon_threadsafe(_deliver, batch)
        except RuntimeError:  # the event loop is closed
            pass

    def _fail_all(self, error: ServingError) -> None:
        with self._lock:
            reqs = list(self._state.requests.values())
            self._state.requests.clear()
            self._state.waiting.clear()
        for req in reqs:
            req.done = True
            try:
                req.loop.call_soon_threadsafe(req.queue.put_nowait, Event("error", error=error))
            except RuntimeError:
                pass


def _deliver(deliveries: list[tuple[EngineRequest, list[Event]]]) -> None:
    for req, evs in deliveries:
        for ev in evs:
            req.queue.put_nowait(ev)
