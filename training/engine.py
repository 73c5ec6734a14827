"""The loop every trainer shares: accelerate setup, AdamW + schedule, gradient accumulation and
clipping, logging, atomic checkpoints (periodic and on SIGINT/SIGTERM), bit-identical resume, the
NaN/inf guard and the final export; and the faults around them: one trainer per run folder (a lock
file), models too large for the free memory refused before they are built, and a write that fails
(a full disk) stopped with one message, its partial files removed.

A trainer subclass supplies the models (``setup_models``), the loss of one micro-batch
(``compute_loss``) and the export (``export``); everything about *running* lives here.

Resume is bit-identical to an uninterrupted run with the same seed because everything a step reads
is restored: weights, optimizer and scheduler state, python/torch RNG states (accelerate), the mask
generator and the data stream position (``TrainState``), and the step counter.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import signal
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from accelerate.utils import DistributedType

from .checkpointing import latest_checkpoint, list_checkpoints, remove_partial_checkpoints, save_checkpoint
from .config import ConfigError, TrainConfig, resolve_tasks, to_dict, validate
from .data import Batch, TaskStream
from .files import DataFileError
from .memory import ModelCost, check_fits, checkpoint_parameters, module_parameters
from .precision import slow_precision_warning
from .run_lock import RunLock, RunLocked
from .run_log import RunLogger
from .write_faults import disk_full, failure, removed_on_failure


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN/inf; no checkpoint was written after the last good one."""


class RunDirInUse(RuntimeError):
    """The run dir already holds checkpoints and ``resume`` was not requested, or an earlier run's files
    that a run from step 0 would replace and ``overwrite`` was not requested."""


TMP_EXPORT_PREFIX = ".tmp-"  # the export is written to <parent>/.tmp-<name>, then renamed


@dataclass
class RunResult:
    status: str  # finished | interrupted
    step: int
    run_dir: Path
    checkpoint: Path | None
    export_dir: Path | None
    updates: int | None = None  # optimizer steps this run made (GRPO: an RL step may make none)
    note: str | None = None  # what the summary line should add, e.g. that no step updated the model
    signal: str | None = None  # SIGINT | SIGTERM: what interrupted the run


