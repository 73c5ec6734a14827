"""LoPA branch parallelism: the branches of a round are evaluated on several processes.

Each process (rank) holds a full model replica and owns a contiguous share of the ``k + 1``
branch groups (``torch.tensor_split`` of ``0..k``; rank 0 always owns the anchor group 0). For
every live row it keeps the cache rows of those groups (see ``dllm.decoding.lopa`` for the
branch-major slot layout). Rank 0 runs the whole LoPA control loop: canvas, block plans, winner
selection, anchor fill and lookahead spawning. The other ranks only run forwards.

Per round:

1. rank 0 broadcasts a small header (the round's window and per-slot metadata) and the slots'
   token ids ``[slots, end]``;
2. each rank forwards its own slots against its own cache and reduces its logits to **compact
   results**: per slot the branch score, and per window position the argmax token and its
   probability, plus, in rounds that cache blocks, a digest of the K/V it just cached;
3. ``dist.gather`` brings those to rank 0. Full-vocabulary logits never leave a rank
   (the reference all-gathers ``[window x vocab]`` logits per branch).

**Winner commit.** Under a block-causal mask, the blocks cached in a round have the same K/V in
every branch, on every rank, so broadcasting the winner's K/V would be a no-op. None is sent. The
loop checks the gathered digests instead and raises if any slot's newly cached K/V differ from the
winner's (invariant 10(c) of the spec). Under the bidirectional semi-AR base rule, the K/V outside
the fed span come only from the block-start refresh, which carries no lookahead, and the fed span
is rewritten before it is read, so that commit is a no-op too. Pre-written rows beyond the
committed length are scratch, and every forward resets the length first.

Use:

* ``BranchParallelExecutor(model_path, world_size=N)`` spawns ranks 1..N-1 with
  ``torch.multiprocessing``, and the calling process becomes rank 0. It uses gloo on CPU and NCCL
  when ``device`` is CUDA; rank r then uses ``cuda:r``. ``executor.generate(...)`` has
  ``model.generate``'s signature and result; ``executor.close()`` stops the workers.
* ``run_branch_parallel(model_path, prompts, generation_config, world_size)`` does one call
  (text prompts return ``TextResult`` objects, token ids a ``DiffusionGenerateOutput``).
* Under ``torchrun``, rank 0 uses ``BranchParallelExecutor.from_process_group(model)``, and the
  other ranks call ``serve_branches(model)``. ``python -m torch.distributed.run
  --nproc_per_node N -m dllm.decoding.lopa.branch_parallel --model PATH --prompt ...`` does both.
* With tensor parallelism, on a branch x tensor mesh (``dllm.parallel.mesh``; ``dllm generate
  --branch-parallel B --tensor-parallel T`` under ``torchrun --nproc-per-node B*T``): both take a
  ``group``, the rank's branch group. Each tensor rank of replica 0 drives its own branch group with
  the same rounds; the protocol's collectives stay inside that group and each forward's inside the
  replica's tensor group. The K/V digests compare slots holding the same tensor slice.

Branch parallelism needs greedy decoding (``temperature=0``, ``remasking='low_confidence'``): a
sampled choice would need one random stream shared by every rank. Ranks beyond ``k + 1`` sit
idle. Strategies other than ``lopa`` run on rank 0 alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from dllm.decoding.config import DiffusionGenerationConfig, GenerationConfigError

from .slots import RoundRequest, RoundResult, SlotSettings, SlotWorker

log = logging.getLogger("dllm.decoding")

HEARTBEAT_S = 60.0  # an idle executor pings its ranks this often (process groups time out after 30 minutes)


def rank_groups(num_groups: int, world_size: int) -> list[list[int]]:
    """Branch groups owned by each rank: contiguous, sizes differing by at most one, rank 0 first."""
    return [c.tolist() for c in torch.tensor_split(torch.arange(num_groups), world_size)]


class _Comm:
    """A process group (default: the world), with the collectives the protocol needs.

    ``rank`` and ``world`` are the rank and size within ``group``; its first rank drives the rounds.
    """

    def __init__(self, group=None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("branch parallelism needs an initialized torch.distributed process group")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.root = 0 if group is None else dist.get_global_rank(group, 0)  # collectives name global ranks
        self.nccl = dist.get_backend(group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.nccl else torch.device("cpu")

    def bcast_obj(self, obj=None):
        box = [obj]
        dist.broadcast_object_list(box, src=self.root, group=self.group, device=self.device if self.nccl else None)
        return box[0]

    def bcast_tensor(self, t: torch.Tensor | None, shape=None, dtype=torch.long) -> torch.Tensor:
        if t is None:
            t = torch.empty(shape, dtype=dtype, device=self.device)
        else:
            t = t.to(self.device).contiguous()
        dist.broadcast(t, src=self.root, group=self.group)
        return t

    def gather(self, t: torch.Tensor) -> list[torch.Tensor] | None:
        t = t.to(self.device).contiguous()
        out = [torch.empty_like(t) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(t, out, dst=self.root, group=self.group)
        return out


def _local_request(req: RoundRequest, lo: int, hi: int) -> RoundRequest:
    return dataclasses.replace(req, x=req.x[lo:hi], slot_end=req.slot_end[lo:hi], creation=req.creation[lo:hi],
                               valid=req.valid[lo:hi])


def _pack(res: RoundResult, rows: int, width: int, dig: int, ranked: bool) -> torch.Tensor:
    """Per slot: argmax tokens [W], their probabilities [W], the score, the K/V digest [dig] and,
    with a ``lopa_confidence`` other than 'prob', the ranking confidences [W]."""
    out = torch.zeros(rows, _packed_width(width, dig, ranked), dtype=torch.float64)
    n = res.score.shape[0]
    if n:
        out[:n, :width] = res.x0.double().cpu()
        out[:n, width: 2 * width] = res.conf.double().cpu()
        out[:n, 2 * width] = res.score.double().cpu()
        if dig and res.digest is not None:
            out[:n, 2 * width + 1: 2 * width + 1 + dig] = res.digest.cpu()
        if ranked:
            out[:n, 2 * width + 1 + dig:] = res.rank.double().cpu()
    return out


def _packed_width(width: int, dig: int, ranked: bool) -> int:
    return 2 * width + 1 + dig + (width if ranked else 0)


def _run_local(worker: SlotWorker | None, comm: _Comm, header: dict, x: torch.Tensor, rows: int) -> torch.Tensor:
    """Forward this rank's slots; returns the packed compact results (padded to the largest share)."""
    groups = header["shares"][comm.rank]
    lo, hi = groups[0] * rows if groups else 0, (groups[-1] + 1) * rows if groups else 0
    req: RoundRequest = dataclasses.replace(header["req"], x=x)
    width, dig, n_max, ranked = req.width, header["digest_width"], header["max_share"] * rows, header["ranked"]
    if worker is None or not groups:
        return torch.zeros(n_max, _packed_width(width, dig, ranked), dtype=torch.float64)
    res = worker.run(_local_request(req, lo, hi))
    return _pack(res, n_max, width, dig, ranked)


