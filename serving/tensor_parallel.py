"""``dllm serve --tensor-parallel N``: one server on rank 0, every rank runs its shard of each forward.

Under ``torchrun --nproc-per-node N -m dllm serve --tensor-parallel N`` every rank loads the checkpoint
and shards it (:func:`dllm.parallel.tensor.shard_model`). Rank 0 runs the HTTP server and the unchanged
:class:`~dllm.serving.engine.Engine` (queue, scheduler, batches stepped in turn, joining, cancelling).
The engine drives decoding only through the batches its ``session_factory`` makes; on rank 0 that
factory is :class:`LockstepBatches`, whose batches tell the other ranks (the *followers*, running
:func:`follow`) every operation on a batch, in order:

* ``("new", id, config, joinable, join_max_spread_blocks, branches)``, ``("add", id, prompts, mask, row options)``
  and ``("cancel", id, row)`` wait in a queue: they run no forward, so they travel with the next message;
* ``("step", id)`` goes at once, with whatever waited, and then every rank runs the batch's step: one
  forward (whose ``all_reduce`` calls join the ranks) and its commits;
* ``("drop", id)``: rank 0 has let go of the batch (finished, failed or collected);
* ``("ping",)`` after a minute without a message, so an idle follower never reaches the process group's
  timeout; ``("stop",)`` when rank 0 shuts down: the followers leave their loop and exit.

Each message is one ``torch.distributed.broadcast_object_list`` from rank 0. Every rank holds the same
batches and makes the same calls on the same inputs, and a shard's logits are identical on every rank
(the replicated LM head), so every rank commits the same tokens and runs the same forwards. The one input
that only rank 0 has is the server's own stopping criterion (a stop string or ``max_tokens`` reached in a
row's text): rank 0 evaluates it inside the step and broadcasts its answer, and the followers' criterion
returns what it receives. Output callbacks (``put_row``/``end_row``) reach rank 0's engine only; an
exception there is raised after the step, once every rank has finished it. Sampling without a request
``seed`` draws from the global torch generator, seeded alike on every rank at start-up; requests with a
``seed`` decode in a batch of their own with its own generator.

Every collective of rank 0 (messages, the criterion's answers, the forwards' ``all_reduce``) runs under
one lock, so the engine's worker thread, the heartbeat and the shutdown never interleave theirs.
With ``--branch-parallel B`` too (``torchrun --nproc-per-node B*N``), the ranks form a branch x tensor mesh
(:mod:`dllm.parallel.mesh`): the messages go over replica 0's tensor group only; each of its ranks drives LoPA
rounds over its own branch group (``BranchParallelExecutor.from_process_group``), whose members in replicas
1..B-1 run ``serve_branches`` until their driver closes it, as ``dllm generate`` does on a mesh.

A rank whose operation fails where rank 0's did not (say, out of memory on one GPU) can no longer follow
and exits with an error; torchrun then stops the other ranks.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
import weakref

import torch
import torch.distributed as dist

from dllm.decoding.decode_session import DecodeSession
from dllm.decoding.streaming import BatchStreamer

log = logging.getLogger("dllm.serving")

PING_S = 60.0  # an idle rank 0 sends a ping this often (the process group's timeout is 30 minutes)


class _Channel:
    """Broadcasts from the first rank of ``group`` (default: the world); ``rank`` is the rank within it."""

    def __init__(self, group=None) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("tensor-parallel serving needs an initialised torch.distributed process group")
        self.group = group
        self.rank = dist.get_rank(group)
        self.root = 0 if group is None else dist.get_global_rank(group, 0)  # collectives name global ranks
        nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else None

    def send(self, obj) -> None:
        dist.broadcast_object_list([obj], src=self.root, group=self.group, device=self.device)

    def recv(self):
        box = [None]
        dist.broadcast_object_list(box, src=self.root, group=self.group, device=self.device)
        return box[0]


class LockstepBatches:
    """Rank 0's ``session_factory`` for :class:`~dllm.serving.engine.Engine`: each batch it makes is
    mirrored on every other rank of ``group`` (default: the world; see the module docstring). ``close()``
    tells the followers to stop. ``branch_executor``: this rank's LoPA branch executor on a branch x tensor
    mesh (a ``BranchParallelExecutor`` over its branch group), which LoPA batches run their rounds on."""

    def __init__(self, model, tokenizer, *, join_max_spread_blocks: float | None = None,
                 ping_s: float | None = None, group=None, branch_executor=None) -> None:
        import copy

        self.model = model
        self.tokenizer = copy.deepcopy(tokenizer)  # the engine's worker thread is its only user
        self.join_max_spread_blocks = join_max_spread_blocks
        self.branch_executor = branch_executor
        self.channel = _Channel(group)
        if self.channel.rank != 0:
            raise RuntimeError("LockstepBatches runs on rank 0 of its group; the other ranks call follow()")
        self.lock = threading.RLock()  # held around every collective of this rank
        self._queued: collections.deque = collections.deque()  # operations waiting for the next message
        self._ids = itertools.count()
        self._closed = False
        self._last_send = time.monotonic()
        self._ping_s = PING_S if ping_s is None else ping_s
        self._heartbeat = threading.Thread(target=self._beat, name="dllm-tp-heartbeat", daemon=True)
        self._heartbeat.start()

    # -- what the engine calls ---------------------------------------------------------------
    def __call__(self, cfg, *, streamer, criteria, joinable: bool, branches: bool) -> _LeaderBatch:
        # ``branches``: a LoPA batch; its branches run on this rank's shard, or on the branch executor's
        # group when a mesh gives one (every follower then drives its own branch group alike)
        errors: list[BaseException] = []
        batch = _LeaderBatch(self, next(self._ids), errors)
        decoder = DecodeSession(self.model, cfg, tokenizer=self.tokenizer, streamer=_GuardedStreamer(streamer, errors),
                                criteria=[_BroadcastCriterion(self, list(criteria), errors)], joinable=joinable,
                                join_max_spread_blocks=self.join_max_spread_blocks,
                                branch_executor=_branch_factory(self.branch_executor, branches))
        batch.decoder = decoder
        self.queue(("new", batch.id, cfg, joinable, self.join_max_spread_blocks, branches))
        weakref.finalize(batch, self._queued.append, ("drop", batch.id))
        return batch

    def close(self, timeout: float = 120.0) -> None:
        """Send ``stop`` (after any step in progress, waiting at most ``timeout`` seconds for it)."""
        if self._closed:
            return
        if not self.lock.acquire(timeout=timeout):
            log.error("a decoding step still runs after %.0f s; the other ranks are not told to stop", timeout)
            self._closed = True
            return
        try:
            if not self._closed:
                self._closed = True
                self._send([("stop",)])
        except Exception as err:  # noqa: BLE001 - a rank already went away: nobody is left to tell
            log.warning("could not tell the other ranks to stop: %s", err)
        finally:
            self.lock.release()

    # -- messages ----------------------------------------------------------------------------
    def queue(self, op: tuple) -> None:
        self._queued.append(op)

    def _send(self, ops: list[tuple]) -> None:
        """Broadcast what waited plus ``ops`` (the caller holds the lock)."""
        waiting = []
        while self._queued:
            waiting.append(self._queued.popleft())
        self.channel.send(waiting + ops)
        self._last_send = time.monotonic()

    def send_step(self, batch_id: int) -> None:
        if self._closed:
            raise RuntimeError("tensor-parallel serving has stopped")
        self._send([("step", batch_id)])

    def _beat(self) -> None:
        while not self._closed:
            time.sleep(min(self._ping_s / 4, 5.0))
            if self._closed or time.monotonic() - self._last_send < self._ping_s:
                continue
            if self.lock.acquire(blocking=False):  # a step in progress is traffic enough
                try:
                    if not self._closed:
                        self._send([("ping",)])
                except Exception:  # noqa: BLE001 - a rank went away; torchrun stops the job
                    log.exception("tensor-parallel heartbeat failed")
                    return
                finally:
                    self.lock.release()


class _LeaderBatch:
    """A :class:`DecodeSession` on rank 0 whose every operation the followers repeat."""

    def __init__(self, owner: LockstepBatches, batch_id: int, errors: list) -> None:
        self.owner = owner
        self.id = batch_id
        self.errors = errors
        self.decoder: DecodeSession | None = None

    def add_rows(self, input_ids, attention_mask=None, **row_options) -> range:
        rows = self.decoder.add_rows(input_ids, attention_mask, **row_options)  # refused here: refused nowhere
        self.owner.queue(("add", self.id, input_ids, attention_mask, row_options))
        return rows

    def cancel(self, row: int) -> None:
        self.decoder.cancel(row)
        self.owner.queue(("cancel", self.id, int(row)))

    def step(self) -> bool:
        with self.owner.lock:
            self.owner.send_step(self.id)
            more = self.decoder.step()  # raises on every rank alike
        if self.errors:  # an output callback failed on rank 0: raised now that every rank has stepped
            err, self.errors[:] = self.errors[0], []
            raise err
        return more

    def __getattr__(self, name: str):  # finished(), output(), live, joinable, num_rows, forwards, ...
        if name == "decoder":
            raise AttributeError(name)
        return getattr(self.decoder, name)


class _GuardedStreamer(BatchStreamer):
    """Rank 0's output callbacks; an exception is kept for after the step instead of ending it on rank 0 alone."""

    def __init__(self, inner: BatchStreamer, errors: list) -> None:
        self.inner = inner
        self.errors = errors

    def put_row(self, row: int, token_ids: list[int]) -> None:
        try:
            self.inner.put_row(row, token_ids)
        except Exception as err:  # noqa: BLE001 - raised after the step
            self.errors.append(err)

    def end_row(self, row: int, finish_reason: str, num_forwards: int | None = None) -> None:
        try:
            self.inner.end_row(row, finish_reason, num_forwards=num_forwards)
        except Exception as err:  # noqa: BLE001 - raised after the step
            self.errors.append(err)