class LRSchedule:
    """Linear warm-up, then cosine decay to ``min_ratio`` (or constant), as a LambdaLR factor."""

    def __init__(self, kind: str, warmup: int, total: int, min_ratio: float) -> None:
        self.kind, self.warmup, self.total, self.min_ratio = kind, warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class TrainState:
    """Step counter, mask generator and data position; checkpointed via accelerate."""

    def __init__(self, stream: TaskStream, generator: torch.Generator) -> None:
        self.step = 0
        self.tokens = 0
        self.stream = stream
        self.generator = generator

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.tokens, "stream": self.stream.state_dict(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.tokens = int(state["tokens"])
        self.stream.load_state_dict(state["stream"])
        self.generator.set_state(state["generator"])


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the run where no checkpoint could be written: before the first step (nothing
    to save), or a second SIGINT while the first one's checkpoint was on its way. ``signal``: its name."""

    def __init__(self, signal_name: str, message: str) -> None:
        super().__init__(message)
        self.signal = signal_name


class _StopFlag:
    """SIGINT/SIGTERM: before the loop (``install``), stop at once (Interrupted); once the loop runs
    (``defer``), ask it to checkpoint and exit after the current step; a second SIGINT aborts."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.deferred = False
        self._old: dict = {}

    def install(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)

    def defer(self) -> None:
        self.deferred = True

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if not self.deferred:
            raise Interrupted(name, f"{name} before the first step: nothing was trained and nothing saved")
        if self.signal is not None and signum == signal.SIGINT:
            raise Interrupted(name, "a second SIGINT stopped the run while the first one's checkpoint was on "
                                    "its way: any partial checkpoint is removed when the run resumes")
        self.signal = name

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def export_path(cfg) -> Path:
    """Where the final model goes: ``export_dir``, else ``<run_dir>/final`` (so overriding run_dir moves it)."""
    return Path(cfg.export_dir) if cfg.export_dir else Path(cfg.run_dir) / "final"


def export_target_error(out: Path, run_dir: Path) -> str | None:
    """Why ``out`` cannot take an exported model, or None. The export replaces ``out`` as a whole, so it may
    only be a new folder or an earlier model folder: never the run folder, a folder holding it, one of its
    checkpoints, or a folder of other files."""
    out, run = Path(out).resolve(), Path(run_dir).resolve()
    if out == run or out in run.parents:
        return f"{out} holds the run folder {run_dir}; the export would replace it"
    if (run / "checkpoints") in (out, *out.parents):
        return f"{out} is inside the run's checkpoints; name another folder for the model"
    if out.exists() and not out.is_dir():
        return f"{out} is a file; name a folder for the model"
    if out.is_dir() and any(out.iterdir()) and not (out / "config.json").is_file():
        return f"{out} holds files but no model (config.json); name a new folder or a model folder to replace"
    return None


EARLIER_RUN_FILES = ("config.yaml", "metrics.csv", "eval.csv")  # what a run from step 0 writes anew


def earlier_run_error(run_dir: Path, export_dir: Path, resume: bool) -> str | None:
    """Why a run from step 0 (no checkpoint to resume) must not start in ``run_dir`` without
    ``overwrite=true``, or None: it would replace an earlier run's log and config, or its exported model,
    which a finished run leaves beside its last checkpoint until someone removes the checkpoints.
    ``resume`` with no checkpoint starts from step 0 by design (a job that always passes --resume), so
    only the export stops it: a killed run's log and config are what it is meant to take over."""
    model = export_dir / "config.json"
    if resume:
        if not model.is_file():
            return None
        return (f"{run_dir} has no checkpoint to resume, but {export_dir} holds an exported model (a finished "
                "run whose checkpoints were removed): resuming would train from step 0 and replace it; choose "
                "another run_dir, or pass overwrite=true to train again")
    found = [name for name in EARLIER_RUN_FILES if (run_dir / name).is_file()]
    if model.is_file():
        found.append(f"the exported model {export_dir}")
    if not found:
        return None
    # a run stopped before its first checkpoint exported nothing: --resume takes its folder over
    ways = ["choose another run_dir"]
    if not model.is_file():
        ways.append("pass --resume (resume=true) to take over a run stopped before its first checkpoint")
    ways.append("pass overwrite=true to start over")
    return (f"{run_dir} holds an earlier run ({', '.join(found)}), which a new run would replace; "
            f"{', '.join(ways[:-1])} or {ways[-1]}")


def make_run_folders(cfg, run_dir: Path) -> None:
    """Create ``run_dir`` and the export folder's parent now, not after hours of training: a folder
    that cannot be made, or an export that would replace something other than a model, is a recipe
    mistake (ConfigError, one line from the CLI)."""
    export_dir = export_path(cfg)
    if err := export_target_error(export_dir, run_dir):
        raise ConfigError(f"export_dir: {err}")
    for folder, key in ((run_dir, "run_dir"), (export_dir.parent, "export_dir")):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"{key}: cannot create {folder}: {err.strerror or err}") from None


def make_accelerator(mixed_precision: str):
    """The run's Accelerator, from the launcher's environment (accelerate launch, torchrun or none)."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    handlers = []
    if _deepspeed_without_gpu():
        # accelerate leaves its backend unset for DeepSpeed on a machine without GPUs and then reports one
        # process of rank 0 on every rank, while DeepSpeed counts them all (train_batch_size 16 != 16 * 1 * 2);
        # naming DeepSpeed's CPU backend makes accelerate read the real world size and rank
        handlers.append(InitProcessGroupKwargs(backend="gloo"))
    accelerator = Accelerator(mixed_precision=mixed_precision, kwargs_handlers=handlers)
    if accelerator.device.type == "cpu":
        # accelerate imports DeepSpeed, where installed, when it unwraps a model, and DeepSpeed then
        # warns on every CPU run that it found no GPU; naming its CPU backend (what it would pick) says so
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return accelerator


def _deepspeed_without_gpu() -> bool:
    """A DeepSpeed rank on a machine with no GPU (nor any other torch accelerator)."""
    probe = getattr(getattr(torch, "accelerator", None), "is_available", None)
    device = probe() if probe is not None else torch.cuda.is_available()
    return (os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
            and int(os.environ.get("LOCAL_RANK", -1)) != -1 and not device
            and os.environ.get("ACCELERATE_USE_CPU", "false").lower() not in ("1", "true", "yes"))


def world_size(accelerator) -> int:
    """Processes in the run: torch.distributed's count when it is up (what DeepSpeed checks against)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return accelerator.num_processes