class _DistributedRounds:
    """Rank 0's executor for one ``generate`` call (the interface of :class:`SlotWorker`)."""

    def __init__(self, comm: _Comm, model, *, groups: int, key_valid: torch.Tensor, settings: SlotSettings,
                 lock) -> None:
        self.comm = comm
        self.lock = lock  # the executor's: its heartbeat never splits an exchange
        self.groups = groups
        self.rows = key_valid.shape[0]
        self.shares = rank_groups(groups, comm.world)
        self.layers = model.spec.num_layers
        self.ranked = settings.confidence != "prob"
        with self.lock:
            comm.bcast_obj({"cmd": "begin", "groups": groups, "key_valid": key_valid.cpu(), "settings": settings})
        self.worker = SlotWorker(model, groups=len(self.shares[0]), key_valid=key_valid, settings=settings)

    @property
    def forward_seconds(self) -> float:
        return self.worker.forward_seconds

    @property
    def forwards(self) -> int:
        return self.worker.forwards

    def run(self, req: RoundRequest) -> RoundResult:
        R, W = self.rows, req.width
        dig = 4 * self.layers if (req.spans is not None and self.worker.cache is not None) else 0
        max_share = max(len(s) for s in self.shares)
        meta = dataclasses.replace(req, x=None)
        header = {"cmd": "run", "req": meta, "shape": tuple(req.x.shape), "shares": self.shares,
                  "digest_width": dig, "max_share": max_share, "ranked": self.ranked}
        with self.lock:
            self.comm.bcast_obj(header)
            x = self.comm.bcast_tensor(req.x.long())
            mine = _run_local(self.worker, self.comm, header, x, R)
            parts = self.comm.gather(mine)
        rows = [p.cpu()[: len(share) * R] for p, share in zip(parts, self.shares)]
        packed = torch.cat(rows)
        return RoundResult(x0=packed[:, :W].long(), conf=packed[:, W: 2 * W].contiguous(),
                           score=packed[:, 2 * W].contiguous(),
                           digest=packed[:, 2 * W + 1: 2 * W + 1 + dig].contiguous() if dig else None,
                           rank=packed[:, 2 * W + 1 + dig:].contiguous() if self.ranked else None)

    def select_rows(self, keep: torch.Tensor) -> None:
        keep = torch.as_tensor(keep, dtype=torch.long).cpu()
        with self.lock:
            self.comm.bcast_obj({"cmd": "select", "keep": keep})
        self.worker.select_rows(keep)
        self.rows = int(keep.numel())

    def admit(self, key_valid: torch.Tensor, prompt_length: torch.Tensor, shift: int) -> None:
        """Rows joined the batch: every rank re-lays out its share of the branch groups the same way
        (:meth:`~dllm.decoding.lopa.slots.SlotWorker.admit`)."""
        key_valid, prompt_length = key_valid.cpu(), prompt_length.cpu()
        with self.lock:
            self.comm.bcast_obj({"cmd": "admit", "key_valid": key_valid, "prompt_length": prompt_length,
                                 "shift": int(shift)})
        self.worker.admit(key_valid, prompt_length, shift)
        self.rows = int(key_valid.shape[0])

    def close(self) -> None:
        with self.lock:
            self.comm.bcast_obj({"cmd": "end"})


