"""TPF-aware GRPO for diffusion LMs (LightningRL, spec rl-eval §1-§2).

One RL step, in one process, on the policy being trained (no file hand-offs):

1. **Rollouts**: ``rollout.prompts_per_step`` train prompts x ``rollout.group_size`` samples through
   our decoding engine (threshold decoding at temperature 1.0 by default), step maps recorded.
2. **Rewards**: verifier correctness (or the graded score) and the TPF of each rollout.
3. **Dynamic sampling**: keep a group iff it has a correct rollout and its TPF range is >= delta;
   sample fresh prompts for the missing groups, at most ``rollout.max_refill_rounds`` times.
4. **Advantages**: each reward normalised within its group on its own (decoupled), summed with
   weights, then z-scored over the batch.
5. **Update**: ``loss.ppo_epochs`` x ``loss.minibatches`` optimizer steps of the PPO-clipped
   objective (sequence-level reduction) + β k3 KL to the frozen initial model (token mean) + µ NLL
   of verifier-correct rollouts (token mean), log-probs from the selected estimator
   (``trajectory`` | ``block_masked`` | ``d1``, see ``dllm.training.rl_objectives``).

``max_steps`` counts RL steps. Checkpoints (accelerate state: policy, optimizer, scheduler, RNGs,
prompt stream, mask generator) are written at RL-step boundaries, atomically, and resume is
bit-identical. The loop is the shared engine's (``dllm.training.engine.Trainer.run``: setup, resume,
logging, evaluation, checkpoints, stop signals, export); this trainer supplies what one RL step is
through its hooks (``make_state``, ``train_step``, ``evaluate``, ``finish``). The config and its
validation are in ``dllm.training.grpo_config``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from dllm.decoding.registry import get_strategy

from .config import (
    ConfigError,
    to_dict,
)
from .engine import (
    RunResult,
    Trainer,
)
from .files import read_records, source_labels
from .grpo_config import GRPOConfig, validate_grpo
from .models import export_model, generation_defaults, init_model, load_tokenizer_for, lora_targets
from .rewards import Scorer, check_signature, function_name, load_reward_function
from .rl_objectives import (
    Views,
    advantages,
    block_masked_views,
    chunk_views,
    combined_rewards,
    d1_views,
    grpo_loss,
    loss_mask,
    loss_weights,
    scatter_views,
    tpf_filter,
    trajectory_views,
    view_logprobs,
)
from .rollouts import PromptStream, RecordPrompts, Rollouts, evaluate_decoding, generate_rollouts
from .run_log import RunLogger


class GRPOState:
    """RL step counter, optimizer-step counter, prompt stream and mask generator (checkpointed)."""

    def __init__(self, stream: PromptStream, generator: torch.Generator) -> None:
        self.step = 0
        self.updates = 0
        self.stream = stream
        self.generator = generator

    def state_dict(self) -> dict:
        return {"step": self.step, "updates": self.updates, "stream": self.stream.state_dict(),
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.updates = int(state["updates"])
        self.stream.load_state_dict(state["stream"])
        self.generator.set_state(state["generator"])


@dataclass
class UpdateBatch:
    """The kept rollouts of one RL step as the update sees them (on the training device)."""

    rollouts: Rollouts
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    gen_ids: torch.Tensor
    lengths: torch.Tensor
    adv: torch.Tensor  # [n] float64
    nll_flag: torch.Tensor  # [n] bool: rollouts whose tokens get the NLL term
    mask: torch.Tensor  # [n, G] loss tokens


class RLMeter:
    """Each logged RL step reports its own numbers (they are not averaged over ``log_every``); steps that
    made no optimizer update are counted and say why instead of printing a loss."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer = trainer
        self.steps = self.idle = 0
        self.last: dict = {}
        self.note: str | None = None

    def add(self, info: dict) -> None:
        self.steps += 1
        self.last = info
        self.note = None
        if info["updates"] == 0:  # a loss of 0.0000 would read as a perfect step
            self.idle += 1
            self.note = f"no update: {self.trainer.filtered_reason(info)}"

    def paused(self):
        return nullcontext()  # rollout and update times are measured inside the step

    def flush(self, lr: float) -> tuple[dict, str | None]:
        return {**self.last, "lr": lr}, self.note


def _mix_seed(*parts: int) -> int:
    h = 0
    for p in parts:
        h = (h * 1_000_003 + int(p) + 1) % (2**61 - 1)
    return h


