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
bit-identical. The shared engine (``dllm.training.engine.Trainer``) supplies the optimizer geometry,
clipping, NaN guard, DeepSpeed batch geometry, logging, checkpoint and export helpers; its loop is
SFT-shaped (one loss per streamed batch), so this trainer runs its own RL loop on those helpers.
"""

from __future__ import annotations

import copy
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .checkpointing import latest_checkpoint, list_checkpoints, save_checkpoint
from .config import (
    ConfigError,
    LoraSection,
    OptimSection,
    TrainConfig,
    load_config,
    to_dict,
    validate,
)
from .engine import (
    LRSchedule,
    RunDirInUse,
    RunResult,
    Trainer,
    _StopFlag,
    announce_rank,
    make_accelerator,
    make_run_folders,
    world_size,
)
from .files import read_records, source_labels
from .models import export_model, generation_defaults, init_model, load_tokenizer_for
from .precision import slow_precision_warning
from .rewards import Scorer, check_signature, function_name, load_reward_function
from .rl_objectives import (
    ACC_NORMS,
    ADV_NORMS,
    ESTIMATORS,
    REDUCTIONS,
    TPF_NORMS,
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

# decoders whose every forward sees exactly "prompt + tokens committed so far + masks" (cache="none"),
# or D2F whose block cache is exact: the trajectory estimator replays them exactly
EXACT_REPLAY = {"threshold", "vanilla", "factor", "entropy", "margin", "maskgit_plus", "d2f"}


@dataclass
class RolloutSection:
    group_size: int = 8  # G rollouts per prompt
    prompts_per_step: int = 8  # groups wanted per RL step (per process)
    max_refill_rounds: int = 2  # extra rollout rounds with fresh prompts when the filter leaves the batch short
    strategy: str = "threshold"  # threshold (Fast-dLLM, any model) | d2f (block-causal) | vanilla | factor ...
    temperature: float = 1.0
    threshold: float = 0.9  # the strategy's confidence threshold (threshold: `threshold`; d2f: `skip_threshold`)
    block_length: int | None = None  # None: the model's block size (block-causal) or its generation default
    cache: str = "none"  # semi-AR cache; the trajectory estimator is exact only with "none"
    exact_canvas: bool = True  # decode with stop_at_eos=False: post-EOS tokens kept for exact replay
    batch_size: int = 64  # rows per generate call
    options: dict = field(default_factory=dict)  # any other DiffusionGenerationConfig field


@dataclass
class RewardSection:
    # your reward functions, "module:function" or "path/to/file.py:function" (dllm.training.rewards for the
    # signature): their weighted sum replaces the verifier / exact-match score as the task reward
    functions: list = field(default_factory=list)
    function_weights: list = field(default_factory=list)  # one per function; empty: 1.0 each
    # with reward functions: a rollout whose weighted reward is at least this counts as correct (for
    # filter.require_correct, loss.nll_on=correct and the accuracy metric); the midpoint of a 0/1
    # correctness reward, so a small shaping term beside it (a length penalty) does not undo a right answer
    correct_threshold: float = 0.5
    accuracy: str = "correct"  # correct: the verifier's strict flag (0/1) | score: its graded reward in [0, 1]
    accuracy_norm: str = "pm1"  # pm1: 2a-1 unnormalised (paper) | z_score: in-group (released code) | none
    tpf_norm: str = "z_score"  # z_score (paper/code) | minmax | none
    accuracy_weight: float = 1.0
    tpf_weight: float = 1.0  # 0: plain accuracy GRPO (no speed objective)
    decoupled: bool = True  # False: z-score the weighted sum instead (the "w/o decoupled norm" ablation)
    advantage_norm: str = "batch"  # batch (paper Eq. 7) | group | none
    truncated_is_wrong: bool = True  # no EOS in the canvas -> incorrect (the code forces L >= max-5 wrong)


@dataclass
class FilterSection:
    enabled: bool = True  # False: train on every group (the "w/o TPF filter" ablation)
    require_correct: bool = True  # drop groups without a correct rollout
    tpf_range: float = 0.01  # delta: drop groups whose TPF range max-min < delta (0: no range test)


@dataclass
class LossSection:
    estimator: str = "trajectory"  # trajectory (exact replay) | block_masked (released code) | d1
    block_size: int | None = None  # block_masked blocks; None: the rollout block length
    d1_prompt_mask: float = 0.15  # d1: probability of masking each prompt token
    clip_low: float = 0.2
    clip_high: float = 0.2
    ratio_clamp: float = 10.0  # log-ratio clamp before exp (reference)
    beta: float = 0.01  # k3 KL to the frozen initial model (0: no reference model at all)
    mu: float = 0.1  # NLL on verifier-correct rollouts (0: off)
    nll_on: str = "correct"  # correct (verifier flag, paper) | nonneg_reward (released code: reward >= 0)
    pg_reduction: str = "sequence"
    kl_reduction: str = "token"
    nll_reduction: str = "token"
    ppo_epochs: int = 1  # passes over each RL step's kept rollouts
    minibatches: int = 1  # optimizer steps per pass (1 x 1: on-policy, old log-probs = current)
    ref_offload: bool = False  # keep the reference model on the CPU between uses (large models)


@dataclass
class EvalSection:
    strategies: list = field(default_factory=lambda: ["threshold"])  # greedy held-out eval per strategy
    at_start: bool = True  # also evaluate before the first update (the "before" point of the curve)
    batch_size: int = 64
    # confidence threshold of the greedy eval (None: the rollout's). Rollouts may explore at a lower
    # threshold than the decoder is judged at (recipes/grpo-tiny.yaml: 0.7 rollouts, 0.9 eval).
    threshold: float | None = None


@dataclass
class GRPOConfig(TrainConfig):
    """TPF-aware GRPO. ``max_steps`` = RL steps; ``batch_size`` = canvases (views) per forward/backward
    micro-batch; ``data.tasks`` = prompt suites; ``data.max_new_tokens`` = rollout canvas length."""

    run_dir: str = "runs/grpo"
    max_steps: int = 100
    batch_size: int = 64
    log_every: int = 1
    save_every: int = 25
    eval_every: int = 0
    rollout: RolloutSection = field(default_factory=RolloutSection)
    reward: RewardSection = field(default_factory=RewardSection)
    filter: FilterSection = field(default_factory=FilterSection)
    loss: LossSection = field(default_factory=LossSection)
    lora: LoraSection = field(default_factory=lambda: LoraSection(dropout=0.0))
    evaluation: EvalSection = field(default_factory=EvalSection)
    optim: OptimSection = field(default_factory=lambda: OptimSection(
        lr=1e-6, weight_decay=0.0, betas=[0.9, 0.999], schedule="constant", warmup_steps=10))


def validate_grpo(cfg: GRPOConfig, has_dataset: bool = False, python_functions: int = 0) -> list:
    """ConfigError when the config cannot run; returns the reward functions ``reward.functions`` names
    (imported now, so a wrong path fails before any model loads). ``python_functions``: how many
    reward functions the trainer was given in Python (they replace ``reward.functions``)."""
    functions = [] if python_functions else [load_reward_function(p) for p in cfg.reward.functions]
    n_functions = python_functions or len(functions)
    # without reward functions every prompt needs a reference answer to be scored against
    validate(cfg, has_dataset=has_dataset, require_answers=n_functions == 0)

    def bad(msg):
        raise ConfigError(msg)

    r, w, f, lo = cfg.rollout, cfg.reward, cfg.filter, cfg.loss
    if w.function_weights and len(w.function_weights) != n_functions:
        bad(f"reward.function_weights has {len(w.function_weights)} weights for {n_functions} reward functions; "
            "give one per function (or none: 1.0 each)")
    for x in w.function_weights:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            bad(f"reward.function_weights must be numbers; got {x!r}")
    if not cfg.model.path:
        bad("GRPO starts from a trained model: set model.path (e.g. tiny-d2f or a checkpoint directory)")
    if r.group_size < 2:
        bad("rollout.group_size must be >= 2 (group-relative advantages)")
    if r.prompts_per_step < 1 or r.max_refill_rounds < 0 or r.batch_size < 1:
        bad("need rollout.prompts_per_step >= 1, rollout.max_refill_rounds >= 0, rollout.batch_size >= 1")
    if r.temperature < 0:
        bad("rollout.temperature must be >= 0")
    if cfg.grad_accum != 1:
        bad("grad_accum is not used by GRPO (each optimizer step accumulates over all its micro-batches); "
            "set loss.minibatches / batch_size instead")
    choices = [("reward.accuracy", w.accuracy, ("correct", "score")), ("reward.accuracy_norm", w.accuracy_norm, ACC_NORMS),
               ("reward.tpf_norm", w.tpf_norm, TPF_NORMS), ("reward.advantage_norm", w.advantage_norm, ADV_NORMS),
               ("loss.estimator", lo.estimator, ESTIMATORS), ("loss.nll_on", lo.nll_on, ("correct", "nonneg_reward")),
               ("loss.pg_reduction", lo.pg_reduction, REDUCTIONS), ("loss.kl_reduction", lo.kl_reduction, REDUCTIONS),
               ("loss.nll_reduction", lo.nll_reduction, REDUCTIONS)]
    for key, value, valid in choices:
        if value not in valid:
            bad(f"{key}={value!r}; valid: {', '.join(valid)}")
    if lo.estimator == "trajectory" and r.strategy not in EXACT_REPLAY:
        bad(f"loss.estimator=trajectory replays the decoding steps of {', '.join(sorted(EXACT_REPLAY))}; "
            f"rollout.strategy={r.strategy!r} is not one of them (use block_masked or d1)")
    if lo.ppo_epochs < 1 or lo.minibatches < 1:
        bad("loss.ppo_epochs and loss.minibatches must be >= 1")
    if lo.beta < 0 or lo.mu < 0 or f.tpf_range < 0:
        bad("loss.beta, loss.mu and filter.tpf_range must be >= 0")
    if not 0 <= lo.d1_prompt_mask < 1:
        bad("loss.d1_prompt_mask must be in [0, 1)")
    if cfg.evaluation.threshold is not None and not 0 < cfg.evaluation.threshold <= 1:
        bad(f"evaluation.threshold={cfg.evaluation.threshold} must be in (0, 1] (or null: the rollout's)")
    return functions


def load_grpo_config(path=None, overrides=()) -> GRPOConfig:
    cfg = load_config(GRPOConfig, path, overrides)
    validate_grpo(cfg)
    return cfg


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
        policy = init_model(cfg.model, self.tokenizer)
        self.core = policy
        self.base_generation = policy.diffusion_generation_config
        if cfg.loss.beta > 0 and not cfg.lora.enabled:
            self.ref_model = copy.deepcopy(policy).eval().requires_grad_(False)
        if cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                              target_modules=list(cfg.lora.target_modules), bias="none")
            policy = get_peft_model(policy, lora)
        self.model = policy
        self.rollout_config = self.make_rollout_config()

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
        fields["skip_threshold" if r.strategy == "d2f" else "threshold"] = r.threshold
        fields.update(r.options)
        return self.base_generation.replace(**fields)

    def eval_config(self, strategy: str):
        cfg = self.rollout_config.replace(strategy=strategy, temperature=0.0, stop_at_eos=True)
        phi = self.cfg.evaluation.threshold
        phi = self.cfg.rollout.threshold if phi is None else phi
        return cfg.replace(**{"skip_threshold" if strategy == "d2f" else "threshold": phi})

    def forward_kwargs(self) -> dict:
        """Model-call kwargs that make a training forward see what the decoder's forwards saw."""
        g = self.rollout_config
        # the D2F pipeline runs its cached forwards with block_size = its block length
        return {"block_size": g.block_length} if g.strategy == "d2f" else {}

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
            gen = generation_defaults(self.tokenizer, cfg.data.max_new_tokens, self.attention_block())
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
            return block_masked_views(batch.gen_ids, batch.mask, block, mask_id)
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
                       accelerator=None) -> dict[str, float]:
        """Loss of the rollouts ``rows`` (one optimizer step's minibatch), chunked into micro-batches of
        ``batch_size`` views. The per-token weights are fixed for the whole minibatch, so the sum over
        chunks equals the unchunked loss. ``backward(loss, last)`` is called per chunk when given
        (gradients accumulate); otherwise this only evaluates. Returns summed statistics."""
        lo = self.cfg.loss
        device = batch.gen_ids.device
        n = batch.gen_ids.shape[0]
        sel = torch.zeros(n, dtype=torch.bool, device=device)
        sel[rows] = True
        sub = loss_weights(batch.lengths[rows], batch.nll_flag[rows], beta=lo.beta, mu=lo.mu,
                           pg_reduction=lo.pg_reduction, kl_reduction=lo.kl_reduction, nll_reduction=lo.nll_reduction)
        w_pg, w_kl, w_nll = (torch.zeros(n, dtype=torch.float64, device=device).index_copy(0, rows, x)
                             for x in (sub.pg, sub.kl, sub.nll))
        in_mb = sel[views.row]
        mb_views = views.index(torch.nonzero(in_mb).flatten())
        chunks = chunk_views(mb_views, self.cfg.batch_size)
        stats = {"loss": 0.0, "pg_loss": 0.0, "nll_loss": 0.0, "kl_sum": 0.0, "clipped": 0.0, "tokens": 0.0,
                 "ratio_sum": 0.0, "neg_logp_sum": 0.0}
        cols = torch.arange(batch.gen_ids.shape[1], device=device)
        if not chunks and backward is not None:  # keep every process's collective calls aligned
            backward(self.zero_loss(model, device), True)
        for i, chunk in enumerate(chunks):
            with accelerator.autocast() if accelerator is not None else nullcontext():
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
        for rnd in range(rounds):
            need = r.prompts_per_step - kept
            if need <= 0:
                break
            examples = state.stream.next(need)
            ro = generate_rollouts(policy, self.tokenizer, examples, r.group_size, self.rollout_config,
                                   batch_size=r.batch_size,
                                   seed=_mix_seed(cfg.seed, accelerator.process_index, state.step, rnd),
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
        return batch, info

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

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        from accelerate.utils import DistributedType

        cfg: GRPOConfig = self.cfg
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        run_dir = Path(cfg.run_dir)
        accelerator = make_accelerator(cfg.mixed_precision)
        self.accelerator = accelerator
        self.is_deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
        if world_size(accelerator) > 1:
            announce_rank(accelerator, self.name)
        if self.is_deepspeed:
            self._configure_deepspeed(accelerator)
            stage = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0)
            if int(stage) >= 3:
                raise ConfigError("GRPO generates rollouts in-process from the training weights; ZeRO-3 partitions "
                                  "them. Use ZeRO-1/2 (recipes/accelerate/zero2-8gpu.yaml)")
        main = accelerator.is_main_process
        if main:
            make_run_folders(cfg, run_dir)
        existing = latest_checkpoint(run_dir)
        if existing is not None and not cfg.resume:
            raise RunDirInUse(f"{run_dir} already has checkpoints (latest {existing.name}); pass --resume "
                              "(resume=true) to continue it, or choose another run_dir")
        torch.manual_seed(cfg.seed)
        import random as _random

        _random.seed(cfg.seed)
        self.setup_models()
        model = self.model
        if cfg.model.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable()
        o, lo = cfg.optim, cfg.loss
        updates_per_step = lo.ppo_epochs * lo.minibatches
        optimizer = torch.optim.AdamW(self._param_groups(model), lr=o.lr, betas=tuple(o.betas), eps=o.eps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, LRSchedule(o.schedule, o.warmup_steps, cfg.max_steps * updates_per_step, o.min_lr_ratio))
        model, optimizer = accelerator.prepare(model, optimizer)
        self.model = model
        rank = accelerator.process_index
        sources, source_weights, notes = self.record_sources(rank, accelerator.num_processes)
        stream = PromptStream(cfg.data.tasks, cfg.seed, rank, cfg.data.chunk_size,
                              "per_batch" if cfg.data.mix == "per_batch" else "per_example", sources, source_weights)
        self._check_lengths(stream)
        state = GRPOState(stream, torch.Generator().manual_seed(cfg.seed * 7919 + rank))
        accelerator.register_for_checkpointing(scheduler, state)
        if cfg.resume and existing is not None:
            accelerator.load_state(str(existing))
        last_good = existing if cfg.resume else None
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
            self._write_run_config(run_dir)
        log = RunLogger(run_dir, state.step, cfg.max_steps, main, cfg.progress)
        if cfg.resume and existing is None:
            log.message(f"resume requested but {run_dir} has no checkpoint; starting from step 0")
        elif cfg.resume:
            log.message(f"resumed from {existing} (step {state.step})")
        if (slow := slow_precision_warning(cfg.mixed_precision, accelerator.device)) is not None:
            log.message(slow)
        unwrapped = accelerator.unwrap_model(model)
        n_params = sum(p.numel() for p in unwrapped.parameters())
        n_train = sum(p.numel() for p in unwrapped.parameters() if p.requires_grad)
        r = cfg.rollout
        log.message(f"grpo: {n_params / 1e6:.2f}M parameters ({n_train / 1e6:.2f}M trainable); {cfg.max_steps} RL steps x "
                    f"{r.prompts_per_step} prompts x {r.group_size} rollouts x {accelerator.num_processes} processes; "
                    f"rollouts {self.rollout_config.strategy} T={self.rollout_config.temperature} "
                    f"block={self.rollout_config.block_length}; estimator {lo.estimator}")
        for note in notes:
            log.message(note)
        if self.scorer.functions:
            log.message("rewards: " + " + ".join(f"{w:g} x {n}" for n, w in zip(self.scorer.names, self.scorer.weights))
                        + f" (correct at >= {self.scorer.correct_threshold:g}), TPF x {cfg.reward.tpf_weight:g}")
        if cfg.eval_every and not self.stream_suites():
            log.message("eval_every: data.tasks has no task suite to score held-out prompts on; in-training "
                        "evaluation is off")
        if cfg.eval_every and self.cfg.evaluation.at_start and state.step == 0:
            self._rl_eval(accelerator, log, 0)

        stop = _StopFlag()
        stop.install()
        status = "finished"
        steps_run = idle_steps = 0
        updates_before = state.updates
        try:
            while state.step < cfg.max_steps:
                t0 = time.time()
                batch_ro, info = self.collect(state, accelerator)
                t1 = time.time()
                info.update(self._update(model, optimizer, scheduler, batch_ro, state, accelerator, run_dir))
                t2 = time.time()
                state.step += 1
                steps_run += 1
                log.advance()
                info.update(rollout_s=t1 - t0, update_s=t2 - t1, lr=scheduler.get_last_lr()[0],
                            tokens_per_s=info["rollouts"] * info["gen_tokens"] / max(t1 - t0, 1e-9))
                note = None
                if info["updates"] == 0:  # a loss of 0.0000 would read as a perfect step
                    idle_steps += 1
                    note = f"no update: {self.filtered_reason(info)}"
                if state.step % cfg.log_every == 0 or state.step == cfg.max_steps:
                    log.log(state.step, info, note=note)
                if cfg.eval_every and state.step % cfg.eval_every == 0 and state.step < cfg.max_steps:
                    self._rl_eval(accelerator, log, state.step)
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
                    self._rl_eval(accelerator, log, state.step)
                export_dir = self._export(accelerator, model, run_dir)
                log.message(f"done: step {state.step}; model exported to {export_dir}")
            summary = self.update_summary(steps_run, idle_steps, state.updates - updates_before)
            if summary:
                log.message(summary)
            return RunResult(status, state.step, run_dir, last_good, export_dir, updates=state.updates - updates_before,
                             note=summary)
        finally:
            stop.restore()
            log.close()

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
            if batch is not None:
                perm = torch.randperm(len(ro), generator=state.generator).to(device)
                parts = list(perm.tensor_split(lo.minibatches))
            else:
                parts = [None] * lo.minibatches
            for rows in parts:
                empty = batch is None or rows.numel() == 0
                if self._everyone_empty(empty, accelerator):
                    continue  # no optimizer step on zero gradients (Adam's momentum would still move the weights)
                if empty:
                    backward(self.zero_loss(model, device), True)
                    stats = {}
                else:
                    stats = self.minibatch_loss(model, batch, epochs_views[epoch], rows, old[epoch], ref[epoch],
                                                backward=backward, accelerator=accelerator)
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
        if batch is not None:
            out["adv_abs"] = float(batch.adv.abs().mean())
            out["nll_rollouts"] = float(batch.nll_flag.double().mean())
        return out

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
            for strategy in self.cfg.evaluation.strategies:
                res = evaluate_decoding(policy, self.tokenizer, list(self.stream_suites()), self.cfg.eval_examples,
                                        self.eval_config(strategy), batch_size=self.cfg.evaluation.batch_size)
                scores.update({f"{strategy}/{k}": v for k, v in res.items()})
            log.log_eval(step, scores)
        accelerator.wait_for_everyone()