class _BroadcastCriterion:
    """The server's stopping criteria, evaluated on rank 0; their answer goes to every rank."""

    def __init__(self, owner: LockstepBatches, criteria: list, errors: list) -> None:
        self.owner = owner
        self.criteria = criteria
        self.errors = errors

    def __call__(self, rows: list[int]) -> list[int]:
        stop: set[int] = set()
        for criterion in self.criteria:
            try:
                stop.update(int(r) for r in criterion(rows))
            except Exception as err:  # noqa: BLE001 - raised after the step
                self.errors.append(err)
        answer = sorted(stop)
        self.owner.channel.send(answer)  # inside the step: the lock is held
        return answer


def _branch_factory(executor, branches: bool):
    """What a batch's ``DecodeSession`` takes as ``branch_executor``: the executor's factory for LoPA batches."""
    return executor.branch_factory if executor is not None and branches else None


class _ReceivedCriterion:
    def __init__(self, channel: _Channel) -> None:
        self.channel = channel

    def __call__(self, rows: list[int]) -> list[int]:
        return self.channel.recv()


def follow(model, tokenizer, *, group=None, branch_executor=None) -> None:
    """Ranks > 0 of ``group`` (default: the world): repeat its rank 0's batches on this rank's shard until
    rank 0 sends ``stop``. ``branch_executor``: as for :class:`LockstepBatches`, this rank's own.

    Raises RuntimeError when an operation fails here that did not fail on rank 0 (this rank can no
    longer follow), or the error of a collective when rank 0 went away.
    """
    channel = _Channel(group)
    if channel.rank == 0:
        raise RuntimeError("follow() runs on ranks > 0 of its group; rank 0 serves (LockstepBatches)")
    batches: dict[int, DecodeSession] = {}
    streamer = BatchStreamer()  # the output goes to rank 0's clients only
    criterion = _ReceivedCriterion(channel)
    while True:
        for op in channel.recv():
            kind = op[0]
            if kind == "stop":
                return
            if kind == "ping":
                continue
            if kind == "drop":
                batches.pop(op[1], None)
                continue
            if kind == "step":
                try:
                    batches[op[1]].step()
                except Exception as err:  # noqa: BLE001 - rank 0's step raised the same (same inputs)
                    log.debug("batch %d: step failed on every rank: %s", op[1], err)
                continue
            try:
                if kind == "new":
                    _, batch_id, cfg, joinable, spread, branches = op
                    batches[batch_id] = DecodeSession(model, cfg, tokenizer=tokenizer, streamer=streamer,
                                                      criteria=[criterion], joinable=joinable,
                                                      join_max_spread_blocks=spread,
                                                      branch_executor=_branch_factory(branch_executor, branches))
                elif kind == "add":
                    _, batch_id, ids, mask, options = op
                    batches[batch_id].add_rows(ids, mask, **options)
                elif kind == "cancel":
                    batches[op[1]].cancel(op[2])
                else:
                    raise ValueError(f"unknown operation {kind!r}")
            except Exception as err:
                raise RuntimeError(f"rank {channel.rank} cannot repeat rank 0's {kind!r} ({err}); "
                                   "the ranks no longer decode alike") from err