class GRPOTrainer(Trainer):
    """TPF-aware GRPO. Like trl: ``GRPOTrainer(model="tiny-d2f", reward_funcs=[fn, ...],
    args=GRPOConfig(...), train_dataset=rows).train()``; ``reward_funcs`` (callables or
    ``"module:function"`` strings, weighted by ``reward.function_weights``) replace ``reward.functions``,
    and rows need no reference answer then (``dllm.training.rewards``)."""

    config_class = GRPOConfig
    name = "grpo"
    # shard_global_batch: every process draws the global step's prompts, generates the rollout chunks of its
    # share of the groups and weighs its loss by the global minibatch's counts (``sharded``)
    shards_global_batch = True

    def __init__(self, cfg: GRPOConfig | None = None, *, args: GRPOConfig | None = None, model: str | None = None,
                 train_dataset=None, reward_funcs=None) -> None:
        if reward_funcs is not None and not isinstance(reward_funcs, (list, tuple)):
            reward_funcs = [reward_funcs]
        self._given_functions = []
        for i, fn in enumerate(reward_funcs or []):
            if isinstance(fn, str):
                fn = load_reward_function(fn)
            elif not callable(fn):
                raise TypeError(f"reward_funcs[{i}] is a {type(fn).__name__}: give a function or 'module:function'")
            check_signature(fn, function_name(fn))
            self._given_functions.append(fn)
        named = getattr(getattr(cfg if cfg is not None else args, "reward", None), "functions", None)
        self.requires_answers = not (self._given_functions or named)  # a reward function may need no reference
        super().__init__(cfg, args=args, model=model, train_dataset=train_dataset)
        self.ref_model = None
        self.core = None  # the DiffusionLM under any LoRA wrapper

    def validate(self) -> None:
        loaded = validate_grpo(self.cfg, self.train_records is not None, len(self._given_functions))
        w = self.cfg.reward
        self.scorer = Scorer(self._given_functions or loaded, w.function_weights, w.correct_threshold)

    # -- models ------------------------------------------------------------------------------
    def setup_models(self) -> None:
        cfg: GRPOConfig = self.cfg
        self.tokenizer = load_tokenizer_for(cfg.model)
        self.check_memory()
        policy = init_model(cfg.model, self.tokenizer)
        self.core = policy
        self.base_generation = policy.diffusion_generation_config
        if cfg.loss.beta > 0 and not cfg.lora.enabled:
            self.ref_model = copy.deepcopy(policy).eval().requires_grad_(False)
        if cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                              target_modules=lora_targets(policy, cfg.lora.target_modules), bias="none")
            policy = get_peft_model(policy, lora)
        self.model = policy
        self.rollout_config = self.make_rollout_config()

    def memory_plan(self):
        """The policy (its adapters alone train under LoRA) and, with ``loss.beta > 0`` and full weights,
        the frozen reference model (a copy of the starting policy)."""
        cfg: GRPOConfig = self.cfg
        policy = self.model_cost(cfg.model, trainable=not cfg.lora.enabled, label="the policy")
        ref = None
        if cfg.loss.beta > 0 and not cfg.lora.enabled and policy is not None:
            ref = dataclasses.replace(policy, label="the reference model", trainable=False)
        return [policy, ref]

    def make_rollout_config(self):
        """The DiffusionGenerationConfig of the rollouts: the model's defaults + the recipe's rollout section."""
        cfg: GRPOConfig = self.cfg
        r, tok, spec = cfg.rollout, self.tokenizer, self.core.spec
        block = r.block_length
        if block is None:
            block = spec.block_size if self.core.is_block_causal else self.base_generation.block_length
        g = cfg.data.max_new_tokens
        if block and g % block:
            raise ConfigError(f"data.max_new_tokens={g} must be a multiple of the rollout block length {block}")
        fields = {"strategy": r.strategy, "temperature": r.temperature, "max_new_tokens": g, "block_length": block,
                  "cache": r.cache, "stop_at_eos": not r.exact_canvas, "mask_token_id": tok.mask_token_id,
                  "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "return_dict_in_generate": True}
        fields[get_strategy(r.strategy).threshold_option or "threshold"] = r.threshold
        fields.update(r.options)
        return self.base_generation.replace(**fields)

    def eval_config(self, strategy: str):
        cfg = self.rollout_config.replace(strategy=strategy, temperature=0.0, stop_at_eos=True)
        phi = self.cfg.evaluation.threshold
        phi = self.cfg.rollout.threshold if phi is None else phi
        return cfg.replace(**{get_strategy(strategy).threshold_option or "threshold": phi})

    def forward_kwargs(self) -> dict:
        """Model-call kwargs that make a training forward see what the decoder's forwards saw."""
        g = self.rollout_config
        if self.position_grid():  # sdar / fast_dllm_v2: the model's grid from position 0, blocks of the block length
            return {"block_size": g.block_length, "prompt_length": None}
        # block-causal decoders on the prompt grid (D2F) run their cached forwards with block_size = the block length
        strategy = get_strategy(g.strategy)
        return {"block_size": g.block_length} if strategy.requires_block_causal and strategy.grid == "prompt" else {}

    def position_grid(self) -> bool:
        """Whether the rollouts decode the model's own block grid (strategies ``sdar``, ``fast_dllm_v2``)."""
        return get_strategy(self.rollout_config.strategy).grid == "position"

    def attention_block(self) -> int | None:
        """Block size of the block-causal attention of the training forwards (None: bidirectional)."""
        if not self.core.is_block_causal:
            return None
        return self.forward_kwargs().get("block_size") or self.core.spec.block_size

    def export(self, model, out_dir: Path) -> None:
        cfg: GRPOConfig = self.cfg
        info = {"trainer": self.name, "steps": cfg.max_steps, "config": to_dict(cfg)}
        state_dict = self.export_state_dict
        if cfg.lora.enabled:
            model.save_pretrained(str(out_dir / "adapter"))
            merged, state_dict = copy.deepcopy(model).merge_and_unload(), None
        else:
            merged = model
        from dllm.decoding.config import CONFIG_NAME, FILE_KEY

        src = getattr(self.core.config, "_name_or_path", None)
        src_file = Path(src) / CONFIG_NAME if src else None
        if src_file is not None and src_file.exists() and FILE_KEY in json.loads(src_file.read_text()):
            gen = {FILE_KEY: json.loads(src_file.read_text())[FILE_KEY]}  # keep the base model's decoding defaults
        else:
            gen = generation_defaults(self.tokenizer, cfg.data.max_new_tokens, self.attention_block(), start=src)
        export_model(merged, self.tokenizer, out_dir, gen, info, state_dict=state_dict)

    def stream_suites(self):
        return [k for k, v in self.cfg.data.tasks.items() if float(v) > 0]

    # -- log-probabilities -----------------------------------------------------------------------
    def make_views(self, batch: UpdateBatch, generator: torch.Generator) -> Views:
        lo, ro = self.cfg.loss, batch.rollouts
        mask_id = self.tokenizer.mask_token_id
        if lo.estimator == "trajectory":
            return trajectory_views(batch.gen_ids, ro.step_map.to(batch.gen_ids.device), batch.mask, mask_id)
        if lo.estimator == "block_masked":
            block = lo.block_size or self.rollout_config.block_size
            # on the model's own grid the first block holds the prompt's last (length % block) tokens
            offsets = batch.prompt_mask.long().sum(-1) % block if self.position_grid() else None
            return block_masked_views(batch.gen_ids, batch.mask, block, mask_id, offsets=offsets)
        return d1_views(batch.gen_ids, batch.mask, mask_id, batch.prompt_mask, lo.d1_prompt_mask, generator)

    def view_logprobs(self, model, views: Views, batch: UpdateBatch) -> torch.Tensor:
        g = self.rollout_config
        return view_logprobs(model, views, batch.prompt_ids, batch.prompt_mask, batch.gen_ids,
                             mask_id=self.tokenizer.mask_token_id, suppress_mask=g.suppress_mask_token,
                             temperature=g.temperature if g.temperature > 0 else 1.0,
                             block_causal_size=self.attention_block(), forward_kwargs=self.forward_kwargs())

    @torch.no_grad()
    def token_logprobs(self, model, views: Views, batch: UpdateBatch, accelerator=None) -> torch.Tensor:
        """[n, G] log-probs of every loss token under ``model`` (eval mode, no grad)."""
        was = model.training
        model.eval()
        out = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.gen_ids.device)
        try:
            for chunk in chunk_views(views, self.cfg.batch_size):
                with accelerator.autocast() if accelerator is not None else nullcontext():
                    lp = self.view_logprobs(model, chunk, batch)
                out += scatter_views(lp.float(), chunk, out.shape[0])
        finally:
            model.train(was)
        return out

    @torch.no_grad()
    def reference_logprobs(self, views: Views, batch: UpdateBatch, accelerator=None) -> torch.Tensor | None:
        if self.cfg.loss.beta <= 0:
            return None
        if self.cfg.lora.enabled:  # the reference is the base model: the adapter disabled
            peft_model = accelerator.unwrap_model(self.model) if accelerator is not None else self.model
            with peft_model.disable_adapter():
                return self.token_logprobs(peft_model, views, batch, accelerator)
        ref = self.ref_model
        device = batch.gen_ids.device
        moved = next(ref.parameters()).device != device
        if moved:
            ref.to(device)
        try:
            return self.token_logprobs(ref, views, batch, accelerator)
        finally:
            if self.cfg.loss.ref_offload and device.type != "cpu":
                ref.to("cpu")

    # -- the loss of one minibatch ---------------------------------------------------------------
    def minibatch_loss(self, model, batch: UpdateBatch, views: Views, rows: torch.Tensor,
                       old_lp: torch.Tensor | None, ref_lp: torch.Tensor | None, *, backward=None,
                       accelerator=None, totals=None, scale: float = 1.0) -> dict[str, float]:
        """Loss of the rollouts ``rows`` (one optimizer step's minibatch), chunked into micro-batches of
        ``batch_size`` views. The per-token weights are fixed for the whole minibatch, so the sum over
        chunks equals the unchunked loss. ``backward(loss, last)`` is called per chunk when given
        (gradients accumulate); otherwise this only evaluates. Returns summed statistics. ``totals`` and
        ``scale``: these rows are one process's part of a minibatch shared by the processes (``minibatch_totals``):
        the weights are the whole minibatch's (``loss_weights``), times ``scale`` (the number of processes,
        whose gradients DDP averages)."""
        lo = self.cfg.loss
        device = batch.gen_ids.device
        n = batch.gen_ids.shape[0]
        sel = torch.zeros(n, dtype=torch.bool, device=device)
        sel[rows] = True
        sub = loss_weights(batch.lengths[rows], batch.nll_flag[rows], beta=lo.beta, mu=lo.mu,
                           pg_reduction=lo.pg_reduction, kl_reduction=lo.kl_reduction, nll_reduction=lo.nll_reduction,
                           totals=totals)
        w_pg, w_kl, w_nll = (torch.zeros(n, dtype=torch.float64, device=device).index_copy(
                             0, rows, x if scale == 1.0 else x * scale) for x in (sub.pg, sub.kl, sub.nll))
        in_mb = sel[views.row]
        mb_views = views.index(torch.nonzero(in_mb).flatten())
        chunks = chunk_views(mb_views, self.cfg.batch_size)
        stats = {"loss": 0.0, "pg_loss": 0.0, "nll_loss": 0.0, "kl_sum": 0.0, "clipped": 0.0, "tokens": 0.0,
                 "ratio_sum": 0.0, "neg_logp_sum": 0.0}
        cols = torch.arange(batch.gen_ids.shape[1], device=device)
        if backward is not None:  # keep every process's collective calls aligned
            self.pad_backwards(model, device, len(chunks), backward, accelerator)
        for i, chunk in enumerate(chunks):
            # DDP decides at the forward whether the backward all-reduces: only the last chunk's may (processes
            # holding different numbers of chunks still meet in one all-reduce)
            local = (backward is not None and accelerator is not None and accelerator.num_processes > 1
                     and not self.is_deepspeed and i < len(chunks) - 1)
            with accelerator.no_sync(model) if local else nullcontext(), \
                    accelerator.autocast() if accelerator is not None else nullcontext():
                lp = self.view_logprobs(model, chunk, batch)
            t = chunk.target
            r_t = chunk.row[:, None].expand_as(t)[t]
            c_t = cols[None, :].expand_as(t)[t]
            dtype = lp.dtype
            loss, sums = grpo_loss(
                lp[t], None if old_lp is None else old_lp[r_t, c_t].to(dtype),
                None if ref_lp is None else ref_lp[r_t, c_t].to(dtype), batch.adv[r_t].to(dtype),
                w_pg[r_t].to(dtype), w_kl[r_t].to(dtype), w_nll[r_t].to(dtype),
                clip_low=lo.clip_low, clip_high=lo.clip_high, ratio_clamp=lo.ratio_clamp)
            if backward is not None:
                backward(loss, i == len(chunks) - 1)
            stats["loss"] += float(loss.detach())
            for k, v in sums.items():
                stats[k] += float(v)
        return stats

    def pad_backwards(self, model, device, n_local: int, backward, accelerator) -> None:
        """Zero-loss backward passes before a process's ``n_local`` real ones, so that every process runs the
        same number per minibatch: DDP all-reduces in one backward only (the last), so one pass pads a process
        with nothing to train on; DeepSpeed's ZeRO-2 reduces gradients inside every backward, so each process
        runs as many passes as the busiest one (a 2-process run with different counts waited on the missing
        reduction until killed)."""
        total = max(1, n_local)
        if self.is_deepspeed and accelerator is not None and accelerator.num_processes > 1:
            total = int(accelerator.gather(torch.tensor([total], device=accelerator.device)).max())
        for j in range(total - n_local):
            backward(self.zero_loss(model, device), n_local == 0 and j == total - 1)

    def zero_loss(self, model, device) -> torch.Tensor:
        """A zero loss from a real (two-slot) forward: a process with nothing to train on still takes part
        in DDP's gradient all-reduce (which hooks the forward) and contributes zero gradients."""
        x = torch.full((1, 2), self.tokenizer.mask_token_id, dtype=torch.long, device=device)
        logits = model(x, attention_mask=torch.ones_like(x), prompt_length=1, **self.forward_kwargs()).logits
        return logits.float().sum() * 0.0

    # -- rollouts ------------------------------------------------------------------------------
    def collect(self, state: GRPOState, accelerator) -> tuple[Rollouts | None, dict]:
        """Rollouts until ``prompts_per_step`` groups pass the filter or the refill bound is hit."""
        cfg: GRPOConfig = self.cfg
        r = cfg.rollout
        policy = accelerator.unwrap_model(self.model)
        kept_parts, sampled, kept, all_parts = [], 0, 0, []
        rounds = 1 + (r.max_refill_rounds if cfg.filter.enabled else 0)
        sharded = self.sharded(accelerator)
        for rnd in range(rounds):
            need = r.prompts_per_step - kept
            if need <= 0:
                break
            if sharded:  # the global step's prompts (as one process drawing them all), this process's share
                rank = accelerator.process_index
                examples = state.stream.next(need * accelerator.num_processes)[rank * need : (rank + 1) * need]
                seed, first_chunk = _mix_seed(cfg.seed, 0, state.step, rnd), rank * need * r.group_size // r.batch_size
            else:
                examples = state.stream.next(need)
                seed, first_chunk = _mix_seed(cfg.seed, accelerator.process_index, state.step, rnd), 0
            ro = generate_rollouts(policy, self.tokenizer, examples, r.group_size, self.rollout_config,
                                   batch_size=r.batch_size, seed=seed, first_chunk=first_chunk,
                                   truncated_is_wrong=cfg.reward.truncated_is_wrong, scorer=self.scorer)
            all_parts.append(ro)
            sampled += need
            if cfg.filter.enabled:
                keep = tpf_filter(ro.grouped(ro.correct), ro.grouped(ro.tpf), cfg.filter.tpf_range,
                                  require_correct=cfg.filter.require_correct)
            else:
                keep = torch.ones(ro.num_groups, dtype=torch.bool)
            if bool(keep.any()):
                kept_parts.append(ro.select_groups(keep))
            kept += int(keep.sum())
        pad = self.tokenizer.pad_token_id
        every = Rollouts.cat(all_parts, pad)
        info = {"rollouts": len(every), "groups_sampled": sampled, "groups_kept": kept,
                "kept_ratio": kept / max(1, sampled), "refill_rounds": len(all_parts) - 1,
                "accuracy": float(every.correct.double().mean()), "reward": float(every.score.mean()),
                "tpf": float(every.tpf.mean()), "gen_tokens": float(every.lengths.double().mean()),
                "forwards": float(every.forwards.double().mean()),
                "truncated": float((~(every.gen_ids == self.tokenizer.eos_token_id).any(-1)).double().mean()),
                **self.scorer.means()}
        batch = Rollouts.cat(kept_parts, pad) if kept_parts else None
        if batch is not None:
            info.update(accuracy_kept=float(batch.correct.double().mean()), tpf_kept=float(batch.tpf.mean()))
        if sharded:
            info = self._global_rollout_info(info, every, batch, accelerator)
        return batch, info

    def sharded(self, accelerator) -> bool:
        """Whether the processes share one global batch per step (``shard_global_batch`` on several processes)."""
        return bool(self.cfg.shard_global_batch) and accelerator.num_processes > 1

    def _global_rollout_info(self, info: dict, every: Rollouts, batch: Rollouts | None, accelerator) -> dict:
        """The rollout metrics of the global batch: sums over the processes (every process sampled the same
        number of groups, so the means over all rollouts are means of the processes' means)."""
        eos = self.tokenizer.eos_token_id
        kept = [0.0, 0.0, 0.0] if batch is None else [len(batch), float(batch.correct.sum()), float(batch.tpf.sum())]
        sums = torch.tensor([len(every), info["groups_sampled"], info["groups_kept"], float(every.correct.sum()),
                             float(every.score.sum()), float(every.tpf.sum()), float(every.lengths.sum()),
                             float(every.forwards.sum()), float((~(every.gen_ids == eos).any(-1)).sum()), *kept],
                            dtype=torch.float64)
        (n, sampled, n_kept, correct, score, tpf, lengths, forwards, truncated, kept_rows, kept_correct,
         kept_tpf) = accelerator.reduce(sums.to(accelerator.device), reduction="sum").tolist()
        means = {k: v for k, v in info.items() if k.startswith("reward_")}
        if means:
            names = sorted(means)
            means = dict(zip(names, accelerator.reduce(torch.tensor([means[k] for k in names], dtype=torch.float64)
                                                       .to(accelerator.device), reduction="mean").tolist()))
        out = {**info, "rollouts": int(n), "groups_sampled": int(sampled), "groups_kept": int(n_kept),
               "kept_ratio": n_kept / max(1, sampled), "accuracy": correct / n, "reward": score / n, "tpf": tpf / n,
               "gen_tokens": lengths / n, "forwards": forwards / n, "truncated": truncated / n, **means}
        out.pop("accuracy_kept", None)
        out.pop("tpf_kept", None)
        if kept_rows:
            out.update(accuracy_kept=kept_correct / kept_rows, tpf_kept=kept_tpf / kept_rows)
        return out

    def reward_terms(self, ro: Rollouts) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(accuracy [groups, G], TPF [groups, G], advantage kwargs) of the rollouts."""
        w = self.cfg.reward
        # with reward functions the task reward is their weighted sum (ro.score); correct only thresholds it
        graded = w.accuracy == "score" or bool(self.scorer.functions)
        acc = ro.grouped(ro.score if graded else ro.correct.double())
        kwargs = {"acc_norm": w.accuracy_norm, "tpf_norm": w.tpf_norm, "acc_weight": w.accuracy_weight,
                  "tpf_weight": w.tpf_weight, "decoupled": w.decoupled}
        return acc, ro.grouped(ro.tpf), kwargs

    def batch_stats(self, ro: Rollouts | None, accelerator) -> tuple[float, float, int] | None:
        """(Σ, Σ², n) of the combined rewards over every process (a collective: call it on all ranks)."""
        if self.cfg.reward.advantage_norm != "batch" or accelerator is None or accelerator.num_processes == 1:
            return None
        local = torch.zeros(3, dtype=torch.float64)
        if ro is not None and len(ro):
            acc, tpf, kwargs = self.reward_terms(ro)
            a = combined_rewards(acc, tpf, **kwargs)
            local = torch.tensor([float(a.sum()), float((a ** 2).sum()), float(a.numel())], dtype=torch.float64)
        s, ss, n = accelerator.reduce(local.to(accelerator.device), reduction="sum").tolist()
        return s, ss, int(n)

    def compute_advantages(self, ro: Rollouts, stats=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages [n], combined reward before batch normalisation [n]); ``stats`` from ``batch_stats``."""
        acc, tpf, kwargs = self.reward_terms(ro)
        combined = combined_rewards(acc, tpf, **kwargs)
        adv = advantages(acc, tpf, adv_norm=self.cfg.reward.advantage_norm, batch_stats=stats, **kwargs)
        return adv.flatten(), combined.flatten()

    def make_batch(self, ro: Rollouts, device, stats=None) -> UpdateBatch:
        adv, combined = self.compute_advantages(ro, stats)
        nll_flag = ro.correct if self.cfg.loss.nll_on == "correct" else combined >= 0
        g = ro.gen_ids.shape[1]
        return UpdateBatch(ro, ro.prompt_ids.to(device), ro.prompt_mask.to(device), ro.gen_ids.to(device),
                           ro.lengths.to(device), adv.to(device), nll_flag.to(device), loss_mask(ro.lengths, g).to(device))

    # -- what one RL step is (the loop itself is Trainer.run) -----------------------------------------
    def check_accelerator(self, accelerator) -> None:
        if self.is_deepspeed:
            stage = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0)
            if int(stage) >= 3:
                raise ConfigError("GRPO generates rollouts in-process from the training weights; ZeRO-3 partitions "
                                  "them. Use ZeRO-1/2 (recipes/accelerate/zero2-8gpu.yaml)")

    def scheduler_steps(self) -> int:
        lo = self.cfg.loss
        return self.cfg.max_steps * lo.ppo_epochs * lo.minibatches  # optimizer steps, not RL steps

    def make_state(self, accelerator, model) -> GRPOState:
        self.model = model  # the prepared (wrapped) policy: rollouts and updates both go through it
        cfg: GRPOConfig = self.cfg
        rank, world = accelerator.process_index, accelerator.num_processes
        if self.sharded(accelerator):  # every process reads the one prompt stream and draws the same generator
            rank, world = 0, 1
        sources, source_weights, notes = self.record_sources(rank, world)
        stream = PromptStream(cfg.data.tasks, cfg.seed, rank, cfg.data.chunk_size,
                              "per_batch" if cfg.data.mix == "per_batch" else "per_example", sources, source_weights)
        self._check_lengths(stream)
        self.state_notes = notes
        return GRPOState(stream, torch.Generator().manual_seed(cfg.seed * 7919 + rank))

    def describe(self, accelerator, model) -> list[str]:
        cfg: GRPOConfig = self.cfg
        unwrapped = accelerator.unwrap_model(model)
        n_params = sum(p.numel() for p in unwrapped.parameters())
        n_train = sum(p.numel() for p in unwrapped.parameters() if p.requires_grad)
        r, lo, ro = cfg.rollout, cfg.loss, self.rollout_config
        lines = [f"grpo: {n_params / 1e6:.2f}M parameters ({n_train / 1e6:.2f}M trainable); {cfg.max_steps} RL steps x "
                 f"{r.prompts_per_step} prompts x {r.group_size} rollouts x {accelerator.num_processes} processes; "
                 f"rollouts {ro.strategy} T={ro.temperature} block={ro.block_length}; estimator {lo.estimator}",
                 *self.state_notes]
        if self.scorer.functions:
            lines.append("rewards: " + " + ".join(f"{w:g} x {n}" for n, w in zip(self.scorer.names, self.scorer.weights))
                         + f" (correct at >= {self.scorer.correct_threshold:g}), TPF x {cfg.reward.tpf_weight:g}")
        return lines

    def before_loop(self, accelerator, model, log: RunLogger, state: GRPOState) -> None:
        self._updates_at_start = state.updates
        if self.cfg.eval_every and self.cfg.evaluation.at_start and state.step == 0:
            self._rl_eval(accelerator, log, 0)

    def make_meter(self) -> RLMeter:
        return RLMeter(self)

    def train_step(self, model, optimizer, scheduler, state: GRPOState, accelerator, run_dir: Path) -> dict:
        t0 = time.time()
        batch_ro, info = self.collect(state, accelerator)
        t1 = time.time()
        info.update(self._update(model, optimizer, scheduler, batch_ro, state, accelerator, run_dir))
        info.update(rollout_s=t1 - t0, update_s=time.time() - t1,
                    tokens_per_s=info["rollouts"] * info["gen_tokens"] / max(t1 - t0, 1e-9))
        return info

    def evaluate(self, accelerator, model, log: RunLogger, step: int) -> None:
        self._rl_eval(accelerator, log, step)

    def finish(self, result: RunResult, state: GRPOState, meter: RLMeter, log: RunLogger) -> None:
        result.updates = state.updates - self._updates_at_start
        result.note = self.update_summary(meter.steps, meter.idle, result.updates)
        if result.note:
            log.message(result.note)

    def filtered_reason(self, info: dict) -> str:
        """Why a step had nothing to train on, in the filter's terms."""
        f = self.cfg.filter
        rules = []
        if f.enabled and f.require_correct:
            rules.append("a correct rollout")
        if f.enabled and f.tpf_range > 0:
            rules.append(f"a TPF range >= {f.tpf_range:g}")
        kept = f"{info.get('groups_kept', 0)} of {info.get('groups_sampled', 0)} groups kept"
        return (f"every group was filtered ({kept}; a group needs {' and '.join(rules)})" if rules
                else f"no rollout to train on ({kept})")

    def update_summary(self, steps: int, idle: int, updates: int) -> str | None:
        """The end-of-run line about updates: None when every RL step updated the policy."""
        if steps == 0 or idle == 0:
            return None
        if updates == 0:
            f = self.cfg.filter
            hints = []
            if f.enabled and f.require_correct:
                hints.append("filter.require_correct=false")
            if f.enabled and f.tpf_range > 0:
                hints.append("a smaller filter.tpf_range or a lower rollout.threshold (rollouts that differ in speed)")
            hints.append("prompts the model partly solves (docs/rl.md, \"Metrics\")")
            return (f"no update: every group was filtered in all {steps} RL steps, so the exported model is the one "
                    f"the run started from. Try {'; '.join(hints)}")
        return f"{idle} of {steps} RL steps made no update (every group filtered); {updates} optimizer steps in all"

    def record_sources(self, rank: int, world: int) -> tuple[dict, dict, list[str]]:
        """The prompt sources beside the suites: data files and the train_dataset (label -> RecordPrompts)."""
        from .datasets import DATASET_LABEL

        cfg: GRPOConfig = self.cfg
        g = cfg.data.max_new_tokens
        conf = getattr(self.core, "config", None)
        context = getattr(conf, "max_sequence_length", None) or getattr(conf, "max_position_embeddings", None)
        common = {"tokenizer": self.tokenizer, "max_new_tokens": g, "seed": cfg.seed, "rank": rank, "world_size": world,
                  "max_prompt_tokens": None if context is None else context - g,
                  "answers_must_fit": not self.scorer.functions}
        sources, weights, notes = {}, {}, []
        file_weights = {p: float(w) for p, w in cfg.data.files.items() if float(w) > 0}
        for path, label in source_labels(file_weights).items():
            records = read_records(path, require_answer=not self.scorer.functions)
            sources[label] = RecordPrompts(records, label, where=f"data file {path}", **common)
            weights[label] = file_weights[path]
            notes.append(f"data file {path} ({label}): {sources[label].summary()}")
        if self.train_records is not None and float(cfg.data.dataset_weight) > 0:
            label = DATASET_LABEL
            while label in sources or label in cfg.data.tasks:
                label += "_"
            sources[label] = RecordPrompts(self.train_records, label, where=DATASET_LABEL, **common)
            weights[label] = float(cfg.data.dataset_weight)
            notes.append(f"{DATASET_LABEL}: {sources[label].summary()}")
        return sources, weights, notes

    def _check_lengths(self, stream: PromptStream) -> None:
        g = self.cfg.data.max_new_tokens
        for name, suite in stream.suites.items():
            if suite.max_answer_tokens + 1 > g:
                raise ConfigError(f"suite {name!r} answers take up to {suite.max_answer_tokens + 1} tokens with EOS; "
                                  f"raise data.max_new_tokens (now {g}) or drop the suite from data.tasks")

    def _update(self, model, optimizer, scheduler, ro: Rollouts | None, state: GRPOState, accelerator,
                run_dir: Path) -> dict:
        """The update phase of one RL step: ppo_epochs x minibatches optimizer steps."""
        cfg: GRPOConfig = self.cfg
        lo = cfg.loss
        n_local = 0 if ro is None else len(ro)
        total = torch.tensor([float(n_local)], device=accelerator.device)
        if accelerator.num_processes > 1:
            total = accelerator.reduce(total, reduction="sum")
        if float(total.sum()) == 0:
            return {"updates": 0}  # no loss: nothing was trained on (the log says why)
        device = accelerator.device
        unwrapped = accelerator.unwrap_model(model)
        adv_stats = self.batch_stats(ro, accelerator)
        batch = self.make_batch(ro, device, adv_stats) if ro is not None else None
        epochs_views: list[Views | None] = []
        old, ref = [], []
        multi = lo.ppo_epochs * lo.minibatches > 1
        for epoch in range(lo.ppo_epochs):
            if batch is None:
                epochs_views.append(None)
                old.append(None)
                ref.append(None)
                continue
            if epoch == 0 or lo.estimator == "d1":  # d1 draws a fresh prompt mask per pass
                views = self.make_views(batch, state.generator)
                ref_lp = self.reference_logprobs(views, batch, accelerator)
                old_lp = self.token_logprobs(unwrapped, views, batch, accelerator) if multi else None
            epochs_views.append(views)
            old.append(old_lp)
            ref.append(ref_lp)

        stats_tot: dict[str, float] = {}
        n_updates, losses, norms = 0, [], []
        model.train()
        sharded = self.sharded(accelerator)
        if sharded:  # this process's rows are rows offset .. offset + n_local - 1 of the global batch
            counts = accelerator.gather(torch.tensor([n_local], device=device)).tolist()
            offset, n_global = sum(counts[:accelerator.process_index]), sum(counts)

        bad_loss = [False]

        def backward(loss, last):
            # ranks run different numbers of micro-batches: losses are checked locally, and the one collective
            # check runs before each rank's single synchronising backward (DeepSpeed steps inside it)
            bad_loss[0] |= not bool(torch.isfinite(loss.detach()).all())
            if last:
                self._guard(torch.tensor(float("nan") if bad_loss[0] else 0.0), "loss", state.step, accelerator,
                            run_dir)
            if self.is_deepspeed:
                # the number of micro-batches per optimizer step varies with the number of canvases: mark
                # the accumulation boundary ourselves (the engine steps there; gradient_accumulation_steps=1)
                accelerator.deepspeed_engine_wrapped.backward(loss, sync_gradients=last)
                return
            with nullcontext() if last or accelerator.num_processes == 1 else accelerator.no_sync(model):
                accelerator.backward(loss)

        for epoch in range(lo.ppo_epochs):
            if sharded:  # the global batch's minibatches (one permutation, drawn alike everywhere), this process's rows
                perm = torch.randperm(n_global, generator=state.generator).to(device)
                parts = [p[(p >= offset) & (p < offset + n_local)] - offset for p in perm.tensor_split(lo.minibatches)]
                parts = [p if batch is not None else None for p in parts]
            elif batch is not None:
                perm = torch.randperm(len(ro), generator=state.generator).to(device)
                parts = list(perm.tensor_split(lo.minibatches))
            else:
                parts = [None] * lo.minibatches
            for rows in parts:
                empty = batch is None or rows.numel() == 0
                if self._everyone_empty(empty, accelerator):
                    continue  # no optimizer step on zero gradients (Adam's momentum would still move the weights)
                totals = self.minibatch_totals(batch, None if empty else rows, accelerator) if sharded else None
                if empty:
                    self.pad_backwards(model, device, 0, backward, accelerator)
                    stats = {}
                else:
                    stats = self.minibatch_loss(model, batch, epochs_views[epoch], rows, old[epoch], ref[epoch],
                                                backward=backward, accelerator=accelerator, totals=totals,
                                                scale=accelerator.num_processes if sharded else 1.0)
                if sharded:
                    stats = self.global_stats(stats, accelerator)
                grad_norm = self._clip(model, accelerator)
                self._guard(grad_norm, "gradient norm", state.step, accelerator, run_dir)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                state.updates += 1
                n_updates += 1
                norms.append(float(grad_norm))
                if stats:
                    losses.append(stats["loss"])
                    for k, v in stats.items():
                        stats_tot[k] = stats_tot.get(k, 0.0) + v
        if n_updates == 0:
            return {"updates": 0}
        tokens = max(stats_tot.get("tokens", 0.0), 1.0)
        out = {"updates": n_updates, "loss": sum(losses) / max(1, len(losses)),
               "pg_loss": stats_tot.get("pg_loss", 0.0) / max(1, len(losses)),
               "nll_loss": stats_tot.get("nll_loss", 0.0) / max(1, len(losses)),
               "kl": stats_tot.get("kl_sum", 0.0) / tokens, "clip_frac": stats_tot.get("clipped", 0.0) / tokens,
               "nll": stats_tot.get("neg_logp_sum", 0.0) / tokens, "ratio": stats_tot.get("ratio_sum", 0.0) / tokens,
               "grad_norm": sum(norms) / max(1, len(norms))}
        if sharded:
            local = [0.0, 0.0, 0.0] if batch is None else [float(batch.adv.abs().sum()),
                                                          float(batch.nll_flag.double().sum()), float(len(ro))]
            adv, nll, n = accelerator.reduce(torch.tensor(local, dtype=torch.float64, device=device),
                                             reduction="sum").tolist()
            out.update(adv_abs=adv / n, nll_rollouts=nll / n)
        elif batch is not None:
            out["adv_abs"] = float(batch.adv.abs().mean())
            out["nll_rollouts"] = float(batch.nll_flag.double().mean())
        return out

    @staticmethod
    def minibatch_totals(batch: UpdateBatch | None, rows: torch.Tensor | None, accelerator) -> tuple:
        """((rows, tokens) of all, (rows, tokens) of the NLL rollouts) of a minibatch shared by the processes,
        summed over them (a collective); ``rows``: this process's part (None: none)."""
        local = torch.zeros(4, dtype=torch.float64)
        if rows is not None:
            lengths, flag = batch.lengths[rows].double().cpu(), batch.nll_flag[rows].bool().cpu()
            local = torch.tensor([float(len(lengths)), float(lengths.sum()), float(flag.sum()),
                                  float(lengths[flag].sum())], dtype=torch.float64)
        n, tokens, n_nll, nll_tokens = accelerator.reduce(local.to(accelerator.device), reduction="sum").tolist()
        return (n, tokens), (n_nll, nll_tokens)

    @staticmethod
    def global_stats(stats: dict, accelerator) -> dict:
        """A shared minibatch's statistics over the processes: each one's loss terms carry the factor of the
        processes (their mean is the minibatch's), the counts and sums add up."""
        means, sums = ("loss", "pg_loss", "nll_loss"), ("kl_sum", "clipped", "tokens", "ratio_sum", "neg_logp_sum")
        local = torch.tensor([float(stats.get(k, 0.0)) for k in (*means, *sums)], dtype=torch.float64)
        total = accelerator.reduce(local.to(accelerator.device), reduction="sum").tolist()
        world = accelerator.num_processes
        return {k: v / world if k in means else v for k, v in zip((*means, *sums), total)}

    @staticmethod
    def _everyone_empty(empty: bool, accelerator) -> bool:
        if accelerator.num_processes == 1:
            return empty
        flag = torch.tensor([0.0 if empty else 1.0], device=accelerator.device)
        return float(accelerator.reduce(flag, reduction="sum").sum()) == 0

    def _rl_eval(self, accelerator, log: RunLogger, step: int) -> None:
        if accelerator.is_main_process and self.stream_suites():
            policy = accelerator.unwrap_model(self.model)
            scores = {}
            suites = list(self.stream_suites())
            complete = True
            for strategy in self.cfg.evaluation.strategies:
                res = evaluate_decoding(policy, self.tokenizer, suites, self.cfg.eval_examples,
                                        self.eval_config(strategy), batch_size=self.cfg.evaluation.batch_size,
                                        should_stop=self.stop_requested)
                complete &= "acc" in res  # the totals come only with every suite scored
                scores.update({f"{strategy}/{k}": v for k, v in res.items()})
            self.log_eval_scores(log, step, scores, suites, complete)
        accelerator.wait_for_everyone()