def serve_branches(model, group=None) -> None:
    """Ranks > 0 of ``group`` (default: the world): evaluate the branches its rank 0 sends, until it says stop.

    On a branch x tensor mesh (``dllm.parallel.mesh``), ``group`` is the rank's branch group and ``model``
    the shard of its replica's tensor group."""
    comm = _Comm(group)
    if comm.rank == 0:
        raise RuntimeError("serve_branches runs on ranks > 0 of its group; rank 0 drives the rounds "
                           "(BranchParallelExecutor)")
    worker: SlotWorker | None = None
    rows = 0
    with torch.no_grad():
        while True:
            msg = comm.bcast_obj()
            cmd = msg["cmd"]
            if cmd == "stop":
                return
            if cmd == "ping":  # an idle driver keeps the group inside its collective timeout
                continue
            if cmd == "begin":
                share = rank_groups(msg["groups"], comm.world)[comm.rank]
                rows = msg["key_valid"].shape[0]
                worker = SlotWorker(model, groups=len(share), key_valid=msg["key_valid"], settings=msg["settings"])
            elif cmd == "run":
                x = comm.bcast_tensor(None, shape=msg["shape"])
                comm.gather(_run_local(worker, comm, msg, x, rows))
            elif cmd == "select":
                rows = int(msg["keep"].numel())
                if worker is not None:
                    worker.select_rows(msg["keep"])
            elif cmd == "admit":
                rows = int(msg["key_valid"].shape[0])
                if worker is not None:
                    worker.admit(msg["key_valid"], msg["prompt_length"], msg["shift"])
            elif cmd == "end":
                worker = None
            else:
                raise RuntimeError(f"unknown branch-parallel command {cmd!r}")


def _check_settings(settings: SlotSettings) -> None:
    if settings.temperature != 0 or settings.remasking != "low_confidence":
        raise GenerationConfigError(
            "branch-parallel LoPA needs greedy decoding (temperature=0, remasking='low_confidence'): every rank "
            "must make the same choices without sharing a random stream"
        )


def _worker_main(rank: int, world: int, init_method: str, backend: str, model_path: str, load_kwargs: dict,
                 device: str | None, timeout_s: float, num_threads: int | None) -> None:
    if num_threads:
        torch.set_num_threads(num_threads)
    if device is not None and str(device).startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        from dllm.loading import load_model

        model = load_model(model_path, device=device, **load_kwargs)
        serve_branches(model)
    finally:
        dist.destroy_process_group()


def _rank_device(device, rank: int) -> str | None:
    if device is None:
        return None
    d = torch.device(device)
    if d.type == "cuda":
        base = d.index or 0
        return f"cuda:{base + rank}"
    return str(d)