def deepspeed_batch_geometry(micro_batch: int, grad_accum: int, world: int, grad_clip: float) -> dict:
    """The DeepSpeed config values the recipe decides (the JSONs in recipes/deepspeed/ leave them "auto"):
    DeepSpeed requires train_batch_size == micro-batch x accumulation x world size."""
    return {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": grad_accum,
            "train_batch_size": micro_batch * grad_accum * world, "gradient_clipping": float(grad_clip or 0.0)}


def announce_rank(accelerator, name: str) -> None:
    """Every process says which rank it is (a launch that started fewer processes than asked shows at once)."""
    import sys

    print(f"[dllm.train] {name}: rank {accelerator.process_index} of {world_size(accelerator)} "
          f"({accelerator.distributed_type.value}, {accelerator.device})", file=sys.stderr, flush=True)


class StepMeter:
    """What ``log_every`` steps add up to: mean loss (overall and per suite), tokens/s over the training
    time only (evaluation and checkpoint writes are paused out), the last gradient norm."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.losses, self.suites, self.tokens, self.t, self.pause_s = [], {}, 0, time.time(), 0.0
        self.last: dict = {}

    def add(self, info: dict) -> None:
        self.losses += info["losses"]
        for suite, values in info["suites"].items():
            self.suites.setdefault(suite, []).extend(values)
        self.tokens += info["tokens"]
        self.last = info

    @contextmanager
    def paused(self):
        t0 = time.time()
        try:
            yield
        finally:
            self.pause_s += time.time() - t0

    def flush(self, lr: float) -> tuple[dict, str | None]:
        dt = max(time.time() - self.t - self.pause_s, 1e-9)
        scalars = {"loss": sum(self.losses) / max(1, len(self.losses)), "lr": lr, "grad_norm": self.last["grad_norm"],
                   "tokens_per_s": self.tokens / dt, "tokens_seen": self.last["tokens_seen"]}
        for name, values in sorted(self.suites.items()):
            scalars[f"loss_{name}"] = sum(values) / len(values)
        self._reset()
        return scalars, None


class Trainer:
    """A trainer runs one config: ``SFTTrainer(cfg).run()``, or like trl,
    ``SFTTrainer(args=SFTConfig(...), model="tiny", train_dataset=rows).train()``.

    ``model``: a bundled name or checkpoint directory (sets ``model.path``). ``train_dataset``: a list of
    dicts, a dict of columns or a ``datasets.Dataset``, rows in the JSON Lines forms (``prompt`` +
    ``completion``/``response``/``answer``, or ``messages``); mixed with ``data.tasks`` and
    ``data.files`` at ``data.dataset_weight``. An unset ``data.tasks`` means the dataset alone. The
    config is copied: the trainer's own is ``trainer.cfg``.
    """

    config_class = TrainConfig
    name = "train"
    # ``compute_loss(..., rows=)`` draws the noise of a whole (global) batch and trains on ``rows`` of it, and the
    # loss is a mean over rows, so processes holding equal shares average to the global batch's loss
    # (``shard_global_batch``)
    shards_global_batch = False
    requires_answers = True  # train_dataset rows must hold answers (GRPO with reward functions does not)

    def __init__(self, cfg: TrainConfig | None = None, *, args: TrainConfig | None = None, model: str | None = None,
                 train_dataset=None) -> None:
        if cfg is not None and args is not None:
            raise TypeError(f"{type(self).__name__} takes its config once: cfg or args=, not both")
        cfg = cfg if cfg is not None else args
        cfg = copy.deepcopy(cfg) if cfg is not None else self.config_class()
        if not isinstance(cfg, self.config_class):
            raise TypeError(f"{type(self).__name__} takes a {self.config_class.__name__}, not {type(cfg).__name__}")
        if model is not None:
            if not isinstance(model, (str, os.PathLike)):
                raise TypeError(f"model= takes a bundled name or a checkpoint directory, not a {type(model).__name__} "
                                "object: save it with save_pretrained(DIR) and pass DIR")
            cfg.model.path = str(model)
            cfg.model.grow_from = None
        self.train_records = None
        if train_dataset is not None:
            from .datasets import dataset_records

            try:
                self.train_records = dataset_records(train_dataset, self.requires_answers)
            except DataFileError as err:
                raise ConfigError(str(err)) from None
        resolve_tasks(cfg, has_dataset=self.train_records is not None)
        self.cfg = cfg
        self.validate()
        if cfg.shard_global_batch and not self.shards_global_batch:
            raise ConfigError(f"shard_global_batch=true: the {self.name} trainer cannot split one global batch over "
                              "the processes (the SFT and GRPO trainers can); leave it false")
        self.tokenizer = None
        self.model: torch.nn.Module | None = None
        self.is_deepspeed = False
        self.export_state_dict: dict | None = None
        self.state_notes: list[str] = []  # what make_state found worth saying (data files read, ...)
        # how this run was started, written into the run folder's lock file (the CLI sets the exact command)
        self.command: str | None = None
        self.lock_note: str | None = None

    def validate(self) -> None:
        """ConfigError when the config cannot run (recipes are checked at load; Python configs here)."""
        validate(self.cfg, has_dataset=self.train_records is not None)

    def train(self) -> RunResult:
        """``run()``, under trl's name."""
        return self.run()

    def dataset_texts(self) -> list[str]:
        """The words of the train_dataset (a tokenizer built from scratch learns them)."""
        from dllm.eval.tasks.jsonl import record_words

        return [t for r in self.train_records or [] for t in record_words(r)]

    # -- subclass hooks ---------------------------------------------------------------------------
    def setup_models(self) -> None:
        raise NotImplementedError

    def pad_multiple(self) -> int:
        return 1

    def compute_loss(self, model, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def export(self, model, out_dir: Path) -> None:
        raise NotImplementedError

    def eval_block_size(self) -> int | None:
        return None

    def mask_id(self) -> int:
        return int(self.tokenizer.mask_token_id)

    # -- memory ------------------------------------------------------------------------------------
    def memory_plan(self) -> list[ModelCost | None]:
        """The models this trainer will build, counted, not built (``training.memory``): by default the one
        ``model`` section describes, trained on all its weights."""
        return [self.model_cost(self.cfg.model)]

    def model_cost(self, section, trainable: bool = True, label: str = "the model", path: str | None = None,
                   **build) -> ModelCost | None:
        """The parameters of the model ``section`` loads (``path`` instead: another checkpoint, frozen
        copies such as a teacher) or builds from ``model.config`` (``build``: scratch_config's extra
        arguments). None when a checkpoint has no safetensors file to count."""
        from dllm.loading import resolve_model_path

        from .models import scratch_config

        source = path or section.path
        if source:
            n = checkpoint_parameters(resolve_model_path(source))
            return None if n is None else ModelCost(label, n, section.dtype, trainable)
        model_class, config = scratch_config(section, self.tokenizer, **build)
        return ModelCost(label, module_parameters(model_class, config), "float32", trainable)

    def check_memory(self) -> None:
        """ModelTooLarge, before any model is built, when the run's models cannot fit in the free memory;
        ``allow_large_model=true`` skips it. Trainers call it once their tokenizer is loaded."""
        if self.cfg.allow_large_model:
            return
        models = [m for m in self.memory_plan() if m is not None]
        accelerator = getattr(self, "accelerator", None)
        device = accelerator.device if accelerator is not None else torch.device("cpu")
        check_fits(models, device, self.is_deepspeed)

    # -- helpers ---------------------------------------------------------------------------------------
    def _param_groups(self, model) -> list[dict]:
        decay, no_decay = [], []
        for p in model.parameters():
            if p.requires_grad:
                (decay if p.ndim >= 2 else no_decay).append(p)
        return [{"params": decay, "weight_decay": self.cfg.optim.weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]

    def _write_run_config(self, run_dir: Path) -> None:
        tmp = run_dir / "config.yaml.tmp"
        tmp.write_text(yaml.safe_dump(to_dict(self.cfg), sort_keys=False))
        tmp.replace(run_dir / "config.yaml")

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Set up, resume, then ``max_steps`` of :meth:`train_step` with logging, evaluation, checkpoints
        and the SIGINT/SIGTERM stop; export at the end. Trainers change what a step is (hooks below),
        never this loop."""
        cfg = self.cfg
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        # until the first step a signal stops the run at once (Interrupted): there is nothing to save yet
        stop = _StopFlag()
        stop.install()
        self._stop = stop
        try:
            return self._run(stop)
        finally:
            stop.restore()

    def _run(self, stop: _StopFlag) -> RunResult:
        cfg = self.cfg
        run_dir = Path(cfg.run_dir)
        accelerator = make_accelerator(cfg.mixed_precision)
        self.accelerator = accelerator
        self.is_deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
        if world_size(accelerator) > 1:
            announce_rank(accelerator, self.name)
        if self.is_deepspeed:
            self._configure_deepspeed(accelerator)
        self.check_accelerator(accelerator)
        main = accelerator.is_main_process
        if main:
            make_run_folders(cfg, run_dir)
        lock = self._lock_run_dir(accelerator, run_dir)
        try:
            return self._run_locked(accelerator, run_dir, main, stop)
        except OSError as err:  # a log or config file write on a full disk, outside the guarded writes
            if not disk_full(err):  # by errno or text only: a missing file on a nearly full disk is no full disk
                raise
            raise failure(err, "the run's files", Path(getattr(err, "filename", None) or run_dir),
                          latest_checkpoint(run_dir), True) from err
        finally:
            lock.release()

    def _lock_run_dir(self, accelerator, run_dir: Path) -> RunLock:
        """Take ``run_dir``'s lock on the main process (RunLocked if a live trainer holds it; every process
        raises, so none waits in a collective for a rank that left), then remove what killed runs left
        half-written there."""
        lock = RunLock(run_dir, self.command)
        note, refused = None, None
        if accelerator.is_main_process:
            try:
                note = lock.acquire()
            except RunLocked as err:
                refused = err
        if accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            shared = [str(refused) if refused is not None else None]
            broadcast_object_list(shared, from_process=0)
            if shared[0] is not None and refused is None:
                refused = RunLocked(shared[0], {})
        if refused is not None:
            raise refused
        if accelerator.is_main_process:
            remove_partial_checkpoints(run_dir)
            out = export_path(self.cfg)
            shutil.rmtree(out.parent / f"{TMP_EXPORT_PREFIX}{out.name}", ignore_errors=True)
        self.lock_note = note
        return lock

    def _run_locked(self, accelerator, run_dir: Path, main: bool, stop: _StopFlag) -> RunResult:
        cfg = self.cfg
        existing = latest_checkpoint(run_dir)
        if existing is not None and not cfg.resume:
            raise RunDirInUse(
                f"{run_dir} already has checkpoints (latest {existing.name}); pass --resume (resume=true) "
                "to continue it, or choose another run_dir"
            )
        if existing is None and not cfg.overwrite and (
                err := earlier_run_error(run_dir, export_path(cfg), cfg.resume)) is not None:
            raise RunDirInUse(err)

        # Same seed on every process: identical initial weights; data and masks differ by rank below.
        torch.manual_seed(cfg.seed)
        import random as _random

        _random.seed(cfg.seed)
        self.setup_models()
        model = self.model
        if cfg.model.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable()
        o = cfg.optim
        optimizer = torch.optim.AdamW(self._param_groups(model), lr=o.lr, betas=tuple(o.betas), eps=o.eps)
        schedule = LRSchedule(o.schedule, o.warmup_steps, self.scheduler_steps(), o.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        model, optimizer = accelerator.prepare(model, optimizer)
        state = self.make_state(accelerator, model)
        accelerator.register_for_checkpointing(scheduler, state)

        if cfg.resume and existing is not None:
            accelerator.load_state(str(existing))
            # LambdaLR restores its lambda's fields from the checkpoint; the recipe's schedule (e.g. a
            # new max_steps given on resume) wins. Same recipe: the same schedule, so still bit-identical.
            scheduler.lr_lambdas = [LRSchedule(o.schedule, o.warmup_steps, self.scheduler_steps(), o.min_lr_ratio)
                                    for _ in scheduler.lr_lambdas]
            # ... and so does its peak lr (the checkpoint restores the old one as the base lr);
            # recomputed with LambdaLR's own expression, so an unchanged recipe stays bit-identical
            scheduler.base_lrs = [o.lr for _ in scheduler.base_lrs]
            for group, base, lmbda in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
                group["initial_lr"] = base
                group["lr"] = base * lmbda(scheduler.last_epoch)
        last_good = existing if cfg.resume else None
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            self._write_run_config(run_dir)
        log = RunLogger(run_dir, state.step, cfg.max_steps, main, cfg.progress)
        if self.lock_note:
            log.message(self.lock_note)
        if cfg.resume and existing is None:
            log.message(f"resume requested but {run_dir} has no checkpoint; starting from step 0")
        elif cfg.resume:
            log.message(f"resumed from {existing} (step {state.step})")
        if (slow := slow_precision_warning(cfg.mixed_precision, accelerator.device)) is not None:
            log.message(slow)
        for line in self.describe(accelerator, model):
            log.message(line)
        if cfg.eval_every and not self.stream_suites():
            log.message("eval_every: data.tasks trains on no task suite, so there is nothing to score; "
                        "in-training evaluation is off")
        self.before_loop(accelerator, model, log, state)

        stop.defer()  # from now on a signal asks for a checkpoint after the current step
        status = "finished"
        meter = self.make_meter()
        try:
            while state.step < cfg.max_steps:
                info = self.train_step(model, optimizer, scheduler, state, accelerator, run_dir)
                state.step += 1
                log.advance()
                meter.add(info)
                if state.step % cfg.log_every == 0 or state.step == cfg.max_steps:
                    scalars, note = meter.flush(lr=scheduler.get_last_lr()[0])
                    log.log(state.step, scalars, note=note)
                with meter.paused():  # evaluation and saving are not training throughput
                    if cfg.eval_every and state.step % cfg.eval_every == 0 and state.step < cfg.max_steps:
                        self.evaluate(accelerator, model, log, state.step)
                    if stop.signal is not None:
                        last_good = save_checkpoint(accelerator, run_dir, state.step, cfg.keep_checkpoints)
                        log.message(f"{stop.signal}: saved {last_good}; continue with --resume")
                        status = "interrupted"
                        break
                    if cfg.save_every and state.step % cfg.save_every == 0 and state.step < cfg.max_steps:
                        last_good = save_checkpoint(accelerator, run_dir, state.step, cfg.keep_checkpoints)
            export_dir = None
            if status == "finished":
                if not list_checkpoints(run_dir) or list_checkpoints(run_dir)[-1][0] != state.step:
                    last_good = save_checkpoint(accelerator, run_dir, state.step, cfg.keep_checkpoints)
                if cfg.eval_every:
                    self.evaluate(accelerator, model, log, state.step)
                export_dir = self._export(accelerator, model, run_dir)
                log.message(f"done: step {state.step}; model exported to {export_dir}")
            result = RunResult(status, state.step, run_dir, last_good, export_dir,
                               signal=stop.signal if status == "interrupted" else None)
            self.finish(result, state, meter, log)
            return result
        finally:
            log.close()

    # -- what one step is (SFT and distillation: streamed batches and a loss; GRPO overrides them) -----------
    def check_accelerator(self, accelerator) -> None:
        """ConfigError for a distributed setup this trainer cannot run under (default: any)."""

    def scheduler_steps(self) -> int:
        """Learning-rate scheduler steps over the run (one per optimizer step)."""
        return self.cfg.max_steps

    def make_state(self, accelerator, model) -> TrainState:
        """The checkpointed run state (``.step`` and everything a bit-identical resume needs)."""
        cfg = self.cfg
        rank, world = accelerator.process_index, accelerator.num_processes
        conf = getattr(accelerator.unwrap_model(model), "config", None)
        context = getattr(conf, "max_sequence_length", None) or getattr(conf, "max_position_embeddings", None)
        if self.shard_rows(accelerator) is not None:
            # every process reads the one stream a single process with batch_size x world reads, and draws
            # the same masks; train_step keeps this process's rows
            rank, world, size = 0, 1, cfg.batch_size * world
        else:
            size = cfg.batch_size
        stream = TaskStream(self.tokenizer, cfg.data, size, cfg.seed, rank, self.pad_multiple(),
                            world, context, dataset=self.train_records)
        self.state_notes = list(stream.notes)
        return TrainState(stream, torch.Generator().manual_seed(cfg.seed * 7919 + rank))

    def shard_rows(self, accelerator) -> slice | None:
        """With ``shard_global_batch`` on several processes: the rows of each global micro-batch this process
        trains on; otherwise None."""
        world = accelerator.num_processes
        if not (self.cfg.shard_global_batch and world > 1):
            return None
        b = self.cfg.batch_size
        return slice(accelerator.process_index * b, (accelerator.process_index + 1) * b)

    def describe(self, accelerator, model) -> list[str]:
        """Lines the run prints before its first step."""
        cfg = self.cfg
        unwrapped = accelerator.unwrap_model(model)
        n_params = sum(p.numel() for p in unwrapped.parameters())
        n_train = sum(p.numel() for p in unwrapped.parameters() if p.requires_grad)
        return [f"{self.name}: {n_params / 1e6:.2f}M parameters ({n_train / 1e6:.2f}M trainable), "
                f"{cfg.max_steps} steps x {cfg.batch_size * cfg.grad_accum * accelerator.num_processes} examples",
                *self.state_notes]

    def before_loop(self, accelerator, model, log: RunLogger, state) -> None:
        """Anything to do once, before the first step (default: nothing)."""

    def make_meter(self) -> StepMeter:
        return StepMeter()

    def train_step(self, model, optimizer, scheduler, state: TrainState, accelerator, run_dir: Path) -> dict:
        """One optimizer step over ``grad_accum`` streamed micro-batches; returns what to log of it."""
        cfg = self.cfg
        model.train()
        losses, labels, tokens = [], [], 0
        rows = self.shard_rows(accelerator)
        for micro in range(cfg.grad_accum):
            batch = state.stream.next_batch().to(accelerator.device)
            sync = micro == cfg.grad_accum - 1
            plain = sync or accelerator.num_processes == 1 or self.is_deepspeed
            with nullcontext() if plain else accelerator.no_sync(model):
                with accelerator.autocast():
                    if rows is None:
                        loss = self.compute_loss(model, batch, state.generator)
                    else:  # the global batch's noise, this process's rows
                        loss = self.compute_loss(model, batch, state.generator, rows=rows)
                self._guard(loss, "loss", state.step, accelerator, run_dir)
                # DeepSpeed divides by its gradient_accumulation_steps and steps at the boundary itself
                accelerator.backward(loss if self.is_deepspeed else loss / cfg.grad_accum)
            losses.append(loss.detach().float())
            labels.append(batch.suites[0] if len(set(batch.suites)) == 1 else "mixed")
            # a global batch counts every process's tokens once; otherwise this process's, times the processes
            n = int(batch.attention_mask.sum()) * (1 if rows is not None else accelerator.num_processes)
            tokens += n
            state.tokens += n
        values = torch.stack(losses)
        if rows is not None:  # the global batch's loss: the mean of the processes' (equal shares of the rows)
            values = accelerator.reduce(values, reduction="mean")
        losses = [float(v) for v in values.tolist()]
        suites: dict[str, list[float]] = {}
        for label, value in zip(labels, losses):
            suites.setdefault(label, []).append(value)
        grad_norm = self._clip(model, accelerator)
        self._guard(grad_norm, "gradient norm", state.step, accelerator, run_dir)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return {"losses": losses, "suites": suites, "tokens": tokens, "tokens_seen": state.tokens,
                "grad_norm": float(grad_norm)}

    def evaluate(self, accelerator, model, log: RunLogger, step: int) -> None:
        """Held-out evaluation every ``eval_every`` steps and at the end (greedy, on the task suites)."""
        self._eval(accelerator, model, log, step)

    def finish(self, result: RunResult, state, meter: StepMeter, log: RunLogger) -> None:
        """Add to the run's result what the summary line should say (default: nothing)."""

    def _configure_deepspeed(self, accelerator) -> None:
        """Batch geometry and clipping come from the recipe, not from the DeepSpeed JSON ("auto" there)."""
        cfg = self.cfg
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        ds.update(deepspeed_batch_geometry(cfg.batch_size, cfg.grad_accum, world_size(accelerator), cfg.optim.grad_clip))

    def _clip(self, model, accelerator) -> torch.Tensor:
        if self.is_deepspeed:  # clipped inside the engine step (gradient_clipping); report its norm
            norm = model.get_global_grad_norm() if hasattr(model, "get_global_grad_norm") else None
            return torch.tensor(float(norm) if norm is not None else 0.0)
        params = [p for p in model.parameters() if p.requires_grad]
        if self.cfg.optim.grad_clip and self.cfg.optim.grad_clip > 0:
            return accelerator.clip_grad_norm_(params, self.cfg.optim.grad_clip)
        grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
        return torch.stack(grads).norm() if grads else torch.tensor(0.0)

    def _guard(self, value: torch.Tensor, what: str, step: int, accelerator, run_dir: Path) -> None:
        bad = torch.tensor([0.0 if bool(torch.isfinite(value.detach()).all()) else 1.0], device=accelerator.device)
        if accelerator.num_processes > 1:
            bad = accelerator.reduce(bad, reduction="sum")
        if float(bad.sum()) > 0:
            last = latest_checkpoint(run_dir)
            raise TrainingDiverged(
                f"non-finite {what} ({float(value.detach().float().sum())}) at step {step + 1}; training stopped "
                f"before the optimizer update. Last good checkpoint: {last if last else 'none (no checkpoint yet)'} "
                "(left untouched). Lower optim.lr, keep optim.grad_clip > 0, or try mixed_precision=no."
            )

    def stop_requested(self) -> bool:
        """Whether SIGINT/SIGTERM asked the run to stop: evaluations check it and end early, so that the
        checkpoint (or the export, at the end) comes at once rather than after a long evaluation."""
        stop = getattr(self, "_stop", None)
        return stop is not None and stop.signal is not None

    def log_eval_scores(self, log: RunLogger, step: int, scores: dict, suites: list[str], complete: bool) -> None:
        """Log an evaluation; one that a signal cut short (``complete`` False) says so and which suites it
        scored in full."""
        if not complete:
            names = {k.split("/")[-1] for k in scores}  # "gsm", or "threshold/gsm_acc" for GRPO
            done = [s for s in suites if s in names or f"{s}_acc" in names]
            log.message(f"{self._stop.signal}: evaluation at step {step} stopped early; suites scored: "
                        f"{', '.join(done) if done else 'none'}")
            if not scores:
                return
        log.log_eval(step, scores)

    def _eval(self, accelerator, model, log: RunLogger, step: int) -> None:
        if accelerator.is_main_process and self.stream_suites():
            from .probe import evaluate

            suites = list(self.stream_suites())
            scores = evaluate(accelerator.unwrap_model(model), self.tokenizer, suites, self.cfg.eval_examples,
                              self.eval_gen_length(), self.eval_block_size(), should_stop=self.stop_requested)
            complete = len(scores) == len(suites)
            if complete:  # a mean over every suite, not over those a signal left scored
                scores["mean"] = sum(scores.values()) / max(1, len(scores))
            self.log_eval_scores(log, step, scores, suites, complete)
        accelerator.wait_for_everyone()

    def stream_suites(self):
        return [k for k, v in self.cfg.data.tasks.items() if float(v) > 0]

    def eval_gen_length(self) -> int:
        m = self.pad_multiple()
        return -(-self.cfg.data.max_new_tokens // m) * m

    def _export(self, accelerator, model, run_dir: Path) -> Path:
        out = export_path(self.cfg)
        accelerator.wait_for_everyone()
        # ZeRO-3 partitions the weights: gather a full state dict (a collective: every rank calls it)
        self.export_state_dict = accelerator.get_state_dict(model) if self.is_deepspeed else None
        if accelerator.is_main_process:
            tmp = out.parent / f"{TMP_EXPORT_PREFIX}{out.name}"
            if tmp.exists():
                shutil.rmtree(tmp)
            with removed_on_failure(tmp, "the export", out, latest_checkpoint(run_dir)):
                tmp.parent.mkdir(parents=True, exist_ok=True)
                self.export(accelerator.unwrap_model(model), tmp)
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        accelerator.wait_for_everyone()
        return out
