"""The loop every trainer shares: accelerate setup, AdamW + schedule, gradient accumulation and
clipping, logging, atomic checkpoints (periodic and on SIGINT/SIGTERM), bit-identical resume, the
NaN/inf guard and the final export.

A trainer subclass supplies the models (``setup_models``), the loss of one micro-batch
(``compute_loss``) and the export (``export``); everything about *running* lives here.

Resume is bit-identical to an uninterrupted run with the same seed because everything a step reads
is restored: weights, optimizer and scheduler state, python/torch RNG states (accelerate), the mask
generator and the data stream position (``TrainState``), and the step counter.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from accelerate.utils import DistributedType

from .checkpointing import latest_checkpoint, list_checkpoints, save_checkpoint
from .config import ConfigError, TrainConfig, to_dict
from .data import Batch, TaskStream
from .precision import slow_precision_warning
from .run_log import RunLogger


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN/inf; no checkpoint was written after the last good one."""


class RunDirInUse(RuntimeError):
    """The run dir already holds checkpoints and ``resume`` was not requested."""


@dataclass
class RunResult:
    status: str  # finished | interrupted
    step: int
    run_dir: Path
    checkpoint: Path | None
    export_dir: Path | None


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


class _StopFlag:
    """SIGINT/SIGTERM ask the loop to checkpoint and exit after the current step; a second SIGINT aborts."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._old: dict = {}

    def install(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


def make_run_folders(cfg, run_dir: Path) -> None:
    """Create ``run_dir`` and the export folder's parent now, not after hours of training: a folder
    that cannot be made is a recipe mistake (ConfigError, one line from the CLI)."""
    export_dir = Path(cfg.export_dir) if cfg.export_dir else run_dir / "final"
    for folder, key in ((run_dir, "run_dir"), (export_dir.parent, "export_dir")):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"{key}: cannot create {folder}: {err.strerror or err}") from None


class Trainer:
    config_class = TrainConfig
    name = "train"

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.tokenizer = None
        self.model: torch.nn.Module | None = None
        self.is_deepspeed = False
        self.export_state_dict: dict | None = None

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
        from accelerate import Accelerator

        cfg = self.cfg
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        run_dir = Path(cfg.run_dir)
        accelerator = Accelerator(mixed_precision=cfg.mixed_precision)
        self.accelerator = accelerator
        self.is_deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
        if self.is_deepspeed:
            self._configure_deepspeed(accelerator)
        main = accelerator.is_main_process
        if main:
            make_run_folders(cfg, run_dir)

        existing = latest_checkpoint(run_dir)
        if existing is not None and not cfg.resume:
            raise RunDirInUse(
                f"{run_dir} already has checkpoints (latest {existing.name}); pass --resume (resume=true) "
                "to continue it, or choose another run_dir"
            )

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
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, LRSchedule(o.schedule, o.warmup_steps, cfg.max_steps, o.min_lr_ratio))
        model, optimizer = accelerator.prepare(model, optimizer)
        rank = accelerator.process_index
        conf = getattr(accelerator.unwrap_model(model), "config", None)
        context = getattr(conf, "max_sequence_length", None) or getattr(conf, "max_position_embeddings", None)
        stream = TaskStream(self.tokenizer, cfg.data, cfg.batch_size, cfg.seed, rank, self.pad_multiple(),
                            accelerator.num_processes, context)
        generator = torch.Generator().manual_seed(cfg.seed * 7919 + rank)
        state = TrainState(stream, generator)
        accelerator.register_for_checkpointing(scheduler, state)

        if cfg.resume and existing is not None:
            accelerator.load_state(str(existing))
            # LambdaLR restores its lambda's fields from the checkpoint; the recipe's schedule (e.g. a
            # new max_steps given on resume) wins. Same recipe: the same schedule, so still bit-identical.
            scheduler.lr_lambdas = [LRSchedule(o.schedule, o.warmup_steps, cfg.max_steps, o.min_lr_ratio)
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
        if cfg.resume and existing is None:
            log.message(f"resume requested but {run_dir} has no checkpoint; starting from step 0")
        elif cfg.resume:
            log.message(f"resumed from {existing} (step {state.step})")
        n_params = sum(p.numel() for p in accelerator.unwrap_model(model).parameters())
        n_train = sum(p.numel() for p in accelerator.unwrap_model(model).parameters() if p.requires_grad)
        if (slow := slow_precision_warning(cfg.mixed_precision, accelerator.device)) is not None:
            log.message(slow)
        log.message(f"{self.name}: {n_params / 1e6:.2f}M parameters ({n_train / 1e6:.2f}M trainable), "
                    f"{cfg.max_steps} steps x {cfg.batch_size * cfg.grad_accum * accelerator.num_processes} examples")
        for note in stream.notes:
            log.message(note)
        if cfg.eval_every and not self.stream_suites():
            log.message("eval_every: data.tasks trains on no task suite, so there is nothing to score; "
                        "in-training evaluation is off")

        stop = _StopFlag()
        stop.install()
        status = "finished"
        window = {"loss": 0.0, "n": 0, "tokens": 0, "t": time.time(), "pause": 0.0, "suite": {}}
        try:
            while state.step < cfg.max_steps:
                model.train()
                for micro in range(cfg.grad_accum):
                    batch = stream.next_batch().to(accelerator.device)
                    sync = micro == cfg.grad_accum - 1
                    plain = sync or accelerator.num_processes == 1 or self.is_deepspeed
                    with nullcontext() if plain else accelerator.no_sync(model):
                        with accelerator.autocast():
                            loss = self.compute_loss(model, batch, generator)
                        self._guard(loss, "loss", state.step, accelerator, run_dir)
                        # DeepSpeed divides by its gradient_accumulation_steps and steps at the boundary itself
                        accelerator.backward(loss if self.is_deepspeed else loss / cfg.grad_accum)
                    value = float(loss.detach())
                    window["loss"] += value
                    window["n"] += 1
                    suite = batch.suites[0] if len(set(batch.suites)) == 1 else "mixed"
                    s = window["suite"].setdefault(suite, [0.0, 0])
                    s[0] += value
                    s[1] += 1
                    tokens = int(batch.attention_mask.sum()) * accelerator.num_processes
                    window["tokens"] += tokens
                    state.tokens += tokens
                grad_norm = self._clip(model, accelerator)
                self._guard(grad_norm, "gradient norm", state.step, accelerator, run_dir)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                state.step += 1
                log.advance()

                if state.step % cfg.log_every == 0 or state.step == cfg.max_steps:
                    dt = max(time.time() - window["t"] - window["pause"], 1e-9)
                    scalars = {"loss": window["loss"] / max(1, window["n"]), "lr": scheduler.get_last_lr()[0],
                               "grad_norm": float(grad_norm), "tokens_per_s": window["tokens"] / dt,
                               "tokens_seen": state.tokens}
                    for name, (tot, n) in sorted(window["suite"].items()):
                        scalars[f"loss_{name}"] = tot / n
                    log.log(state.step, scalars)
                    window = {"loss": 0.0, "n": 0, "tokens": 0, "t": time.time(), "pause": 0.0, "suite": {}}
                t_pause = time.time()  # evaluation and saving are not training throughput
                if cfg.eval_every and state.step % cfg.eval_every == 0 and state.step < cfg.max_steps:
                    self._eval(accelerator, model, log, state.step)
                if stop.signal is not None:
                    last_good = save_checkpoint(accelerator, run_dir, state.step, cfg.keep_checkpoints)
                    log.message(f"{stop.signal}: saved {last_good}; continue with --resume")
                    status = "interrupted"
                    break
                if cfg.save_every and state.step % cfg.save_every == 0 and state.step < cfg.max_steps:
                    last_good = save_checkpoint(accelerator, run_dir, state.step, cfg.keep_checkpoints)
                window["pause"] += time.time() - t_pause
            export_dir = None
            if status == "finished":
                if not list_checkpoints(run_dir) or list_checkpoints(run_dir)[-1][0] != state.step:
                    last_good = save_checkpoint(accelerator, run_dir, state.step, cfg.keep_checkpoints)
                if cfg.eval_every:
                    self._eval(accelerator, model, log, state.step)
                export_dir = self._export(accelerator, model, run_dir)
                log.message(f"done: step {state.step}; model exported to {export_dir}")
            return RunResult(status, state.step, run_dir, last_good, export_dir)
        finally:
            stop.restore()
            log.close()

    def _configure_deepspeed(self, accelerator) -> None:
        """Batch geometry and clipping come from the recipe, not from the DeepSpeed JSON ("auto" there)."""
        cfg = self.cfg
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        ds["train_micro_batch_size_per_gpu"] = cfg.batch_size
        ds["gradient_accumulation_steps"] = cfg.grad_accum
        ds["train_batch_size"] = cfg.batch_size * cfg.grad_accum * accelerator.num_processes
        ds["gradient_clipping"] = float(cfg.optim.grad_clip or 0.0)

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

    def _eval(self, accelerator, model, log: RunLogger, step: int) -> None:
        if accelerator.is_main_process and self.stream_suites():
            from .monitor import evaluate

            scores = evaluate(accelerator.unwrap_model(model), self.tokenizer, list(self.stream_suites()),
                              self.cfg.eval_examples, self.eval_gen_length(), self.eval_block_size())
            scores["mean"] = sum(scores.values()) / max(1, len(scores))
            log.log_eval(step, scores)
        accelerator.wait_for_everyone()

    def stream_suites(self):
        return [k for k, v in self.cfg.data.tasks.items() if float(v) > 0]

    def eval_gen_length(self) -> int:
        m = self.pad_multiple()
        return -(-self.cfg.data.max_new_tokens // m) * m

    def _export(self, accelerator, model, run_dir: Path) -> Path:
        out = Path(self.cfg.export_dir) if self.cfg.export_dir else run_dir / "final"
        accelerator.wait_for_everyone()
        # ZeRO-3 partitions the weights: gather a full state dict (a collective: every rank calls it)
        self.export_state_dict = accelerator.get_state_dict(model) if self.is_deepspeed else None
        if accelerator.is_main_process:
            tmp = out.parent / f".tmp-{out.name}"
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            self.export(accelerator.unwrap_model(model), tmp)
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        accelerator.wait_for_everyone()
        return out