class BranchParallelExecutor:
    """LoPA whose branches run on ``world_size`` processes; rank 0 is the calling process.

    ``executor.generate`` takes and returns what ``model.generate`` does. Calls are serialised:
    one generation at a time drives the workers. Use it as a context manager or call ``close()``.

    The other ranks wait for the next round inside a collective, which ends with an error after the process
    group's timeout (``timeout_s``; 30 minutes by default for torchrun's groups too). So that an idle server
    keeps its ranks, a heartbeat thread sends them a ``ping`` every ``heartbeat_s`` seconds while no round is
    being exchanged.
    """

    def __init__(self, model_path: str | os.PathLike | None = None, *, world_size: int, dtype=None, device=None,
                 model=None, backend: str | None = None, timeout_s: float = 1800.0, num_threads: int | None = None,
                 heartbeat_s: float = HEARTBEAT_S, **load_kwargs) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if model_path is None and model is None:
            raise ValueError("pass model_path (and optionally an already loaded rank-0 model)")
        self.world_size = world_size
        self._lock = threading.RLock()  # one driver of the ranks at a time: a generation, a round, a ping
        self._procs: list = []
        self._tmp: str | None = None
        self._owns_group = False
        self._closed = False
        if dtype is not None:
            load_kwargs["dtype"] = dtype
        dev0 = _rank_device(device, 0)
        if world_size > 1:
            if dist.is_available() and dist.is_initialized():
                raise RuntimeError("a process group already exists; under torchrun use "
                                   "BranchParallelExecutor.from_process_group(model) on rank 0")
            if model_path is None:
                raise ValueError("world_size > 1 needs model_path: every worker loads its own replica")
            backend = backend or ("nccl" if dev0 is not None and dev0.startswith("cuda") else "gloo")
            import torch.multiprocessing as mp

            self._tmp = tempfile.mkdtemp(prefix="dllm-bp-")
            init_method = Path(self._tmp, "store").resolve().as_uri()
            ctx = mp.get_context("spawn")
            for rank in range(1, world_size):
                p = ctx.Process(target=_worker_main, daemon=True,
                                args=(rank, world_size, init_method, backend, str(model_path), dict(load_kwargs),
                                      _rank_device(device, rank), timeout_s, num_threads))
                p.start()
                self._procs.append(p)
            if dev0 is not None and dev0.startswith("cuda"):
                torch.cuda.set_device(torch.device(dev0))
            try:
                dist.init_process_group(backend, init_method=init_method, rank=0, world_size=world_size,
                                        timeout=timedelta(seconds=timeout_s))
            except Exception:
                self._kill_workers()
                raise
            self._owns_group = True
        self._comm = None
        try:
            if model is None:
                from dllm.loading import load_model

                model = load_model(model_path, device=dev0, **load_kwargs)
            self.model = model
            self._comm = _Comm() if world_size > 1 else None
            self._start_heartbeat(heartbeat_s)
        except BaseException:
            self._comm = None
            self._closed = True
            self._kill_workers()
            if self._owns_group and dist.is_initialized():
                dist.destroy_process_group()
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
            raise

    @classmethod
    def from_process_group(cls, model, group=None, *, heartbeat_s: float = HEARTBEAT_S) -> BranchParallelExecutor:
        """Rank 0 of an existing process group (torchrun; ``group`` defaults to the world); the other ranks
        of the group run ``serve_branches(model, group)``. On a branch x tensor mesh, every tensor rank of
        replica 0 calls it with its own branch group (``dllm.parallel.mesh``)."""
        self = cls.__new__(cls)
        self._lock = threading.RLock()  # one driver of the ranks at a time: a generation, a round, a ping
        self._procs, self._tmp, self._owns_group, self._closed = [], None, False, False
        self._comm = _Comm(group)
        if self._comm.rank != 0:
            raise RuntimeError("from_process_group is for rank 0 of its group; the other ranks call "
                               "serve_branches(model, group)")
        self.world_size = self._comm.world
        self.model = model
        self._start_heartbeat(heartbeat_s)
        return self

    # -- the model-like surface ---------------------------------------------------------------
    @property
    def diffusion_generation_config(self) -> DiffusionGenerationConfig:
        return self.model.diffusion_generation_config

    @property
    def branch_factory(self):
        """What ``generate(branch_executor=...)`` and ``DecodeSession(branch_executor=...)`` take to evaluate
        LoPA branches on the ranks (None without other ranks). One batch at a time may use it."""
        return None if self._comm is None else self._factory

    def _factory(self, model, *, groups, key_valid, settings, generator, cfg):
        _check_settings(settings)
        return _DistributedRounds(self._comm, model, groups=groups, key_valid=key_valid, settings=settings,
                                  lock=self._lock)

    _factory.joins_rows = True  # every rank re-lays out its slots for joined rows (_DistributedRounds.admit)

    def generate(self, input_ids, attention_mask=None, generation_config=None, streamer=None, tokenizer=None,
                 **overrides):
        if self._closed:
            raise RuntimeError("this BranchParallelExecutor is closed")
        with self._lock:
            return self.model.generate(input_ids, attention_mask=attention_mask, generation_config=generation_config,
                                       streamer=streamer, tokenizer=tokenizer,
                                       branch_executor=None if self._comm is None else self._factory, **overrides)

    def ping(self) -> None:
        """Tell the other ranks that this one is alive (they ignore it, between rounds or batches)."""
        with self._lock:
            self._send_ping()

    def _send_ping(self) -> None:  # the caller holds the lock
        if self._comm is not None and not self._closed:
            self._comm.bcast_obj({"cmd": "ping"})

    def _start_heartbeat(self, every_s: float) -> None:
        self._beat_stop = threading.Event()
        if self._comm is not None:
            threading.Thread(target=self._beat, args=(every_s,), name="dllm-branch-heartbeat", daemon=True).start()

    def _beat(self, every_s: float) -> None:
        while not self._beat_stop.wait(every_s):  # close() sets it
            if not self._lock.acquire(blocking=False):
                continue  # a generation or a round is talking to the ranks: traffic enough
            try:
                self._send_ping()
            except Exception:  # noqa: BLE001 - a rank went away; the next round reports it
                log.exception("branch-parallel heartbeat failed")
                return
            finally:
                self._lock.release()

    # -- shutdown -----------------------------------------------------------------------------
    def _kill_workers(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=10)
        self._procs = []

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._beat_stop.set()
        try:
            if self._comm is not None:
                with self._lock:
                    self._comm.bcast_obj({"cmd": "stop"})
            for p in self._procs:
                p.join(timeout=60)
        finally:
            self._kill_workers()
            if self._owns_group and dist.is_initialized():
                dist.destroy_process_group()
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> BranchParallelExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_branch_parallel(model_path, prompts, generation_config: DiffusionGenerationConfig | None = None,
                        world_size: int = 2, *, attention_mask: torch.Tensor | None = None, chat: bool = True,
                        **executor_kwargs):
    """One branch-parallel generation with ``world_size`` local processes (the caller is rank 0).

    ``prompts``: text (a string or a list of strings; the checkpoint's tokenizer and chat template
    are used; returns a list of ``dllm.text.TextResult``), or token ids (a LongTensor ``[batch,
    length]``, left-padded with ``attention_mask``, or a list of id lists; returns a
    ``DiffusionGenerateOutput``).
    """
    with BranchParallelExecutor(model_path, world_size=world_size, **executor_kwargs) as ex:
        cfg = generation_config or ex.diffusion_generation_config
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], str)):
            from dllm.text import generate_text, load_tokenizer_for

            tok = load_tokenizer_for(model_path)
            return generate_text(ex, tok, prompts, chat=chat, generation_config=cfg)
        if not torch.is_tensor(prompts):
            rows = [list(p) for p in prompts]
            length = max(len(r) for r in rows)
            pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
            ids = torch.full((len(rows), length), pad, dtype=torch.long)
            attention_mask = torch.zeros(len(rows), length, dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, length - len(r):] = torch.tensor(r)
                attention_mask[i, length - len(r):] = 1
            prompts = ids
        return ex.generate(prompts, attention_mask=attention_mask, generation_config=cfg.replace(return_dict_in_generate=True))


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc_per_node N -m dllm.decoding.lopa.branch_parallel --model PATH --prompt TEXT [key=value ...]``."""
    parser = argparse.ArgumentParser(prog="python -m dllm.decoding.lopa.branch_parallel")
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt", action="append", required=True)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--no-chat", action="store_true")
    parser.add_argument("options", nargs="*", help="generation options as key=value (e.g. lopa_branches=4)")
    args = parser.parse_args(argv)
    from dllm.loading import load_model, resolve_model_path

    overrides = {}
    for opt in args.options:
        key, _, value = opt.partition("=")
        overrides[key] = json.loads(value) if value[:1] in "0123456789-[{tfn\"" else value
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = args.device
    if device == "cuda":
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device and device.startswith("cuda") else "gloo")
    try:
        path = resolve_model_path(args.model)
        model = load_model(path, device=device, dtype=args.dtype)
        if dist.get_rank() != 0:
            serve_branches(model)
            return 0
        from dllm.text import generate_text, load_tokenizer_for

        with BranchParallelExecutor.from_process_group(model) as ex:
            cfg = model.diffusion_generation_config.replace(strategy="lopa", **overrides)
            results = generate_text(ex, load_tokenizer_for(path), args.prompt, chat=not args.no_chat,
                                    generation_config=cfg)
        for r in results:
            print(json.dumps({"text": r.text, "num_forwards": r.num_forwards, "generated_tokens": r.generated_tokens,
                              "tpf": r.tpf, "finish_reason": r.finish_reason}))
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
